"""What the memory model does not model, it says so and refuses (issue 17): an architecture outside
`moeconf.memory.support.MODELLED`, or a `{arch}.*` key it does not read, makes memory incomplete
with a note naming it; `explain` prints the note and no KV or compute figure; `fit` refuses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import estimate, read_settings
from moeconf.memory.ikarchs import kv_only
from moeconf.memory.keys import NO_MEMORY_EFFECT
from moeconf.memory.support import MODELLED, unmodelled
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.model.manifest import dumps_manifest, read_manifest
from moeconf.model.required import load_refusals

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "examples" / "models"


def _variant(tmp_path: Path, name: str, *, arch: str | None = None, key: tuple[str, int] | None = None) -> Path:
    data = json.loads((MODELS / "qwen3-30b-a3b.manifest.json").read_text())
    if arch is not None:
        data["metadata"]["arch"] = arch
    if key is not None:
        data["metadata"]["hparams"][key[0]] = key[1]
        data["metadata"]["arch_keys"].append(key[0])
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_the_compositions_memory_is_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which architectures are modelled, their keys and what they were checked on are the compositions'
    `MEMORY` (memory/graph/archs), and nothing else: a composition without one is not modelled, and changing
    one changes what support answers. ik_llama.cpp is modelled in full only where memory/ikarchs.py says so."""
    from moeconf.memory import ikarchs, support
    from moeconf.memory.graph.archs import COMPOSITIONS, Lazy

    assert set(MODELLED) == {a for a, c in COMPOSITIONS.items() if c.memory is not None}
    for arch, spec in MODELLED.items():
        memory = COMPOSITIONS[arch].memory
        assert memory is not None and (spec.keys, spec.checked) == (memory.keys, memory.checked_on)
        assert spec.engines == ({"llama.cpp", "ik_llama.cpp"} if arch in ikarchs.MODELLED_IN_FULL else {"llama.cpp"})
    assert set(MODELLED) >= set(ikarchs.MODELLED_IN_FULL) and not ikarchs.MODELLED_IN_FULL & ikarchs.KV_ONLY
    # dots1's composition without its MEMORY: refused, not modelled with no keys
    dots1 = COMPOSITIONS["dots1"]
    monkeypatch.setitem(COMPOSITIONS, "dots1", dataclasses.replace(dots1, memory=None))
    fresh = Lazy(support._modelled, lambda: list(COMPOSITIONS))
    assert "dots1" not in fresh and "dots1" not in set(fresh)
    # its keys are the composition's: one taken out is read as unmodelled
    assert dots1.memory is not None
    monkeypatch.setitem(COMPOSITIONS, "dots1", dataclasses.replace(dots1, memory=dataclasses.replace(
        dots1.memory, keys=frozenset())))
    assert Lazy(support._modelled, lambda: list(COMPOSITIONS))["dots1"].keys == frozenset()


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.manifest.json")), ids=lambda p: p.name)
@pytest.mark.parametrize("eng", ["llama.cpp", "ik_llama.cpp"])
def test_shipped_models_are_modelled(path: Path, eng: str) -> None:
    inv = read_manifest(path)
    assert inv.metadata.arch_keys, "a version-3 manifest records its architecture keys"
    # kv_only: ik_llama.cpp's weights and KV by memory/ikarchs.py, compute from llama.cpp's graph
    if kv_only(inv.arch, eng) or eng in MODELLED[inv.arch].engines:
        assert unmodelled(inv, eng) == []
    else:  # modelled for llama.cpp only: a refusal naming the engine
        assert unmodelled(inv, eng) == [f"memory is not modelled for {inv.arch!r} on {eng}"]


def test_every_modelled_key_is_a_real_engine_key() -> None:
    # a typo in the tables would silently refuse (or, in NO_MEMORY_EFFECT, silently accept) a key:
    # every key named is one some pinned loader reads (moeconf/engines/archkeys.py)
    from moeconf.engines import archkeys

    known = frozenset().union(*archkeys.MAINLINE.values(), *archkeys.IK.values())
    for key in NO_MEMORY_EFFECT | {k for spec in MODELLED.values() for k in spec.keys}:
        assert key in known, key


