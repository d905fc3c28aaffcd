"""The flagship manifests (issue 17 item 6: Kimi-K2.5, Qwen3-Coder-480B, GLM-4.7, Qwen3.5-122B and
35B) held to llama.cpp's own projection: tests/data/flagship_memory_oracle.json was measured with
`llama-fit-params -fitp on` (llama.cpp 0.3.36) on the sparse full-size layouts of
moeconf.fixtures.layouts_flagship / layouts_hybrid; the engine suite measures them again
(tests/engine/test_memory_flagship.py). Also: the expert-group keys the converters write
(`expert_group_count`, `expert_group_used_count`) are modelled for deepseek2 and glm4moe, and the
Kimi-K2.5 manifest is the size of the published Q4_X GGUF."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.layouts_flagship import FLAGSHIP_LAYOUTS, FlagshipLayout
from moeconf.fixtures.writer import write_layout
from moeconf.memory import support
from moeconf.memory.estimate import MemoryEstimate
from moeconf.memory.keys import GROUPS
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.model.manifest import read_manifest
from tests.recorded_memory import assert_recorded, errors, estimate_rpc, line_ids

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "examples" / "models"
FIGURES = json.loads((REPO / "tests" / "data" / "flagship_memory_oracle.json").read_text())["lines"]
EPS = ["127.0.0.1:50861", "127.0.0.1:50862"]
MiB = 1024 * 1024
GiB = 1024**3
VARIANTS = ("deepseek-v3-groups", "qwen3.5-35b-mtp")  # layouts of a real file that no manifest ships


def grouped_deepseek_v3() -> FlagshipLayout:
    """DeepSeek-V3's layout with the group keys its converted GGUF carries (config.json n_group 8,
    topk_group 4): llama.cpp builds the group selection for it (src/llama-graph.cpp build_moe_ffn)."""
    ds = LAYOUTS["deepseek-v3"]
    fields = {f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)}
    fields["key"] = "deepseek-v3-groups"
    return FlagshipLayout(**fields, extra=(("expert_group_count", "u32", 8), ("expert_group_used_count", "u32", 4)))


def write_qwen35_with_mtp(path: Path) -> None:
    """Qwen3.5-35B-A3B as the pinned converter writes it by default (conversion/qwen.py
    `_QwenMtpMixin`): one more block (blk.40: full attention and MoE, as the trunk's attention
    layers, plus the `nextn.*` tensors) and `nextn_predict_layers` 1."""
    import gguf

    from moeconf.fixtures.layouts import metadata, tensors
    from moeconf.fixtures.writer import write_gguf

    lay = LAYOUTS["qwen3.5-35b-a3b"]
    ts = tensors(lay)
    h = lay.hidden
    mtp = [(n.replace("blk.3.", "blk.40."), t, s) for n, t, s in ts if n.startswith("blk.3.")]
    mtp += [("blk.40.nextn.eh_proj.weight", "Q8_0", (2 * h, h)), ("blk.40.nextn.enorm.weight", "F32", (h,)),
            ("blk.40.nextn.hnorm.weight", "F32", (h,)), ("blk.40.nextn.shared_head_norm.weight", "F32", (h,))]
    md = metadata(lay) | {"qwen35moe.block_count": ("u32", 41), "qwen35moe.nextn_predict_layers": ("u32", 1)}
    kinds = {"str": gguf.GGUFValueType.STRING, "u32": gguf.GGUFValueType.UINT32,
             "f32": gguf.GGUFValueType.FLOAT32, "u32[]": gguf.GGUFValueType.ARRAY}
    kv = [(k, v, kinds[t]) for k, (t, v) in md.items()]
    kv += [("general.file_type", 15, gguf.GGUFValueType.UINT32), ("general.quantization_version", 2, None)]
    trunk = [x for x in ts if not x[0].startswith("output")]
    write_gguf(path, "qwen35moe", kv, trunk + mtp + [x for x in ts if x[0].startswith("output")], vocab=lay.vocab)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    out = {k: read_manifest(MODELS / f"{k}.manifest.json") for k in {line["model"] for line in FIGURES}
           if k not in VARIANTS}
    folder = tmp_path_factory.mktemp("variants")
    write_layout(grouped_deepseek_v3(), folder / "deepseek-v3-groups.gguf")  # sparse: the header only is written
    write_qwen35_with_mtp(folder / "qwen3.5-35b-mtp.gguf")
    out |= {k: load_inventory(folder / f"{k}.gguf") for k in VARIANTS}
    return out


def _estimate(inv: Inventory, line: str) -> tuple[MemoryEstimate, list[str]]:
    return estimate_rpc(inv, line, EPS)


@pytest.mark.parametrize("line", FIGURES, ids=line_ids(FIGURES))
def test_memory_matches_the_engines_figures(models: dict[str, Inventory], line: dict[str, object]) -> None:
    assert_recorded(models[str(line["model"])], line, EPS)


def test_the_comparison_catches_a_wrong_answer(models: dict[str, Inventory]) -> None:
    """The same line against figures 2 MiB off in KV and 20 MiB off in compute is refused."""
    line = FIGURES[0]
    est, eps = _estimate(models[str(line["model"])], str(line["args"]))
    wrong = {d: [w, kv + 2, c + 20] for d, (w, kv, c) in line["devices"].items()}  # type: ignore[attr-defined]
    bad = errors(est, wrong, eps)
    assert {(d, t) for d, t, _, _ in bad} >= {("RPC0", "kv"), ("RPC0", "compute")}


@pytest.mark.parametrize("model", ["kimi-k2.5", "glm-4.7", "deepseek-v3-groups"])
def test_the_group_keys_are_read_and_without_them_refused(models: dict[str, Inventory], model: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The converters write n_group / topk_group as `expert_group_count` / `_used_count`; a model that
    did not handle them would refuse every such file (real DeepSeek-V3, Kimi and GLM-4.x GGUFs). They are
    handled for every architecture (keys.NO_MEMORY_EFFECT; the graph routes the groups of any composition,
    tests/engine/test_expert_groups.py)."""
    inv = models[model]
    assert {"expert_group_count", "expert_group_used_count"} <= set(inv.metadata.arch_keys or ())
    for eng in ("llama.cpp", "ik_llama.cpp"):
        assert support.unmodelled(inv, eng) == []
    monkeypatch.setattr(support, "NO_MEMORY_EFFECT", support.NO_MEMORY_EFFECT - GROUPS)
    why = support.unmodelled(inv, "llama.cpp")
    assert [w.split(":")[0] for w in why] == [
        f"memory is not modelled for {inv.arch}.{k}" for k in ("expert_group_count", "expert_group_used_count")]
    assert all(f"the llama.cpp loader of {inv.arch!r} reads it" in w for w in why)


