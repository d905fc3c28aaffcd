"""Hybrid MoEs whose memory moeconf refused when they were added: GLM-5.3-Flash (`glm5-next`,
modelled since: tests/test_memory_glm5next.py) and Kimi-Linear
(`kimi-linear`, modelled since: tests/test_memory_kda.py); their tensors, layer map and recorded state
are still checked here, as sparse full-size layouts of the real models
(moeconf/fixtures/layouts_hybrid.py) that the pinned llama.cpp loads (their placement is compared
with its log in tests/engine/test_hybrid_placement.py).

Every tensor is one a pinned engine knows, in a group other than `other`, with the layer map
(recurrent mixers, the MTP block) the engine's loader uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.layouts_hybrid import Glm5NextLayout, KimiLinearLayout, NemotronLayout
from moeconf.fixtures.writer import write_layout
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

HYBRIDS = ["glm-5.3-flash", "kimi-linear-48b-a3b"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    folder = tmp_path_factory.mktemp("refused")
    out = {}
    for key in HYBRIDS:
        path = folder / f"{key}.gguf"
        write_layout(LAYOUTS[key], path)
        out[key] = (path, load_inventory(path))
    return out


@pytest.mark.parametrize("key", HYBRIDS)
def test_every_tensor_is_known_and_grouped(files: dict[str, tuple[Path, Inventory]], key: str) -> None:
    _, inv = files[key]
    unknown = [t.name for t in inv.tensors if not t.known or t.group == "other"]
    assert not unknown, unknown[:8]


def _recurrent_map(key: str) -> set[int]:
    lay = LAYOUTS[key]
    if isinstance(lay, NemotronLayout):
        return {il for il in range(lay.blocks) if lay.kind(il) == "recurrent"}
    assert isinstance(lay, KimiLinearLayout)  # Glm5NextLayout is one
    return {il for il in range(lay.blocks) if lay.is_recurrent(il)}


@pytest.mark.parametrize("key", HYBRIDS)
def test_layer_map_is_the_loaders(files: dict[str, tuple[Path, Inventory]], key: str) -> None:
    """Recurrent mixers where the loader marks them (Nemotron: head_count_kv and
    feed_forward_length both 0; Kimi-Linear, GLM-5.3-Flash: head_count_kv 0), and GLM-5.3-Flash's
    last block an MTP block whose tensors the engine does not load."""
    _, inv = files[key]
    assert set(inv.layers_of_kind("recurrent")) == _recurrent_map(key)
    lay = LAYOUTS[key]
    if isinstance(lay, Glm5NextLayout):
        assert inv.layers_of_kind("nextn") == [lay.blocks - 1]
        # the MTP block's tensors are created with TENSOR_SKIP (src/models/glm5-next.cpp)
        assert all(t.group == "nextn" for t in inv.tensors if t.layer == lay.blocks - 1)


def test_the_layouts_follow_their_configs() -> None:
    """The layer maps are the published configs': a wrong pattern or full-attention list fails."""
    nano = LAYOUTS["nemotron-3-nano-30b-a3b"]
    assert isinstance(nano, NemotronLayout)
    assert [nano.pattern.count(c) for c in "ME*"] == [23, 23, 6] and len(nano.pattern) == nano.blocks == 52
    kimi = LAYOUTS["kimi-linear-48b-a3b"]
    assert isinstance(kimi, KimiLinearLayout)
    assert len(_recurrent_map("kimi-linear-48b-a3b")) == 20 and kimi.blocks == 27
    glm = LAYOUTS["glm-5.3-flash"]
    assert isinstance(glm, Glm5NextLayout)
    assert len(_recurrent_map("glm-5.3-flash")) == 34 and glm.blocks == 46 and glm.nextn == 1


def test_explain_renders_every_tensor_group() -> None:
    """Every group the taxonomy can give a tensor has a column heading in explain's map (GLM-5.3-Flash's
    mHC tensors, group `hc`, crashed the renderer)."""
    from moeconf.model.taxonomy import GROUPS
    from moeconf.report.explain import _SHORT

    assert set(GROUPS) <= set(_SHORT)
    assert all(re.fullmatch(r"[a-z]{3}", s) for s in _SHORT.values())


