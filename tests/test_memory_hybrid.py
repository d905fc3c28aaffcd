"""The hybrid recurrent MoEs (Qwen3.5-MoE `qwen35moe`, Qwen3-Next `qwen3next`): attention KV on
the full-attention layers only, the recurrent state per sequence, and compute by the engine's graph
(memory/graph/archs/qwen35moe.py, qwen3next.py), held to figures llama.cpp's own projection
(`llama-fit-params -fitp on`, RPC devices) printed for sparse full-size layouts of the real models
(tests/data/hybrid_memory_oracle.json; the engine suite re-measures them:
tests/engine/test_memory_hybrid_oracle.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory import recurrent as rec
from moeconf.memory.graph.sched import Allocator
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.recorded_memory import estimate_line, mismatches, rpc_args

DATA = Path(__file__).resolve().parent / "data" / "hybrid_memory_oracle.json"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
MiB = 1024 * 1024
RECORDED = json.loads(DATA.read_text())
EPS: list[str] = RECORDED["endpoints"]
LINES = sorted({(r["model"], r["args"]) for r in RECORDED["rows"]})


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("hybrid")
    out = {}
    for key in sorted({m for m, _ in LINES} | {"qwen3.5-397b-a17b"}):
        path = folder / f"{key}.gguf"
        write_layout(LAYOUTS[key], path)
        out[key] = load_inventory(path)
    return out


@pytest.mark.parametrize(("model", "line"), LINES, ids=[f"{m}:{line}" for m, line in LINES])
def test_memory_matches_the_recorded_engine_figures(layouts: dict[str, Inventory], model: str, line: str) -> None:
    est = estimate_line(layouts[model], rpc_args(line, EPS))
    assert est.complete, est.notes
    assert not mismatches(est, [r for r in RECORDED["rows"] if r["model"] == model and r["args"] == line], EPS)


def test_the_recorded_figures_cover_the_lines_asked_for() -> None:
    for model in ("qwen3.5-397b-a17b", "qwen3-next-80b-a3b"):
        lines = {line for m, line in LINES if m == model}
        assert {"-c 32768 -ngl 999", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0", "-c 131072 -ngl 999 -ub 2048",
                "-c 32768 -ngl 999 -ot exps=CPU", "2rpc -c 32768 -ngl 999 -ts 1,1", "-c 32768 -ngl 999 -np 4"} <= lines


def test_qwen35_397b_kv_and_state_are_the_engines(layouts: dict[str, Inventory]) -> None:
    """The issue's figures: KV 960 MiB on the 15 attention layers at 32k plus 186 MiB of state on
    the 45 recurrent ones; 4,026 MiB at 128k; -ctk/-ctv leave the F32 state alone; -np 4 keeps the
    KV total and gives four state rows."""
    inv = layouts["qwen3.5-397b-a17b"]
    rs = rec.shape(inv)
    assert rs is not None and len(rec.recurrent_layers(inv)) == 45
    state = 45 * rs.state_bytes(1)
    assert round(state / MiB, 1) == 186.3
    gpu = f"RPC0[{EPS[0]}]"
    assert estimate_line(inv, rpc_args("-c 32768 -ngl 999", EPS)).devices[gpu].kv == 960 * MiB + state
    assert estimate_line(inv, rpc_args("-c 131072 -ngl 999", EPS)).devices[gpu].kv == 3840 * MiB + state
    q8 = estimate_line(inv, rpc_args("-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0", EPS)).devices[gpu].kv
    assert q8 == 510 * MiB + state
    assert estimate_line(inv, rpc_args("-c 32768 -ngl 999 -np 4", EPS)).devices[gpu].kv == 960 * MiB + 4 * state


def test_layer_map_from_the_interval_or_the_per_layer_array(layouts: dict[str, Inventory]) -> None:
    inv = layouts["qwen3.5-397b-a17b"]
    assert sorted(set(range(60)) - rec.recurrent_layers(inv)) == list(range(3, 60, 4))
    md = inv.metadata
    arr = tuple(0 if il % 2 else 1 for il in range(60))
    hp = (*(kv for kv in md.hparams if kv[0] != "full_attention_interval"), ("attention.recurrent_layers", arr))
    alt = dataclasses.replace(inv, metadata=dataclasses.replace(md, hparams=tuple(sorted(hp))))
    assert rec.recurrent_layers(alt) == frozenset(range(0, 60, 2))
    interval = dataclasses.replace(md, hparams=tuple((k, 3 if k == "full_attention_interval" else v)
                                                     for k, v in md.hparams))
    assert rec.recurrent_layers(dataclasses.replace(inv, metadata=interval)) == frozenset(
        il for il in range(60) if (il + 1) % 3)


def test_shipped_manifests_are_modelled() -> None:
    for name in ("qwen3.5-397b-a17b", "qwen3-next-80b-a3b"):
        inv = load_inventory(EXAMPLES / f"{name}.manifest.json")
        est = estimate_line(inv, rpc_args("-c 32768 -ngl 999 -ot exps=CPU", EPS))
        assert est.complete and not est.notes


def test_nkvo_on_a_hybrid_is_refused_not_guessed(layouts: dict[str, Inventory]) -> None:
    est = estimate_line(layouts["qwen3.5-397b-a17b"], rpc_args("-c 32768 -ngl 999 -nkvo", EPS))
    assert not est.complete
    assert any("-nkvo" in n for n in est.notes)


def test_a_key_the_loader_reads_and_moeconf_does_not_model_is_refused(layouts: dict[str, Inventory]) -> None:
    # qwen3next's loader reads pooling_type (every loader does: moeconf/engines/archkeys.py); its MTP
    # block (nextn_predict_layers) is modelled (tests/test_memory_keys.py)
    inv = layouts["qwen3-next-80b-a3b"]
    md = inv.metadata
    keys = (*(md.arch_keys or ()), "pooling_type")
    est = estimate_line(dataclasses.replace(inv, metadata=dataclasses.replace(md, arch_keys=keys)),
                        rpc_args("-c 32768 -ngl 999", EPS))
    assert not est.complete and any("qwen3next.pooling_type" in n for n in est.notes)


def test_a_cache_block_that_does_not_divide_the_head_width_is_refused(layouts: dict[str, Inventory]) -> None:
    """llama.cpp refuses q8_0 (blocks of 32) on a head width of 72 (Kimi-Linear's value_length),
    and accepts f16 there; the refusal holds for an architecture moeconf does not model."""
    inv = layouts["qwen3.5-397b-a17b"]
    md = inv.metadata
    odd = dataclasses.replace(inv, metadata=dataclasses.replace(md, value_length=72))
    assert any("does not divide the head width 72" in p
               for p in estimate_line(odd, rpc_args("-c 8192 -ngl 999 -ctk q8_0 -ctv q8_0", EPS)).problems)
    assert not estimate_line(odd, rpc_args("-c 8192 -ngl 999", EPS)).problems
    other = dataclasses.replace(odd, metadata=dataclasses.replace(odd.metadata, arch="kimi-linear"))
    est = estimate_line(other, rpc_args("-c 8192 -ngl 999 -ctk q8_0 -ctv q8_0", EPS))
    assert not est.complete and any("72" in p for p in est.problems)


def test_empty_tensors_are_allocated_as_ggml_alloc_does(layouts: dict[str, Inventory],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """ggml-alloc allocates and frees the recurrent layers' 0-byte tensors (a GET_ROWS of no extra
    state rows): a freed one where no free block touches it leaves an empty free block that changes
    later placements. Qwen3.5-35B-A3B's GPU with routed experts on the CPU is 556.19 MiB as the
    engine prints; with the empty frees left out of the allocator it comes out at 493.00 MiB."""
    line = "-c 32768 -ngl 999 -ot exps=CPU"
    inv = layouts["qwen3.5-35b-a3b"]
    gpu = f"RPC0[{EPS[0]}]"
    assert round(estimate_line(inv, rpc_args(line, EPS)).devices[gpu].compute / MiB, 2) == 556.19
    free = Allocator.free
    monkeypatch.setattr(Allocator, "free", lambda self, off, size: free(self, off, size) if size else None)
    assert round(estimate_line(inv, rpc_args(line, EPS)).devices[gpu].compute / MiB, 2) == 493.0


def test_an_empty_free_where_nothing_touches_it_inserts_an_empty_block() -> None:
    al = Allocator(32)
    a, b = al.alloc(64), al.alloc(64)
    al.free(a + 64, 0)  # the 0-byte tensor at b's start, b still allocated
    assert al.blocks[0] == [64, 0]
    al.free(a, 64)  # merges into the empty block's start
    assert al.blocks[0] == [0, 64] and b == 64


@pytest.mark.parametrize(("arch", "named"), [("glm5-next", "kda.head_dim")])
def test_unmodelled_hybrids_are_refused_naming_what_is_missing(layouts: dict[str, Inventory], arch: str,
                                                               named: str) -> None:
    inv = layouts["qwen3.5-397b-a17b"]
    other = dataclasses.replace(inv, metadata=dataclasses.replace(inv.metadata, arch=arch))
    est = estimate_line(other, rpc_args("-c 32768 -ngl 999", EPS))
    assert not est.complete
    assert any(named in n and "not modelled" in n for n in est.notes)