@pytest.mark.parametrize(("arch", "key", "fragment"), [
    ("llada-moe", None, "not modelled for the 'llada-moe' architecture"),
    # a modelled hybrid whose file lacks what its model reads (memory/recurrent.py, graph/archs/glm5_next.py)
    ("glm5-next", None, "it lacks glm5-next.ssm.conv_kernel"),
    # a modelled architecture whose file lacks what its model reads (memory/indexer.py)
    ("glm-dsa", None, "glm-dsa.attention.indexer.top_k is missing: the engine refuses the file"),
    # keys the pinned llama.cpp's qwen3moe loader reads (its common part) that moeconf does not model
    ("qwen3moe", ("pooling_type", 1), "not modelled for qwen3moe.pooling_type: the llama.cpp loader of 'qwen3moe' "
                                      "reads it (into pooling_type)"),
    ("qwen3moe", ("embedding_length_out", 1024), "not modelled for qwen3moe.embedding_length_out"),
])
def test_unmodelled_is_incomplete_explained_and_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, key: tuple[str, int] | None,
        fragment: str) -> None:
    p = _variant(tmp_path, "m.manifest.json", arch=arch, key=key)
    inv = load_inventory(p)
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768"]
    eng = engine("llama.cpp")
    est = estimate(explain(inv, eng, argv, gpus=("CUDA0",)).placement, read_settings(argv, eng))
    assert not est.complete
    assert any(fragment in n for n in est.notes)
    assert all(m.kv == 0 and m.compute == 0 for m in est.devices.values())

    # (a qwen3moe file relabelled glm-dsa lacks glm-dsa's MLA tensors, one relabelled glm5-next holds Q/K norms
    # its loader never creates: explain also says the loader refuses it)
    assert main(["explain", str(p), "--", *argv]) == (1 if load_refusals(inv) else 0)
    out = capsys.readouterr().out
    assert fragment in out
    row = next(line for line in out.splitlines() if line.strip().startswith("CUDA0"))
    assert row.split()[2:4] == ["?", "?"] and ">=" in row

    for gpus in (["--gpu", "24GiB"], ["--gpu", "120GiB", "--gpu", "120GiB"]):
        assert main(["fit", str(p), *gpus, "-c", "32768"]) == 2
        captured = capsys.readouterr()
        assert fragment in captured.err and "-ot" not in captured.out


def test_manifest_keeps_hparams_and_arch_keys(tmp_path: Path) -> None:
    p = _variant(tmp_path, "m.manifest.json", key=("ssm.state_size", 128))
    inv = read_manifest(p)
    assert inv.metadata.hparam("ssm.state_size") == 128
    assert inv.metadata.hparam("attention.head_count") == 32  # a key with an attribute of its own
    assert "ssm.state_size" in (inv.metadata.arch_keys or ())
    again = tmp_path / "again.manifest.json"
    again.write_text(dumps_manifest(inv))
    assert read_manifest(again) == inv


@pytest.mark.parametrize(("value", "fragment"), [
    ("x", "metadata.hparams.k: expected an integer"),
    (["1", 2], "metadata.hparams.k[0]: expected an integer"),
])
def test_manifest_rejects_bad_hparams(tmp_path: Path, value: object, fragment: str) -> None:
    data = json.loads((MODELS / "qwen3-30b-a3b.manifest.json").read_text())
    data["metadata"]["hparams"]["k"] = value
    p = tmp_path / "bad.manifest.json"
    p.write_text(json.dumps(data))
    with pytest.raises(Exception, match=r"hparams") as e:
        read_manifest(p)
    assert fragment in str(e.value)


@pytest.mark.parametrize("key", [("full_attention_interval", 4), ("attn_logit_softcapping", 30)])
def test_a_key_the_loader_does_not_read_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         key: tuple[str, int]) -> None:
    # the pinned llama.cpp's qwen3moe loader reads neither (moeconf/engines/archkeys.py): no refusal
    inv = load_inventory(_variant(tmp_path, "m.manifest.json", key=key))
    assert unmodelled(inv, "llama.cpp") == []
    # the same file, were the loader to read the key: refused, naming it and what to do next
    from moeconf.engines import archkeys
    monkeypatch.setitem(archkeys.MAINLINE, "qwen3moe", archkeys.MAINLINE["qwen3moe"] | {key[0]})
    assert unmodelled(inv, "llama.cpp") == [
        f"memory is not modelled for qwen3moe.{key[0]}: the llama.cpp loader of 'qwen3moe' reads it (into "
        f"{', '.join(archkeys.FIELDS[key[0]])}) and moeconf does not model what it changes; measure this model "
        "with llama.cpp's llama-fit-params -fitp on"]


def test_every_handled_key_is_one_the_loader_reads() -> None:
    # a key listed as modelled for an architecture whose loader never reads it is a stale claim
    from moeconf.engines import archkeys
    for arch, spec in MODELLED.items():
        if "llama.cpp" in spec.engines:
            assert spec.keys <= archkeys.MAINLINE[arch], (arch, sorted(spec.keys - archkeys.MAINLINE[arch]))


