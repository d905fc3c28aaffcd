"""What moeconf says the pinned llama.cpp's loader requires (model/layertable.py ML_REQUIRED_GLOBAL and
ML_REQUIRED_BLOCK, model/required.py) is what the engine requires: for every architecture with a tiny
graph model (moeconf/fixtures/graphmodels.py) whose loader the tables read, the file without one tensor
of each table (a different one per architecture) stops the loader with "tensor '<that name>' not
found" (llama-fit-params -fitp on: it reads the tensor metadata and allocates nothing). The complete
files load (the graph tests load each); moeconf finds nothing missing in them."""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path

import pytest

from moeconf.fixtures.graphmodels import ARCHS, write_graph_model
from moeconf.model.layertable import (
    ML_MTP_ONLY_PROBE,
    ML_REQUIRED_BLOCK,
    ML_REQUIRED_GLOBAL,
    ML_REQUIRED_UNLESS_MTP_ONLY,
)
from moeconf.model.load import load_inventory
from moeconf.model.required import missing_tensors
from tests.engine import oracle

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("table", ["block", "global"])
@pytest.mark.parametrize("arch", [a for a in ARCHS if a in ML_REQUIRED_BLOCK or a in ML_REQUIRED_GLOBAL])
def test_the_loader_stops_without_a_tensor_the_table_requires(arch: str, table: str, tmp_path: Path) -> None:
    if not oracle.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    inv = load_inventory(write_graph_model(arch, "a", tmp_path / "whole.gguf"))
    assert missing_tensors(inv) == ()
    required = (ML_REQUIRED_BLOCK if table == "block" else ML_REQUIRED_GLOBAL).get(arch, ())
    if not required:
        pytest.skip(f"the {table} table reads nothing as surely required of {arch}")
    pick = zlib.crc32(f"{arch} {table}".encode())  # a different tensor per architecture, the same each run
    drop = required[pick % len(required)]
    if table == "block":
        trunk = inv.block_count - (inv.metadata.nextn_predict_layers or 0)
        drop %= pick % trunk
        if drop == ML_MTP_ONLY_PROBE and arch in ML_REQUIRED_UNLESS_MTP_ONLY and inv.metadata.nextn_predict_layers:
            drop = drop.replace("blk.0.", "blk.1.")  # without it the loader takes the file for its MTP blocks alone
    path = write_graph_model(arch, "a", tmp_path / "less.gguf", drop=(drop,))
    assert missing_tensors(load_inventory(path)) == (drop,)
    p = oracle.load_failure(path, f"tensor '{drop}' not found")
    assert p.returncode != 0 and f"tensor '{drop}' not found" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize(("arch", "beside"), [("kimi-k3", ("attn_k_b", "attn_v_b")), ("kimi-k3", ("attn_k_b",)),
                                            ("kimi-linear", ("attn_k_b", "attn_v_b")),
                                            ("mistral4", ("attn_k_b", "attn_v_b"))])
def test_the_loader_stops_on_attn_kv_b_beside_attn_k_b(arch: str, beside: tuple[str, ...], tmp_path: Path) -> None:
    """The MLA loaders (kimi-k3, kimi-linear; mistral4 through deepseek2's) create a block's attn_kv_b or its
    attn_k_b and attn_v_b, never both: a file holding both forms has tensors they never create, and the load
    stops ("done_getting_tensors: wrong number of tensors"); moeconf's memory model refuses it
    (memory/graph/archs/common.py `mla_forms`), naming the tensors."""
    if not oracle.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    from tests.graph_oracle import estimate_line

    whole = load_inventory(write_graph_model(arch, "a", tmp_path / "whole.gguf"))
    il = min(t.layer for t in whole.tensors if t.layer is not None and t.name.endswith(".attn_k_b.weight"))
    k_b, v_b = whole.by_name[f"blk.{il}.attn_k_b.weight"], whole.by_name[f"blk.{il}.attn_v_b.weight"]
    nope, rank, n_head = k_b.shape  # attn_kv_b: {kv_lora_rank, n_head * (qk_nope + v)}
    kv_b = (f"blk.{il}.attn_kv_b.weight", k_b.type, (rank, n_head * (nope + v_b.shape[1])))
    drop = [f"blk.{il}.{n}.weight" for n in ("attn_k_b", "attn_v_b") if n not in beside]
    path = write_graph_model(arch, "a", tmp_path / "both.gguf", drop=drop, add=[kv_b])
    p = oracle.load_failure(path, "done_getting_tensors: wrong number of tensors")
    assert p.returncode != 0 and "done_getting_tensors: wrong number of tensors" in p.stderr, p.stderr[-2000:]
    est = estimate_line(load_inventory(path), "-c 4096 -ngl 999")
    assert not est.complete and f"have attn_kv_b beside {' and '.join(beside)}" in " ".join(est.notes), est.notes


