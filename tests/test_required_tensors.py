"""The tensors the pinned llama.cpp's loader requires (model/required.py, tables generated into
model/layertable.py from each architecture's load_arch_tensors): a file without one is refused where
moeconf would otherwise size a model the engine never loads (tests/engine/test_required_tensors.py
shows the engine stopping on each architecture's)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS, TINY, metadata, tensors
from moeconf.memory import read_settings
from moeconf.model.inventory import Inventory
from moeconf.model.layertable import ML_REQUIRED_BLOCK, ML_REQUIRED_GLOBAL, ML_REQUIRED_UNLESS_MTP_ONLY
from moeconf.model.load import load_inventory
from moeconf.model.required import missing_tensors
from moeconf.sizing import estimate_explained
from tests.conftest import EXAMPLES

QWEN = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"


@pytest.mark.parametrize("key", [*LAYOUTS, *TINY])
def test_every_layout_holds_what_its_loader_requires(key: str) -> None:
    """Every layout the engine suite loads (so the engine takes it) has every tensor the table requires: a
    table that asked for a tensor under a condition of the file would refuse real models."""
    lay = {**LAYOUTS, **TINY}[key]
    md = metadata(lay)
    nextn = md.get(f"{lay.arch}.nextn_predict_layers", ("u32", 0))[1]
    trunk = int(md[f"{lay.arch}.block_count"][1]) - int(nextn or 0)  # type: ignore[call-overload]
    names = {n for n, _, _ in tensors(lay)}
    required = [*ML_REQUIRED_GLOBAL.get(lay.arch, ()),
                *(t % il for il in range(trunk) for t in ML_REQUIRED_BLOCK.get(lay.arch, ()))]
    assert [n for n in required if n not in names] == []


def test_the_tables_cover_the_common_decoders() -> None:
    """What the generator reads as surely required on the architectures most users run (a generator that
    read nothing would pass the test above)."""
    assert {"token_embd.weight", "output_norm.weight"} <= set(ML_REQUIRED_GLOBAL["qwen3moe"])
    assert {"blk.%d.attn_norm.weight", "blk.%d.ffn_gate_inp.weight", "blk.%d.ffn_down_exps.weight"} <= set(
        ML_REQUIRED_BLOCK["qwen3moe"])
    # output.weight is optional where a tied output may stand in (TENSOR_NOT_REQUIRED)
    assert "output.weight" not in ML_REQUIRED_GLOBAL["qwen3moe"]
    # an MTP architecture's trunk blocks take `trunk_flags` (TENSOR_NOT_REQUIRED only for a file of MTP blocks alone)
    assert "blk.%d.attn_norm.weight" in ML_REQUIRED_BLOCK["glm4moe"] and "glm4moe" in ML_REQUIRED_UNLESS_MTP_ONLY
    assert sum(1 for a in ML_REQUIRED_BLOCK if a in {lay.arch for lay in LAYOUTS.values()}) >= 35


def test_a_file_of_mtp_blocks_alone_needs_no_trunk_tensors() -> None:
    """GLM-4.5-Air's loader takes a file with MTP blocks and no blk.0.attn_norm.weight as its MTP blocks alone
    (`mtp_only`: the trunk's tensors TENSOR_NOT_REQUIRED); a file with the trunk needs every trunk tensor."""
    inv = load_inventory(EXAMPLES / "models" / "glm-4.5-air.manifest.json")
    assert inv.metadata.nextn_predict_layers and missing_tensors(inv) == ()
    assert missing_tensors(_without(inv, "blk.5.attn_norm.weight")) == ("blk.5.attn_norm.weight",)
    trunk = {f"blk.{il}.{k}" for il in range(inv.block_count - 1) for k in ("attn_norm.weight", "attn_output.weight")}
    assert missing_tensors(_without(inv, *trunk)) == ()


def _without(inv: Inventory, *names: str) -> Inventory:
    return dataclasses.replace(inv, tensors=tuple(t for t in inv.tensors if t.name not in names))


def test_a_file_without_a_required_tensor_is_refused_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    """A file lacking blk.3.ffn_norm.weight: explain names the refusal (exit 1), its memory is not given as
    complete (it was, to the byte of the full file's), inspect lists the tensor; ik_llama.cpp's loader is not
    read here, so ik's explain does not refuse."""
    inv = load_inventory(QWEN)
    assert missing_tensors(inv) == ()
    bad = _without(inv, "blk.3.ffn_norm.weight", "output_norm.weight")
    assert missing_tensors(bad) == ("output_norm.weight", "blk.3.ffn_norm.weight")
    e, argv = engine("llama.cpp"), ["-ngl", "99", "-c", "4096"]
    ex = explain(bad, e, argv)
    refusal = list(ex.load_refusals)
    assert refusal and "output_norm.weight, blk.3.ffn_norm.weight" in refusal[0], ex.load_refusals
    # the file's fault, not the command line's: a compiled command line's read-back (ex.refusals) does not see it
    assert not ex.refusals and ex.all_refusals == ex.load_refusals
    assert "it stops on the first it looks for: \"tensor '...' not found\"" in refusal[0]
    est = estimate_explained(ex, read_settings(argv, e))
    assert not est.complete and any("refuses to load this file" in n for n in est.notes), est.notes
    assert estimate_explained(explain(inv, e, argv), read_settings(argv, e)).complete
    assert not explain(bad, engine("ik_llama.cpp"), argv).load_refusals


def test_missing_tensors_is_computed_once_per_inventory() -> None:
    """explain, the memory model's file_refusals and lint each ask it of the same inventory (2 to 3 times a
    command, 8 for lint of examples/deploy's 4 models): the answer is the one computed first, and another
    inventory (the same file less a tensor) gets its own."""
    inv = load_inventory(QWEN)
    bad = _without(inv, "blk.3.ffn_norm.weight")
    first = missing_tensors(bad)
    assert first == ("blk.3.ffn_norm.weight",) and missing_tensors(bad) is first
    assert missing_tensors(_without(inv, "blk.4.ffn_norm.weight")) == ("blk.4.ffn_norm.weight",)
    assert missing_tensors(inv) == ()


def test_inspect_and_explain_report_the_missing_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(QWEN.read_text())
    data["tensors"] = [t for t in data["tensors"] if t["name"] != "blk.7.attn_output.weight"]
    path = tmp_path / "broken.manifest.json"
    path.write_text(json.dumps(data))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "missing tensors (1: llama.cpp's qwen3moe loader requires them" in out
    assert "  blk.7.attn_output.weight" in out
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["missing_tensors"] == ["blk.7.attn_output.weight"]
    assert main(["explain", str(path), "--", "llama-server", "-ngl", "99", "-c", "4096"]) == 1
    out = capsys.readouterr().out
    assert out.count("its qwen3moe loader requires blk.7.attn_output.weight") == 1, out  # once: not again as a note
    assert main(["inspect", str(QWEN), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["missing_tensors"] == []


@pytest.mark.parametrize("key", [*LAYOUTS, *TINY])
def test_every_layout_holds_only_what_its_loader_creates(key: str) -> None:
    """Every layout the engine suite loads has no tensor its llama.cpp loader never creates: a kind table that
    missed a kind the loader creates (a helper, a base class) would refuse real models."""
    from moeconf.model.required import uncreated

    lay = {**LAYOUTS, **TINY}[key]
    assert uncreated(lay.arch, [n for n, _, _ in tensors(lay)]) == ()


@pytest.mark.parametrize(("extra", "said"), [
    ("blk.3.attn_kv_b.weight", "its qwen3moe loader never creates blk.3.attn_kv_b.weight"),
    ("blk.3.lm_adapter.weight", "its qwen3moe loader never creates blk.3.lm_adapter.weight"),
])
def test_a_file_with_a_tensor_its_loader_never_creates_is_refused(
        extra: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every tensor of a file must be created (llama-model-loader.cpp done_getting_tensors: "wrong number of
    tensors"): a kind Qwen3's loader never creates (attn_kv_b, DeepSeek's) or a name no engine knows stops the
    load (tests/engine/test_required_tensors.py sees the pinned engine stop on both). explain refuses it once,
    and its memory is not given."""
    data = json.loads(QWEN.read_text())
    like = next(t for t in data["tensors"] if t["name"] == "blk.3.attn_norm.weight")
    data["tensors"].append({**like, "name": extra})
    path = tmp_path / "extra.manifest.json"
    path.write_text(json.dumps(data))
    assert main(["explain", str(path), "--", "llama-server", "-ngl", "99", "-c", "4096"]) == 1
    out = capsys.readouterr().out
    assert out.count(said) == 1 and "wrong number of tensors" in out, out
    inv = load_inventory(path)
    ex = explain(inv, engine("llama.cpp"), ["llama-server", "-ngl", "99", "-c", "4096"])
    assert not estimate_explained(ex, read_settings(["-c", "4096"], engine("llama.cpp"))).complete
    assert main(["explain", str(QWEN), "--", "llama-server", "-ngl", "99", "-c", "4096"]) == 0
    capsys.readouterr()


# the layouts ik_llama.cpp 0.1.5's loader cannot load for a tensor it never creates: Gemma 4's experts with gate
# and up apart (ik's gemma4 loader creates ffn_gate_up_exps alone), MiMo-V2-Flash's MTP block (ik's mimo2 loader
# creates the trunk's blocks only); tests/engine/test_required_tensors.py sees ik stop on both
IK_UNCREATED = {"gemma-4-26b-a4b": "blk.0.ffn_gate_exps.weight", "mimo-v2-flash": "blk.48.nextn.eh_proj.weight"}


@pytest.mark.parametrize("key", [*LAYOUTS, *TINY])
def test_every_layout_holds_only_what_its_ik_loader_creates(key: str) -> None:
    """ik_llama.cpp's loader makes the same check (every tensor created) on what its own loader creates
    (IK_ARCH_TENSORS, read from src/llama-load-tensors.cpp and its helpers, create_embd_output among them: a
    table that missed one would refuse every file on ik)."""
    from moeconf.model.required import uncreated

    lay = {**LAYOUTS, **TINY}[key]
    got = uncreated(lay.arch, [n for n, _, _ in tensors(lay)], "ik_llama.cpp")
    assert (got[0] if got else None) == IK_UNCREATED.get(key), got


def test_ik_refuses_gemma4_experts_apart_and_says_llama_cpp_loads_them(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from moeconf.fixtures.writer import write_layout

    path = write_layout(LAYOUTS["gemma-4-26b-a4b"], tmp_path / "g4.gguf")[0]
    line = ["--", "llama-server", "-ngl", "99", "-c", "8192", "-ot", "exps=CPU"]
    assert main(["explain", str(path), *line]) == 0
    capsys.readouterr()
    assert main(["explain", str(path), "--engine", "ik_llama.cpp", *line]) == 1
    out = capsys.readouterr().out
    assert out.count("ik_llama.cpp refuses to load this file: its gemma4 loader never creates "
                     "blk.0.ffn_gate_exps.weight") == 1, out
    assert "llama.cpp's gemma4 loader creates them: run the file with llama.cpp" in out, out
    # and ik's memory is not given (its weights and KV were, as if ik loaded the file)
    inv = load_inventory(path)
    ex = explain(inv, engine("ik_llama.cpp"), line[1:])
    est = estimate_explained(ex, read_settings(line[2:], engine("ik_llama.cpp")))
    assert not est.complete and any("its gemma4 loader never creates" in n for n in est.notes), est.notes


def _mla_older_form(arch: str, tmp_path: Path) -> Path:
    """`arch`'s tiny graph model with every block's attn_k_b and attn_v_b replaced by the decompressing
    attn_kv_b (the form of conversions before MLA's absorption), its MLA keys kept."""
    from moeconf.fixtures.graphmodels import write_graph_model

    whole = load_inventory(write_graph_model(arch, "a", tmp_path / "whole.gguf"))
    add, drop = [], []
    for il in sorted({t.layer for t in whole.tensors if t.name.endswith(".attn_k_b.weight")}):
        k_b, v_b = whole.by_name[f"blk.{il}.attn_k_b.weight"], whole.by_name[f"blk.{il}.attn_v_b.weight"]
        nope, rank, n_head = k_b.shape
        add.append((f"blk.{il}.attn_kv_b.weight", k_b.type, (rank, n_head * (nope + v_b.shape[1]))))
        drop += [f"blk.{il}.attn_k_b.weight", f"blk.{il}.attn_v_b.weight"]
    return write_graph_model(arch, "a", tmp_path / "kv_b.gguf", drop=drop, add=add)


def test_mla_keys_require_attn_k_b_and_attn_v_b(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """deepseek2's loader (mistral4's too) takes the form of a block's MLA from the keys (`is_mla`:
    attention.key_length_mla and value_length_mla non-zero): attn_k_b and attn_v_b then, attn_kv_b without
    (ML_REQUIRED_BLOCK_BY_MLA, generated). A Mistral-Small-4 file with the keys and attn_kv_b in their place
    stops the engine ("tensor 'blk.0.attn_k_b.weight' not found", tests/engine/test_required_tensors.py);
    it was an internal error here (the graph asked for attn_k_b)."""
    from moeconf.model.layertable import ML_REQUIRED_BLOCK_BY_MLA

    assert ML_REQUIRED_BLOCK_BY_MLA["deepseek2"] == (("blk.%d.attn_k_b.weight", "blk.%d.attn_v_b.weight"),
                                                     ("blk.%d.attn_kv_b.weight",))
    inv = load_inventory(_mla_older_form("mistral4", tmp_path))
    assert missing_tensors(inv)[:2] == ("blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight")
    assert main(["explain", str(inv.shards[0]), "--", "llama-server", "-ngl", "99", "-c", "4096"]) == 1
    out = capsys.readouterr().out
    assert "its mistral4 loader requires blk.0.attn_k_b.weight" in out and "Traceback" not in out, out
    # without the MLA keys the same tensors are the older form the loader takes
    plain = dataclasses.replace(inv, metadata=dataclasses.replace(inv.metadata, key_length_mla=None,
                                                                   value_length_mla=None))
    assert missing_tensors(plain) == ()
