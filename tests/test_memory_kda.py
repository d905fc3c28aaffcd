"""Kimi-Linear (`kimi-linear`): the MLA latent cache on the attention layers, the KDA state per
sequence on the others, and compute by the engine's graph (memory/graph/archs/kimi_linear.py),
held to the figures llama.cpp's own projection (`llama-fit-params -fitp on`, RPC devices) printed
for the sparse full-size layout of Kimi-Linear-48B-A3B (tests/data/kda_memory_oracle.json; the
engine suite re-measures them: tests/engine/test_memory_oracle.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory import recurrent as rec
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.recorded_memory import device_name, estimate_line, rpc_args
from tests.recorded_memory import mismatches as recorded_mismatches

DATA = Path(__file__).resolve().parent / "data" / "kda_memory_oracle.json"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
MiB = 1024 * 1024
RECORDED = json.loads(DATA.read_text())
EPS: list[str] = RECORDED["endpoints"]
LINES = sorted({r["args"] for r in RECORDED["rows"]})
KEY = "kimi-linear-48b-a3b"


@pytest.fixture(scope="module")
def inv(tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    path = tmp_path_factory.mktemp("kda") / f"{KEY}.gguf"
    write_layout(LAYOUTS[KEY], path)
    return load_inventory(path)


def _args(line: str) -> list[str]:
    return rpc_args(line, EPS)


def _estimate(inv: Inventory, line: str) -> MemoryEstimate:
    return estimate_line(inv, _args(line))


def _device(name: str) -> str:
    return device_name(name, EPS)


def mismatches(est: MemoryEstimate, rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return recorded_mismatches(est, rows, EPS)


def _rows(line: str) -> list[dict[str, object]]:
    return [r for r in RECORDED["rows"] if r["args"] == line]


@pytest.mark.parametrize("line", LINES)
def test_memory_matches_the_recorded_engine_figures(inv: Inventory, line: str) -> None:
    est = _estimate(inv, line)
    assert est.complete, est.notes
    assert not mismatches(est, _rows(line))


def test_the_check_catches_a_wrong_figure(inv: Inventory) -> None:
    """The comparison itself: a recorded compute 0.1 MiB off on a replayed device, a KV 2 MiB
    off, or weights 1.5 MiB under moeconf's are reported."""
    line = "2rpc -c 32768 -ngl 999 -ts 1,12 -ot exps=CPU"
    rows = _rows(line)
    est = _estimate(inv, line)
    assert not mismatches(est, rows)
    gpu = next(r for r in rows if r["device"] == "RPC1")
    assert gpu["exact"]
    for term, delta in (("compute", 0.1), ("kv", 2), ("weights", -2)):
        wrong = {**gpu, term: float(str(gpu[term])) + delta}
        assert [b[1] for b in mismatches(est, [wrong])] == [term]


def test_the_recorded_figures_cover_the_lines_asked_for() -> None:
    assert {"-c 32768 -ngl 999", "-c 32768 -ngl 999 -ctk bf16 -ctv bf16", "-c 131072 -ngl 999 -ub 2048",
            "2rpc -c 32768 -ngl 999 -ts 1,1", "-c 32768 -ngl 999 -ot exps=CPU", "-c 32768 -ngl 999 --n-cpu-moe 12",
            "-c 32768 -ngl 14", "-c 32768 -ngl 999 -np 4"} <= set(LINES)
    replayed = {r["args"] for r in RECORDED["rows"] if r["exact"] and r["device"] != "host"}
    assert len(replayed) >= 15


def test_kv_and_state_are_the_engines(inv: Inventory) -> None:
    """The latent cache (kv_lora_rank 512 + rope 64 per cell) on the 7 MLA layers: 252 MiB at 32k
    f16, 504 MiB f32, 1,008 MiB at 128k; the KDA state F32 on the 20 KDA layers whatever -ctk/-ctv,
    42.8 MiB per sequence (three conv states of 3 x 32 x 128 and 32 x 128^2 per layer), four sets
    with -np 4 (llama-fit-params' -np)."""
    ks = rec.kda_dims(inv)
    assert ks is not None and len(rec.recurrent_layers(inv)) == 20
    state = 20 * ks.state_bytes(1)
    assert state == 20 * (3 * 3 * 4096 + 32 * 128 * 128) * 4 and round(state / MiB, 1) == 42.8
    gpu = f"RPC0[{EPS[0]}]"
    assert _estimate(inv, "-c 32768 -ngl 999").devices[gpu].kv == 252 * MiB + state
    assert _estimate(inv, "-c 32768 -ngl 999 -ctk f32 -ctv f32").devices[gpu].kv == 504 * MiB + state
    assert _estimate(inv, "-c 131072 -ngl 999").devices[gpu].kv == 1008 * MiB + state
    assert _estimate(inv, "-c 32768 -ngl 999 -np 4").devices[gpu].kv == 252 * MiB + 4 * state