@pytest.mark.parametrize(("arch", "extra"), [
    ("mistral4", "blk.1.attn_qkv.weight"), ("gemma4", "blk.1.attn_kv_b.weight"), ("minimax-m3", "blk.1.ssm_in.weight"),
    ("kimi-linear", "blk.1.lm_adapter.weight")])
def test_the_loader_stops_on_a_tensor_it_never_creates(arch: str, extra: str, tmp_path: Path) -> None:
    """Every tensor of a file must be created ("done_getting_tensors: wrong number of tensors"): a kind the
    architecture's loader never creates (model/nametable.py ML_ARCH_TENSORS) or a name no engine knows stops
    the load, and moeconf refuses the file (model/required.py `uncreated_tensors`)."""
    if not oracle.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    from moeconf.model.required import load_refusals, uncreated_tensors

    whole = load_inventory(write_graph_model(arch, "a", tmp_path / "whole.gguf"))
    assert uncreated_tensors(whole) == () and load_refusals(whole) == ()
    norm = whole.by_name["blk.1.attn_norm.weight"]
    path = write_graph_model(arch, "a", tmp_path / "extra.gguf", add=[(extra, norm.type, norm.shape)])
    assert uncreated_tensors(load_inventory(path)) == (extra,)
    p = oracle.load_failure(path, "done_getting_tensors: wrong number of tensors")
    assert p.returncode != 0 and "done_getting_tensors: wrong number of tensors" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize(("layout", "change", "first", "stop"), [
    # the experts' gate and up apart: ik stops first on the fused tensor its gemma4 loader requires
    ("gemma-4-26b-a4b", {}, "blk.0.ffn_gate_exps.weight", "tensor 'blk.0.ffn_gate_up_exps.weight' not found"),
    ("mimo-v2-flash", {"nextn": 1}, "blk.5.nextn.eh_proj.weight", "wrong number of tensors"),  # its MTP block
])
def test_ik_stops_on_a_tensor_its_loader_never_creates(layout: str, change: dict[str, int], first: str, stop: str,
                                                       tmp_path: Path) -> None:
    """ik_llama.cpp's loader checks every tensor was created too (llama-model-loader.cpp
    done_getting_tensors) on what its own loader creates (IK_ARCH_TENSORS): Gemma 4 with the experts' gate
    and up apart (ik's gemma4 creates ffn_gate_up_exps alone, and stops first for want of it) and
    MiMo-V2-Flash with its MTP block stop it;
    moeconf refuses both on ik (model/required.py `ik_load_refusals`) and not on llama.cpp, whose loader
    creates them. The forms ik loads (fused, no MTP block) load in test_ik_newer.py."""
    import dataclasses

    from moeconf.model.required import ik_load_refusals, load_refusals
    from tests.engine import ik_newer_cases as cases
    from tests.engine.harness import IK, run_engine

    if not IK.available():
        pytest.fail(f"ik_llama.cpp is not built: run scripts/build-engines.sh (looked for {IK.cli})")
    cut = dataclasses.replace(cases.cut_layout(layout), extra=cases.LAYOUTS[layout].extra, **change)
    path, inv = oracle.write_sparse(tmp_path, {layout: cut})[layout]
    assert load_refusals(inv) == ()
    assert f"its {inv.arch} loader never creates {first}" in " ".join(ik_load_refusals(inv))
    run = run_engine(IK, path, ["-ngl", "0", "--dry-run"])
    assert run.returncode != 0 and stop in run.log, run.log[-2000:]