def test_an_unmodelled_architecture_names_what_it_lacks_and_the_next_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from moeconf.memory.support import MODELLED, NOT_SERVED, routed_expert_archs, unmodelled_architecture

    # (DeepSeek-V4, the example here before, is composed now: archs/deepseek4.py). Every architecture is modelled
    # or not applicable now: nomic-bert-moe, taken as one still to compose, names the blocks it lacks
    monkeypatch.delitem(NOT_SERVED, "nomic-bert-moe")
    bert = unmodelled_architecture("nomic-bert-moe")
    assert "token_types" in bert and "token_embd_norm" in bert and "llama-fit-params -fitp on" in bert
    assert "qwen3moe" not in bert  # no list of what is modelled instead of what is missing
    # (SmallThinker, the example here before, is composed now: archs/smallthinker.py; so is refact,
    # archs/refact.py, whose tensor kinds all remain modelled elsewhere: the message's wording is what is held)
    assert "no composition of its graph" in unmodelled_architecture("refact")
    assert "read the buffer sizes it logs" in unmodelled_architecture("refact", "ik_llama.cpp")
    # a model llama-server does not serve, or an architecture whose loader makes no routed experts, is refused
    # for that reason, not as a composition still to come
    llada = unmodelled_architecture("llada-moe")
    assert "llama-server does not serve it as a text model (diffusion model" in llada
    assert "no composition" not in llada and "To size memory" in llada
    lfm2 = unmodelled_architecture("lfm2")
    assert lfm2.startswith("memory is not modelled for the 'lfm2' architecture: a dense architecture")
    archs = routed_expert_archs()
    assert len(archs) == 67 and "deepseek4" in archs and "qwen3moe" in archs
    for arch in archs:
        if arch not in MODELLED:
            assert "To size memory" in unmodelled_architecture(arch), arch