def test_kimi_k25_is_the_published_q4_x_gguf() -> None:
    """ubergarm/Kimi-K2-Thinking-GGUF's Q4_X (routed experts Q4_0, the rest Q8_0) is 543.617 GiB;
    the same recipe on Kimi-K2.5's text model (the same dimensions) is what the manifest holds."""
    inv = read_manifest(MODELS / "kimi-k2.5.manifest.json")
    assert abs(sum(t.nbytes for t in inv.tensors) / GiB - 543.617) < 0.001
    types = {t.base: t.type for t in inv.tensors if t.layer == 5}
    assert types["ffn_gate_exps"] == types["ffn_up_exps"] == types["ffn_down_exps"] == "Q4_0"
    assert types["attn_q_b"] == types["ffn_down_shexp"] == "Q8_0"
    assert inv.metadata.context_length == 262144 and inv.metadata.hparam("expert_group_count") == 1


@pytest.mark.parametrize("key", sorted(FLAGSHIP_LAYOUTS))
def test_each_flagship_layout_is_shipped(key: str) -> None:
    assert read_manifest(MODELS / f"{key}.manifest.json").metadata.name == FLAGSHIP_LAYOUTS[key].name


def test_the_docs_list_every_shipped_manifest_and_its_size() -> None:
    """docs/inventory.md's table names each manifest of examples/models once, with its architecture,
    context and size as the manifest has them (a manifest added without its row fails here)."""
    rows = [line.split("|")[1:-1] for line in (REPO / "docs" / "inventory.md").read_text().splitlines()
            if line.startswith("| `") and ".manifest" not in line and "GiB" in line]
    listed = {cells[0].strip().strip("`"): [c.strip() for c in cells] for cells in rows}
    shipped = sorted(p.name.removesuffix(".manifest.json") for p in MODELS.glob("*.manifest.json"))
    assert sorted(listed) == shipped and len(rows) == len(shipped)
    for key in shipped:
        inv = read_manifest(MODELS / f"{key}.manifest.json")
        gib = sum(t.nbytes for t in inv.tensors) / GiB
        assert listed[key][2] == f"`{inv.arch}`"
        assert listed[key][3] == f"{inv.metadata.file_type_name}, {gib:.1f} GiB"
        assert listed[key][4] == str(inv.metadata.context_length)
        assert listed[key][5] == ("modelled" if not support.unmodelled(inv, "llama.cpp") else "refused")


def test_qwen35_mtp_block_changes_no_memory(models: dict[str, Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine gave the same figures with and without the MTP block (the loader skips it, the
    trunk's memory leaves it out); moeconf agrees, and without `nextn_predict_layers` in its table it
    would refuse every Qwen3.5 GGUF the pinned converter writes."""
    with_mtp, without = models["qwen3.5-35b-mtp"], read_manifest(MODELS / "qwen3.5-35b-a3b.manifest.json")
    assert with_mtp.block_count == without.block_count + 1
    for line in ("-c 65536 -ngl 999 -ot exps=CPU", "-c 32768 -ngl 999"):
        a, _ = _estimate(with_mtp, line)
        b, _ = _estimate(without, line)
        assert a.complete and b.complete
        assert {d: (m.weights, m.kv, m.compute) for d, m in a.devices.items()} == {
            d: (m.weights, m.kv, m.compute) for d, m in b.devices.items()}
    spec = support.MODELLED["qwen35moe"]
    monkeypatch.setitem(support.MODELLED, "qwen35moe",
                        dataclasses.replace(spec, keys=spec.keys - {"nextn_predict_layers"}))
    assert [w.split(":")[0] for w in support.unmodelled(with_mtp, "llama.cpp")] == [
        "memory is not modelled for qwen35moe.nextn_predict_layers"]