def test_the_loader_takes_mlas_form_from_the_keys(tmp_path: Path) -> None:
    """deepseek2's loader (Mistral-Small-4's) requires attn_k_b and attn_v_b where the file's MLA keys are set
    (`is_mla`), attn_kv_b where they are not (model/layertable.py ML_REQUIRED_BLOCK_BY_MLA): a file with the keys
    and attn_kv_b in their place stops on attn_k_b, and moeconf says so (model/required.py `missing_tensors`)."""
    if not oracle.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    from tests.test_required_tensors import _mla_older_form

    path = _mla_older_form("mistral4", tmp_path)
    assert missing_tensors(load_inventory(path))[0] == "blk.0.attn_k_b.weight"
    p = oracle.load_failure(path, "tensor 'blk.0.attn_k_b.weight' not found")
    assert p.returncode != 0 and "tensor 'blk.0.attn_k_b.weight' not found" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_engine_stops_without_a_weight_the_graph_reads(arch: str, tmp_path: Path) -> None:
    """Where moeconf's graph finds a weight missing (tests/test_graph_reads.py: the estimate refuses, "the pinned
    llama.cpp does not load it"), the engine indeed does not: for each architecture one such file (a different
    kind per architecture, the same each run; all 373 of them were seen to fail once, 360 on "tensor ... not
    found" and 13 crashing as they build the graph) stops llama-fit-params."""
    if not oracle.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    from tests.test_graph_reads import graph_refusals, kinds

    refused = sorted(graph_refusals(arch, tmp_path))
    if not refused:
        pytest.skip(f"no weight of {arch}'s tiny model is refused by the graph alone (the tables catch each)")
    kind = refused[zlib.crc32(arch.encode()) % len(refused)]
    path = write_graph_model(arch, "a", tmp_path / "drop.gguf", drop=kinds(arch, tmp_path)[kind])
    p = subprocess.run([str(oracle.FIT_PARAMS), "-m", str(path), "-fitp", "on"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode != 0, (kind, p.stdout[-500:], p.stderr[-1500:])


@pytest.mark.parametrize("arch", ["kimi-linear", "kimi-k3"])
def test_the_engine_crashes_on_kimis_older_mla_form(arch: str, tmp_path: Path) -> None:
    """kimi-linear's and kimi-k3's loaders take a block's attn_kv_b in place of attn_k_b and attn_v_b (an older
    conversion), and the pinned llama.cpp then crashes building the graph: moeconf refuses the file saying so and
    advises reconverting, not measuring it with llama-fit-params (archs/common.py `older_mla`)."""
    if not oracle.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    from tests.graph_oracle import estimate_line
    from tests.test_required_tensors import _mla_older_form

    path = _mla_older_form(arch, tmp_path)
    est = estimate_line(load_inventory(path), "-c 4096 -ngl 999")
    assert not est.complete and "crashes building the graph" in " ".join(est.notes), est.notes
    p = subprocess.run([str(oracle.FIT_PARAMS), "-m", str(path), "-fitp", "on"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode < 0, (p.returncode, p.stderr[-1500:])  # killed by a signal (SIGSEGV)


def test_ik_stops_on_granitemoes_shared_expert(tmp_path: Path) -> None:
    """ik_llama.cpp's granitemoe loader creates no shared expert (IK_ARCH_TENSORS): the tiny set b, which has one
    (Granite-4.0's form on llama.cpp), stops ik ("wrong number of tensors"), and moeconf refuses it on ik, where it
    once gave complete figures; set a, without, loads there and is not refused."""
    from moeconf.model.required import ik_load_refusals
    from tests.engine.harness import IK, run_engine

    if not IK.available():
        pytest.fail(f"ik_llama.cpp is not built: run scripts/build-engines.sh (looked for {IK.cli})")
    for dims, refused in (("a", False), ("b", True)):
        path = write_graph_model("granitemoe", dims, tmp_path / f"{dims}.gguf")
        assert bool(ik_load_refusals(load_inventory(path))) is refused
        run = run_engine(IK, path, ["-ngl", "0", "--dry-run"])
        assert (run.returncode != 0 and "wrong number of tensors" in run.log) is refused, run.log[-2000:]