def test_unfused_swiglu_clamps_are_refused(tmp_path: Path) -> None:
    """Ling 3.0's converter writes swiglu_clamp_exp/shexp where the checkpoint limits its SwiGLU: the engine
    then clamps and multiplies in separate ops (not the fused op it gives GLM-5.3-Flash), a graph moeconf has
    not checked: memory is refused, naming the key (memory/keys.py)."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout

    path = tmp_path / "ling.gguf"
    write_layout(LAYOUTS["ling-3.0-flash"], path)
    inv = load_inventory(path)
    assert unmodelled(inv, "llama.cpp") == []
    md = inv.metadata
    clamped = dataclasses.replace(inv, metadata=dataclasses.replace(
        md, arch_keys=(*(md.arch_keys or ()), "swiglu_clamp_exp")))
    assert [w.split(":")[0] for w in unmodelled(clamped, "llama.cpp")] == [
        "memory is not modelled for bailingmoe3.swiglu_clamp_exp"]



def test_a_minicpm_file_without_its_scales_is_refused(tmp_path: Path) -> None:
    """MiniCPM's loader gives the embedding, residual and logit scales defaults that are not 0 and the
    keys override them; its composition runs a scale only where the key is there (archs/minicpm.py). A
    file lacking one (an old conversion) would get a graph without a scale the engine runs: the estimate
    is incomplete, naming the key and the next step."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "minicpm.gguf"
    write_layout(LAYOUTS["minicpm-moe-8x2b"], path)
    inv = load_inventory(path)
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    md = inv.metadata
    old = dataclasses.replace(inv, metadata=dataclasses.replace(
        md, arch_keys=tuple(k for k in md.arch_keys or () if k != "residual_scale")))
    est = estimate_line(old, "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert "minicpm.residual_scale" in notes and "reconvert" in notes and "minicpm.logit_scale" not in notes, notes


def test_a_granite_file_without_rope_is_refused(tmp_path: Path) -> None:
    """Granite's loader reads rope.scaling.finetuned as a switch: false, and no layer runs RoPE (the
    graph has no positions either), a graph its composition does not build (archs/granite.py): the
    estimate is incomplete, naming the key; true, or absent, is what was checked."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "granite.gguf"
    write_layout(LAYOUTS["granite-synthetic-moe"], path)
    inv = load_inventory(path)
    md = inv.metadata

    def with_rope(on: int) -> Inventory:
        return dataclasses.replace(inv, metadata=dataclasses.replace(
            md, arch_keys=(*(md.arch_keys or ()), "rope.scaling.finetuned"),
            hparams=tuple(sorted((*md.hparams, ("rope.scaling.finetuned", on))))))

    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    assert estimate_line(with_rope(1), "-c 4096 -ngl 999").complete
    est = estimate_line(with_rope(0), "-c 4096 -ngl 999")
    assert not est.complete
    assert "granite.rope.scaling.finetuned is false" in " ".join(est.notes), est.notes
def test_a_grovemoe_file_with_fewer_adjugate_experts_than_used_is_refused(tmp_path: Path) -> None:
    """GroveMoE's graph sums as many views of the adjugate experts' output as the model uses experts
    (build_moe_ffn reads hparams' n_expert_used), past its end where there are fewer adjugate experts
    (expert_count / experts_per_group): the engine aborts (seen on a tiny file with 2 of them and 3 used).
    GroveMoE-Inst (64 of them, 8 used) is modelled; 32 experts per group (4 of them) is refused, naming why."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.layouts_loaders import LoaderLayout
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    lay = LAYOUTS["grovemoe-inst"]
    assert isinstance(lay, LoaderLayout)
    path = tmp_path / "grovemoe.gguf"
    write_layout(lay, path)
    assert estimate_line(load_inventory(path), "-c 4096 -ngl 999").complete
    few = tmp_path / "grovemoe-few.gguf"
    write_layout(dataclasses.replace(lay, extra=tuple({**dict(lay.extra), "experts_per_group": 32}.items())), few)
    inv = load_inventory(few)
    assert inv.by_name["blk.0.ffn_down_chexps.weight"].shape[2] == 4
    est = estimate_line(inv, "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert "4 adjugate experts" in notes and "the 8 experts used" in notes and "aborts" in notes, notes


def test_a_mellum_window_without_windowed_layers_is_refused(tmp_path: Path) -> None:
    """Mellum's loader sets sliding-window attention whenever attention.sliding_window is above 0, and the
    engine then builds the cache pair's graph (mellum.cpp build_arch_graph) even where the pattern marks no
    layer windowed; moeconf's geometry has no windowed layer there and would build the single-cache graph,
    which no recorded dump checked for that file: refused, naming the keys. Mellum2's own pattern (one full
    layer in four) is modelled."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "mellum.gguf"
    write_layout(LAYOUTS["mellum2-12b-a2.5b"], path)
    inv = load_inventory(path)
    md = inv.metadata
    assert md.sliding_window and estimate_line(inv, "llama-server -np 1 -c 4096 -ngl 999").complete
    for pattern in (1, (0,) * md.block_count):
        full = dataclasses.replace(inv, metadata=dataclasses.replace(md, sliding_window_pattern=pattern))
        est = estimate_line(full, "llama-server -np 1 -c 4096 -ngl 999")
        assert not est.complete, pattern
        notes = " ".join(est.notes)
        assert "mellum.attention.sliding_window is 1024" in notes and "marks no layer windowed" in notes, notes
    no_window = dataclasses.replace(inv, metadata=dataclasses.replace(md, sliding_window=0, sliding_window_pattern=1))
    assert estimate_line(no_window, "llama-server -np 1 -c 4096 -ngl 999").complete


def test_a_hy_v3_dense_block_without_its_gate_is_refused(tmp_path: Path) -> None:
    """HY V3's loader makes a dense block's ffn_gate optional; without it build_ffn runs SiLU over the up
    projection alone (no GLU), a graph no recorded dump checked: refused, naming the block. Hy3-preview's
    dense block (gate, up and down) is modelled."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "hy3.gguf"
    write_layout(LAYOUTS["hy3-preview"], path)
    inv = load_inventory(path)
    assert "blk.0.ffn_gate.weight" in inv.by_name and "blk.0.ffn_gate_inp.weight" not in inv.by_name
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    ungated = dataclasses.replace(inv, tensors=tuple(t for t in inv.tensors if t.name != "blk.0.ffn_gate.weight"))
    est = estimate_line(ungated, "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert "block(s) [0] have ffn_up without ffn_gate.weight" in notes and "-fitp on" in notes, notes


def test_a_step35_block_without_its_norms_or_gate_is_refused(tmp_path: Path) -> None:
    """Step-3.5's loader makes each block's per-head Q/K norms and head-wise gate optional; a trunk block
    without one is a graph no recorded dump checked: refused, naming the block and the tensor. Step-3.5-Flash
    (every block with all three) is modelled."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "step35.gguf"
    write_layout(LAYOUTS["step-3.5-flash"], path)
    inv = load_inventory(path)
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    for gone in ("blk.5.attn_q_norm.weight", "blk.5.attn_k_norm.weight", "blk.5.attn_gate.weight"):
        assert gone in inv.by_name
        less = dataclasses.replace(inv, tensors=tuple(t for t in inv.tensors if t.name != gone))
        est = estimate_line(less, "-c 4096 -ngl 999")
        assert not est.complete, gone
        notes = " ".join(est.notes)
        assert f"block(s) [5] have attn_q without {gone[6:]}" in notes and "-fitp on" in notes, notes


@pytest.mark.parametrize("layout", ["granite-4.0-h-small", "nemotron-h-synthetic-moe", "nemotron-3-nano-30b-a3b"])
def test_a_mamba2_block_without_its_conv_bias_is_refused(tmp_path: Path, layout: str) -> None:
    """The Mamba-2 loaders (granitehybrid, nemotron_h, nemotron_h_moe) make ssm_conv1d.bias optional; a
    block without it (no bias added after the convolution) is a graph no recorded dump checked: refused,
    naming the block. The converters' files (the bias on every Mamba-2 block) are modelled."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "m.gguf"
    write_layout(LAYOUTS[layout], path)
    inv = load_inventory(path)
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    il = min(t.layer for t in inv.tensors if t.layer is not None and t.name.endswith(".ssm_conv1d.bias"))
    less = dataclasses.replace(inv, tensors=tuple(t for t in inv.tensors if t.name != f"blk.{il}.ssm_conv1d.bias"))
    est = estimate_line(less, "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert f"block(s) [{il}] have ssm_in without ssm_conv1d.bias" in notes and "-fitp on" in notes, notes


def test_a_kimi_linear_file_with_the_decompressing_kv_b_is_refused(tmp_path: Path) -> None:
    """Kimi-Linear's loader takes attn_kv_b (an older conversion) in place of attn_k_b and attn_v_b and
    then decompresses the heads through a full KV cache, a graph no recorded dump checked: refused, naming
    the blocks and saying to reconvert. The converter's file (attn_k_b, attn_v_b) is modelled."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "kimi.gguf"
    write_layout(LAYOUTS["kimi-linear-48b-a3b"], path)
    inv = load_inventory(path)
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    mla = sorted(t.layer for t in inv.tensors if t.name.endswith(".attn_k_b.weight"))
    assert mla
    old = dataclasses.replace(inv, tensors=tuple(
        dataclasses.replace(t, name=t.name.replace(".attn_k_b.", ".attn_kv_b.")) for t in inv.tensors
        if not t.name.endswith(".attn_v_b.weight")))
    est = estimate_line(old, "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert f"block(s) {mla} have attn_kv_b without attn_k_b (an older conversion)" in notes, notes
    assert "crashes building the graph" in notes and "reconvert" in notes and "-fitp" not in notes, notes


def test_a_gemma4_block_with_a_fused_qkv_is_refused(tmp_path: Path) -> None:
    """Gemma 4's loader takes Q, K and V fused in one attn_qkv, which its converter does not write and no
    recorded dump checked: refused, naming the block. Gemma-4-26B-A4B (Q, K, V apart) is modelled."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "gemma4.gguf"
    write_layout(LAYOUTS["gemma-4-26b-a4b"], path)
    inv = load_inventory(path)
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    fused = dataclasses.replace(inv, tensors=tuple(
        dataclasses.replace(t, name="blk.0.attn_qkv.weight") if t.name == "blk.0.attn_q.weight" else t
        for t in inv.tensors if t.name not in ("blk.0.attn_k.weight", "blk.0.attn_v.weight")))
    est = estimate_line(fused, "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert "block(s) [0] have attn_qkv without attn_q.weight (Q, K and V fused" in notes, notes


@pytest.mark.parametrize("bias", ["attn_qkv.bias", "attn_q.bias"])
def test_a_fused_qkv_with_a_bias_is_refused(tmp_path: Path, bias: str) -> None:
    """The loaders' create_tensor_qkv takes a fused attn_qkv with its own bias, or with Q's, K's and V's
    biases apart (legacy or custom files): no converter writes either and no recorded dump checked them (the
    separate biases beside the fused weight are not built): refused for any composed architecture, here
    DBRX (its attn_qkv without a bias is modelled)."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "dbrx.gguf"
    write_layout(LAYOUTS["dbrx"], path)
    inv = load_inventory(path)
    assert "blk.1.attn_qkv.weight" in inv.by_name and estimate_line(inv, "-c 4096 -ngl 999").complete
    extra = dataclasses.replace(inv.by_name["blk.1.attn_norm.weight"], name=f"blk.1.{bias}")
    biased = dataclasses.replace(inv, tensors=(*inv.tensors, extra))
    est = estimate_line(biased, "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert "block(s) [1] have a fused attn_qkv with a bias" in notes and "-fitp on" in notes, notes


@pytest.mark.parametrize(("layout", "scale", "listed"), [
    ("dbrx", "blk.1.attn_qkv.scale", "attn_qkv"), ("dbrx", "output.scale", "output"),
    ("gemma-4-26b-a4b", "blk.0.attn_q.scale", "attn_q"), ("gemma-4-26b-a4b", "blk.2.ffn_up_exps.scale", "ffn_up_exps")])
def test_a_file_with_nvfp4_scales_is_refused(tmp_path: Path, layout: str, scale: str, listed: str) -> None:
    """An NVFP4 conversion writes a `.scale` beside each projection (its scale_2), which the pinned loader
    creates for every architecture and the graph multiplies in: no recorded dump checked that graph, so a
    file with one is refused, naming it; Gemma 4's own router and per-expert scales (its dumps) are not."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "model.gguf"
    write_layout(LAYOUTS[layout], path)
    inv = load_inventory(path)
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    extra = dataclasses.replace(inv.by_name["output_norm.weight"], name=scale,
                                layer=int(scale.split(".")[1]) if scale.startswith("blk.") else None)
    est = estimate_line(dataclasses.replace(inv, tensors=(*inv.tensors, extra)), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert f"it has per-tensor scales ({listed}: an NVFP4 conversion's .scale tensors)" in notes, notes
    assert "-fitp on" in notes, notes


@pytest.mark.parametrize("bias", ["blk.1.ffn_up.bias", "blk.1.ffn_down_shexp.bias"])
def test_a_file_with_ffn_biases_is_refused(tmp_path: Path, bias: str) -> None:
    """The llama, granite*, minicpm, mistral3, refact and nemotron_h loaders create optional MLP biases (an
    MLP with bias: a dense FFN's up, gate, down): no recorded dump checked build_ffn with them, so a file with
    one is refused, naming its block (fed here to Mixtral's layout, which is modelled without)."""
    import dataclasses

    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from tests.graph_oracle import estimate_line

    path = tmp_path / "mixtral.gguf"
    write_layout(LAYOUTS["mixtral-8x7b"], path)
    inv = load_inventory(path)
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    extra = dataclasses.replace(inv.by_name["blk.1.attn_norm.weight"], name=bias)
    est = estimate_line(dataclasses.replace(inv, tensors=(*inv.tensors, extra)), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert "block(s) [1] have FFN biases (ffn_up/gate/down.bias" in notes and "-fitp on" in notes, notes


@pytest.mark.parametrize(("change", "said"), [
    ("kv_b", "block(s) [1] have attn_kv_b without attn_k_b (an older conversion)"),
    ("shexp", "block(s) [1, 2] have only some of ffn_gate/up/down_shexp"),
])
def test_a_kimi_k3_file_in_an_unchecked_form_is_refused(tmp_path: Path, change: str, said: str) -> None:
    """Kimi-K3's loader takes MLA's decompressing attn_kv_b in place of attn_k_b and attn_v_b, and each of the
    shared expert's three tensors on its own (the engine runs the shared expert on ffn_gate_shexp alone): no
    recorded dump checked either graph (the composition stopped on attn_kv_b with a NotImplementedError, and
    built a shared expert from ffn_up_shexp without its gate), so such a file is refused naming the blocks. The
    tiny model's own forms (its dumps) are modelled."""
    from moeconf.fixtures.graphmodels import write_graph_model
    from tests.graph_oracle import estimate_line

    inv = load_inventory(write_graph_model("kimi-k3", "a", tmp_path / "k3.gguf"))
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    if change == "kv_b":
        tensors = tuple(dataclasses.replace(t, name=t.name.replace(".attn_k_b.", ".attn_kv_b.")) for t in inv.tensors
                        if not t.name.endswith(".attn_v_b.weight"))
    else:
        tensors = tuple(t for t in inv.tensors if not t.name.endswith(".ffn_gate_shexp.weight"))
    est = estimate_line(dataclasses.replace(inv, tensors=tensors), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert said in notes, notes


@pytest.mark.parametrize("beside", [("attn_k_b", "attn_v_b"), ("attn_k_b",), ("attn_v_b",)])
def test_a_kimi_k3_block_with_kv_b_beside_k_b_or_v_b_is_refused(tmp_path: Path, beside: tuple[str, ...]) -> None:
    """An MLA block with attn_kv_b beside attn_k_b or attn_v_b: src/models/kimi-k3.cpp creates attn_kv_b and,
    having it, neither attn_k_b nor attn_v_b, so the file holds tensors the loader never takes and llama.cpp
    stops (done_getting_tensors: "wrong number of tensors"); the composition sized the absorbed graph from
    attn_k_b and attn_v_b as if it ran. Refused naming the block and the tensors, once (not again as an
    attn_kv_b without attn_k_b where attn_v_b alone is beside it)."""
    from moeconf.fixtures.graphmodels import write_graph_model
    from tests.graph_oracle import estimate_line

    inv = load_inventory(write_graph_model("kimi-k3", "a", tmp_path / "k3.gguf"))
    mla = sorted(t.layer for t in inv.tensors if t.name.endswith(".attn_k_b.weight"))
    assert mla == [1] and estimate_line(inv, "-c 4096 -ngl 999").complete
    kv_b = dataclasses.replace(inv.by_name["blk.1.attn_k_b.weight"], name="blk.1.attn_kv_b.weight")
    dropped = {f"blk.1.{n}.weight" for n in ("attn_k_b", "attn_v_b") if n not in beside}
    tensors = (*(t for t in inv.tensors if t.name not in dropped), kv_b)
    est = estimate_line(dataclasses.replace(inv, tensors=tensors), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert f"block(s) [1] have attn_kv_b beside {' and '.join(beside)}" in notes, notes
    assert "wrong number of tensors" in notes and "without attn_k_b" not in notes, notes


@pytest.mark.parametrize("arch", ["kimi-linear", "mistral4"])
def test_an_mla_block_with_both_forms_is_refused(tmp_path: Path, arch: str) -> None:
    """Kimi-Linear's loader and deepseek2's (Mistral-Small-4's) create a block's attn_kv_b or its attn_k_b
    and attn_v_b, never both, as Kimi-K3's: a file with both in a block does not load (the engine suite's
    test_the_loader_stops_on_attn_kv_b_beside_attn_k_b), and its memory was given as if it did."""
    from moeconf.fixtures.graphmodels import write_graph_model
    from tests.graph_oracle import estimate_line

    inv = load_inventory(write_graph_model(arch, "a", tmp_path / "m.gguf"))
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    il = min(t.layer for t in inv.tensors if t.layer is not None and t.name.endswith(".attn_k_b.weight"))
    kv_b = dataclasses.replace(inv.by_name[f"blk.{il}.attn_k_b.weight"], name=f"blk.{il}.attn_kv_b.weight")
    est = estimate_line(dataclasses.replace(inv, tensors=(*inv.tensors, kv_b)), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert f"block(s) [{il}] have attn_kv_b beside attn_k_b and attn_v_b" in notes, notes
    # beside attn_v_b alone: the loader's refusal, not again as an older conversion's attn_kv_b without attn_k_b
    v_only = tuple(t for t in (*inv.tensors, kv_b) if t.name != f"blk.{il}.attn_k_b.weight")
    notes = " ".join(estimate_line(dataclasses.replace(inv, tensors=v_only), "-c 4096 -ngl 999").notes)
    assert f"block(s) [{il}] have attn_kv_b beside attn_v_b" in notes and "without attn_k_b" not in notes, notes


def test_llama_cpps_load_refusals_are_not_ik_llama_cpps(tmp_path: Path) -> None:
    """ik_llama.cpp's compute is sized on llama.cpp's graph of the same placement, but ik's loader reads the file
    by its own rules: its deepseek2 loader takes attn_kv_b beside attn_k_b and attn_v_b (llama-load-tensors.cpp),
    which llama.cpp's refuses. On llama.cpp the file is refused; on ik the estimate stays what it was (the
    review's reproduction). A name neither engine knows stops both loaders (done_getting_tensors: ik's
    `ik_load_refusals` on its own table)."""
    eng_ml, eng_ik = engine("llama.cpp"), engine("ik_llama.cpp")
    inv = load_inventory(MODELS / "deepseek-v3.manifest.json")
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "8192"]

    def est(i: Any, eng: Any) -> Any:
        return estimate(explain(i, eng, argv, gpus=("CUDA0",)).placement, read_settings(argv, eng))

    assert est(inv, eng_ik).complete
    like = inv.by_name["blk.0.attn_k_b.weight"]
    other = dataclasses.replace(inv, tensors=(*inv.tensors, dataclasses.replace(like, name="blk.0.attn_kv_b.weight")))
    assert not est(other, eng_ml).complete
    ik = est(other, eng_ik)
    assert ik.complete, ik.notes
    # (the extra tensor's weights aside, the same compute and KV cache)
    before = est(inv, eng_ik).devices
    assert {d: (m.kv, m.compute) for d, m in ik.devices.items()} == {d: (m.kv, m.compute) for d, m in before.items()}
    adapter = dataclasses.replace(like, name="blk.0.lm_adapter.weight")
    unknown = dataclasses.replace(inv, tensors=(*inv.tensors, adapter))
    for eng in (eng_ml, eng_ik):
        got = est(unknown, eng)
        assert not got.complete and f"{eng.name} refuses to load this file" in " ".join(got.notes), got.notes


def test_a_qwen4exp_file_without_its_shared_expert_is_refused(tmp_path: Path) -> None:
    """Qwen4Exp's loader requires the shared expert (its four tensors created flag 0): a file without one does
    not load, so the composition has no branch for it (the one it had no dump checked); the refusal names the
    tensors the file lacks. The tiny model with its shared experts is modelled."""
    from moeconf.fixtures.graphmodels import write_graph_model
    from tests.graph_oracle import estimate_line

    inv = load_inventory(write_graph_model("qwen4exp", "b", tmp_path / "q4.gguf"))
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    tensors = tuple(t for t in inv.tensors if "_shexp" not in t.name)
    est = estimate_line(dataclasses.replace(inv, tensors=tensors), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    said = "llama.cpp refuses to load this file: its qwen4exp loader requires blk.0.ffn_gate_inp_shexp.weight"
    assert said in notes, notes


_NORM = "it lacks a norm weight the graph reads "


@pytest.mark.parametrize(("arch", "drop", "said"), [
    # the loader requires it (its trunk flags, read by the generated table): the loader's refusal
    ("mistral4", "blk.1.ffn_norm.weight",
     "llama.cpp refuses to load this file: its mistral4 loader requires blk.1.ffn_norm.weight"),
    ("qwen3next", "blk.1.attn_q_norm.weight", _NORM + "(block 1)"),
    ("glm-dsa", "indexer.k_norm.weight", _NORM + "(block 0, block 1"),
])
def test_a_norm_without_its_weight_is_refused(tmp_path: Path, arch: str, drop: str, said: str) -> None:
    """Every recorded dump's norms have their weight: a file lacking a norm tensor the composition reads (one
    the loader requires where the generated table does not read it, as qwen3next's attn_q_norm, or one it
    takes as optional, as glm-dsa's indexer.k_norm) built build_norm's weightless branch, a graph no dump
    checked, and printed its figures as exact; such a file is refused naming the blocks (mistral4's ffn_norm,
    created with its trunk flags, the generated table reads: the loader's own refusal)."""
    from moeconf.fixtures.graphmodels import write_graph_model
    from tests.graph_oracle import estimate_line

    inv = load_inventory(write_graph_model(arch, "a", tmp_path / f"{arch}.gguf"))
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    tensors = tuple(t for t in inv.tensors if t.name != drop and not t.name.endswith(f".{drop}"))
    assert len(tensors) < len(inv.tensors)
    est = estimate_line(dataclasses.replace(inv, tensors=tensors), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert said in notes and ("-fitp on" in notes or "refuses to load" in said), notes


def test_a_granitehybrid_shared_expert_without_its_width_is_refused(tmp_path: Path) -> None:
    """Granite-4.0-H's loader creates the shared expert exactly where expert_shared_feed_forward_length is above 0:
    a file with ffn_*_shexp but no width does not load (the composition, keyed on the tensors, gave it a figure
    with a shared expert); the tiny set "a" (no shared expert, no width) is modelled."""
    from moeconf.fixtures.graphmodels import write_graph_model
    from tests.graph_oracle import estimate_line

    inv = load_inventory(write_graph_model("granitehybrid", "a", tmp_path / "gh.gguf"))
    assert estimate_line(inv, "-c 4096 -ngl 999").complete
    up = inv.by_name["blk.0.ffn_up_exps.weight"]
    down = inv.by_name["blk.0.ffn_down_exps.weight"]
    extra = (dataclasses.replace(up, name="blk.0.ffn_gate_shexp.weight", shape=up.shape[:2]),
             dataclasses.replace(up, name="blk.0.ffn_up_shexp.weight", shape=up.shape[:2]),
             dataclasses.replace(down, name="blk.0.ffn_down_shexp.weight", shape=down.shape[:2]))
    est = estimate_line(dataclasses.replace(inv, tensors=(*inv.tensors, *extra)), "-c 4096 -ngl 999")
    assert not est.complete
    notes = " ".join(est.notes)
    assert "block(s) [0] have some of ffn_gate/up/down_shexp where the file's expert_shared_feed_forward_length is " \
           "not set" in notes, notes
