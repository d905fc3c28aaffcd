"""The routed-expert architectures llama-server does not serve as a chat/completion model, whose
memory docs/memory-architectures.md marks "not applicable" (diffusion: `llada-moe`, `rnd1`;
embedding: `nomic-bert-moe`, `llama-embed`; OCR: `deepseek2-ocr`; a speculative drafter: `dflash`).
llama.cpp's loader still places their tensors as for any model, and `explain` of an engine command
on such a file must agree (tests/engine/test_placement_homes.py compares it with the engine's on
four lines). Here: every tensor is one the engine knows, the blocks are the loaders', and explain
places every tensor while naming that memory is not modelled."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from moeconf.cli import main
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.model.inventory import Inventory

# layout -> (architecture, the global line of `-ngl 999 -ot exps=CPU`)
NOT_APPLICABLE: dict[str, tuple[str, str]] = {
    "llada-moe-7b-a1b": ("llada-moe", "token_embd.weight CPU, output_norm.weight CUDA0, output.weight CUDA0"),
    "rnd1-base-0910": ("rnd1", "token_embd.weight CPU, output_norm.weight CUDA0, output.weight CUDA0"),
    "deepseek-ocr": ("deepseek2-ocr", "token_embd.weight CPU, output_norm.weight CUDA0, output.weight CUDA0"),
    "llama-embed-synthetic-moe": ("llama-embed",
                                  "token_embd.weight CPU, output_norm.weight CUDA0, output.weight CUDA0"),
    # an encoder: no output head; the embeddings' norm is block 0's (the engine's TOKEN_EMBD_NORM home)
    "nomic-embed-text-v2-moe": ("nomic-bert-moe", "token_embd.weight CPU, token_types.weight CPU, "
                                "token_embd_norm.weight CUDA0, token_embd_norm.bias CUDA0"),
    # the drafter: its heads and fc on the output layer's device, no embeddings of its own
    "deepseek-v4-flash-dspark": ("dflash", "markov_w1.weight CUDA0, markov_w2.weight CUDA0, conf_proj.weight "
                                 "CUDA0, fc.weight CUDA0, enc.output_norm.weight CUDA0"),
}
# known tensors the taxonomy files as `other` (draft-model heads: moeconf.model.taxonomy)
DRAFT_HEADS = {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "fc.weight", "enc.output_norm.weight"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    from tests.engine.oracle import write_sparse

    return write_sparse(tmp_path_factory.mktemp("not-applicable"), {key: LAYOUTS[key] for key in NOT_APPLICABLE})


def _table_script() -> ModuleType:
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gen_arch_table", root / "scripts" / "gen-arch-table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_not_applicable_architecture_has_a_layout() -> None:
    from moeconf.memory.support import NOT_SERVED

    assert set(NOT_SERVED) == {arch for arch, _ in NOT_APPLICABLE.values()}


def test_the_table_refuses_an_architecture_placement_does_not_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """An architecture with neither a layout nor a reason no layout can load stops the generator."""
    from moeconf.memory.support import NO_ROUTED_EXPERTS

    mod = _table_script()
    monkeypatch.delitem(NO_ROUTED_EXPERTS, "paddleocr")
    with pytest.raises(SystemExit, match="no layout checks the placement of paddleocr: add one"):
        mod.rows()


@pytest.mark.parametrize("key", sorted(NOT_APPLICABLE))
def test_every_tensor_is_known(files: dict[str, tuple[Path, Inventory]], key: str) -> None:
    _, inv = files[key]
    assert inv.arch == NOT_APPLICABLE[key][0]
    assert inv.warnings == ()
    unknown = [t.name for t in inv.tensors if not t.known or (t.group == "other" and t.name not in DRAFT_HEADS)]
    assert not unknown, unknown[:8]
    assert inv.layers_of_kind("moe")


@pytest.mark.parametrize("key", sorted(NOT_APPLICABLE))
def test_explain_places_and_says_memory_is_not_modelled(files: dict[str, tuple[Path, Inventory]], key: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = files[key]
    arch, globals_line = NOT_APPLICABLE[key]
    assert main(["explain", str(path), "--engine", "llama.cpp", "--", "-ngl", "999", "-ot", "exps=CPU",
                 "-fit", "off"]) == 0
    out = capsys.readouterr().out
    assert f"global: {globals_line}" in out
    note = next(line for line in out.splitlines() if "memory is not modelled" in line)
    assert f"for the '{arch}' architecture" in note and "KV cache and compute are not computed" in note


def test_nomic_experts_on_every_second_block(files: dict[str, tuple[Path, Inventory]]) -> None:
    """moe_every_n_layers 2: experts (up and down, no gate) where il % 2 == 1, a dense FFN with
    biases elsewhere, as the loader creates them."""
    _, inv = files["nomic-embed-text-v2-moe"]
    assert inv.layers_of_kind("moe") == list(range(1, 12, 2))
    assert inv.by_name["blk.1.ffn_up_exps.weight"].shape == (768, 3072, 8)
    assert "blk.1.ffn_gate_exps.weight" not in inv.by_name and "blk.2.ffn_up.bias" in inv.by_name


def test_dspark_stages_are_deepseek_v4_blocks(files: dict[str, tuple[Path, Inventory]]) -> None:
    """The drafter's stages carry DeepSeek-V4-Flash's experts and hyper-connections; fc reads the
    three target layers' hidden states."""
    _, inv = files["deepseek-v4-flash-dspark"]
    assert inv.by_name["blk.1.ffn_down_exps.weight"].shape == (2048, 4096, 256)
    assert inv.by_name["blk.0.hc_attn_fn.weight"].shape == (4 * 4096, 24)
    assert inv.by_name["fc.weight"].shape == (3 * 4096, 4096)
    assert "token_embd.weight" not in inv.by_name and "output.weight" not in inv.by_name