def test_a_state_that_ignores_the_sequences_is_caught(inv: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    line = "-c 32768 -ngl 999 -np 4"
    assert not mismatches(_estimate(inv, line), _rows(line))
    monkeypatch.setattr(rec.RecurrentShape, "state_bytes", lambda self, n: (self.n_embd_r + self.n_embd_s) * 4)
    assert ("RPC0", "kv") in [b[:2] for b in mismatches(_estimate(inv, line), _rows(line))]


def test_empty_tensors_are_allocated_as_ggml_alloc_does(inv: Inventory) -> None:
    """The KDA layers' 0-byte GET_ROWS (no extra state rows) leave an empty free block that keeps
    the last layer's freed queries from merging with the buffer's end: the logits of a GPU whose
    first layer is an MLA layer land at 147.39 MiB (467.39 in all, as the engine prints)."""
    line = "2rpc -c 32768 -ngl 999 -ts 1,12 -ot exps=CPU"
    gpu = f"RPC0[{EPS[1]}]"
    assert round(_estimate(inv, line).devices[gpu].compute / MiB, 2) == 467.39


def test_a_file_without_the_kda_keys_is_refused(inv: Inventory) -> None:
    """Without kda.head_dim the state and the KDA activations would silently be 0."""
    md = inv.metadata
    hp = tuple(kv for kv in md.hparams if kv[0] != "kda.head_dim")
    other = dataclasses.replace(inv, metadata=dataclasses.replace(md, hparams=hp))
    est = _estimate(other, "-c 32768 -ngl 999")
    assert not est.complete and any("kda.head_dim" in n for n in est.notes)


def test_nkvo_is_refused_not_guessed(inv: Inventory) -> None:
    est = _estimate(inv, "-c 32768 -ngl 999 -nkvo")
    assert not est.complete and any("-nkvo" in n for n in est.notes)


@pytest.mark.parametrize("refused", RECORDED["refused"], ids=lambda r: r["args"])
def test_cache_types_the_engine_refuses(inv: Inventory, refused: dict[str, str]) -> None:
    """llama-fit-params failed on these lines (the engine's error is recorded): different K and V
    types on MLA, a quantized V whose block does not divide value_length 72."""
    assert _estimate(inv, refused["args"]).problems


def test_the_shipped_manifest_is_modelled() -> None:
    inv = load_inventory(EXAMPLES / f"{KEY}.manifest.json")
    assert inv.arch == "kimi-linear"
    est = _estimate(inv, "-c 32768 -ngl 999 -ot exps=CPU")
    assert est.complete and not est.notes


OLDER_REFUSED = sorted({r["args"] for r in RECORDED["refused_placements"]})


@pytest.mark.parametrize("line", OLDER_REFUSED)
def test_placements_the_older_replay_refused_are_exact(inv: Inventory, line: str) -> None:
    """A layer's attention on another device than the rest of it, the host running the last layer
    and the output: the older replay refused them (the phase model was 17-41 MiB off); the engine's
    graph gives every device's compute to 0.05 MiB."""
    est = _estimate(inv, line)
    assert est.complete, est.notes
    rows = [{**r, "exact": True} for r in RECORDED["refused_placements"] if r["args"] == line]
    assert not mismatches(est, rows)


def test_moeconf_fit_results_are_recorded_and_modelled(inv: Inventory) -> None:
    """`moeconf fit` over two GPUs splits a layer's routed experts between its GPU, the other GPU
    and the CPU; four of its results are among the recorded lines, replayed exactly."""
    fits = [line for line in LINES if "{EP" in line and "'" in line]
    assert len(fits) >= 4
    for line in fits:
        est = _estimate(inv, line)
        assert est.complete and all(r["exact"] for r in _rows(line)), line