FIGURES = json.loads((Path(__file__).resolve().parent / "data" / "hybrid_refused_figures.json").read_text())
MiB = 1024 * 1024


def _cells(args: str) -> int:
    return int(args.split("-c ")[1].split()[0])


def _kv_row_bytes(n: int, cache_type: str) -> float:
    return n * 2 if cache_type == "f16" else n * 34 / 32  # q8_0: 34 bytes a block of 32


@pytest.mark.parametrize("row", [r for r in FIGURES["rows"] if "refused" not in r],
                         ids=lambda r: f"{r['model']}:{r['args']}")
def test_recorded_engine_figures_follow_the_layout(row: dict[str, object]) -> None:
    """The engine's KV and recurrent state for these layouts, recorded for the step that models
    them, are what the layouts' dimensions give by the engine's rules (src/llama-hparams.cpp
    n_embd_r / n_embd_s for Mamba-2; KDA: three conv states of (d_conv - 1) x heads x head_dim
    and heads x head_dim^2 per layer; all F32, one set per sequence, independent of -c): a figure
    or a layout edited out of step fails here. The indexer cache of GLM-5.3-Flash measures 3 rows
    of `indexer.key_length` per cell and DSA layer (not derived)."""
    key, args = str(row["model"]), str(row["args"])
    lay = LAYOUTS[key]
    seqs = int(str(row["seqs"]))
    ctype = "q8_0" if "q8_0" in args else "f16"
    n_rec = len(_recurrent_map(key))
    n_attn = lay.blocks - lay.nextn - n_rec
    if isinstance(lay, NemotronLayout):
        d_inner = lay.mamba_heads * lay.mamba_head_dim
        r = (lay.conv_kernel - 1) * (d_inner + 2 * lay.ssm_groups * lay.ssm_state)
        s = lay.ssm_state * d_inner
        kv_row = 2 * _kv_row_bytes(lay.heads_kv * lay.head_dim, ctype)  # K and V
        n_attn = lay.pattern.count("*")  # the MoE layers have neither KV nor state
    else:
        assert isinstance(lay, KimiLinearLayout) and lay.mla is not None
        kda = lay.kda_heads * lay.kda_head_dim
        r = 3 * (lay.conv_kernel - 1) * kda
        s = lay.kda_heads * lay.kda_head_dim ** 2
        latent = lay.mla.kv_lora_rank + lay.mla.qk_rope_head_dim
        kv_row = _kv_row_bytes(latent, ctype)  # the MLA latent, K only
    assert float(str(row["state_r"])) == pytest.approx(n_rec * r * 4 * seqs / MiB, abs=0.01)
    assert float(str(row["state_s"])) == pytest.approx(n_rec * s * 4 * seqs / MiB, abs=0.01)
    assert float(str(row["kv"])) == pytest.approx(n_attn * _cells(args) * kv_row / MiB, abs=0.01)
    if isinstance(lay, Glm5NextLayout):
        idx_row = 3 * _kv_row_bytes(lay.indexer_head_dim, ctype)
        assert float(str(row["indexer"])) == pytest.approx(n_attn * _cells(args) * idx_row / MiB, abs=0.01)


@pytest.mark.parametrize(("flags", "reason"), [
    # llama_init_from_model: "model does not support different K (q8_0) and V (f16) cache types"
    (["-ctk", "q8_0"], "different K and V cache types"),
    # value_length 72 is not a multiple of q8_0's block of 32
    (["-ctk", "q8_0", "-ctv", "q8_0"], "does not divide the head width 72"),
])
def test_kimi_linear_cache_types_the_engine_refuses(files: dict[str, tuple[Path, Inventory]], flags: list[str],
                                                    reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Both lines fail in llama-fit-params on this layout (tests/data/hybrid_refused_figures.json,
    `refused`); explain must say so, not print memory for them."""
    path, _ = files["kimi-linear-48b-a3b"]
    rows = {r["args"]: r for r in FIGURES["rows"] if r["model"] == "kimi-linear-48b-a3b"}
    assert "refused" in rows[" ".join(["-c", "32768", *flags])]
    assert main(["explain", str(path), "--json", "--", "-c", "32768", *flags]) == 1
    data = json.loads(capsys.readouterr().out)
    assert any(reason in p for p in data["memory_problems"])
