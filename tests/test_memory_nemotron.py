"""Nemotron-3 (`nemotron_h_moe`): attention KV on the 6 attention layers only, the Mamba-2 state
per sequence on the 23 recurrent layers, nothing on the FFN-only layers, and compute by the
engine's graph (moeconf/memory/graph/archs/nemotron_h_moe.py), held to figures llama.cpp's own
projection (`llama-fit-params -fitp on`, RPC devices) printed for the sparse full-size layout of
Nemotron-3-Nano-30B-A3B (tests/data/nemotron_memory_oracle.json; the engine suite re-measures them:
tests/engine/test_memory_nemotron.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.layouts_hybrid import NemotronLayout
from moeconf.fixtures.writer import write_layout
from moeconf.memory import recurrent as rec
from moeconf.memory.graph import model as graph_model
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.recorded_memory import estimate_line, mismatches, rpc_args

DATA = Path(__file__).resolve().parent / "data" / "nemotron_memory_oracle.json"
MiB = 1024 * 1024
RECORDED = json.loads(DATA.read_text())
EPS: list[str] = RECORDED["endpoints"]
LINES = sorted({(r["model"], r["args"]) for r in RECORDED["rows"]})
NANO = "nemotron-3-nano-30b-a3b"
SUPER = "nemotron-3-super-120b-a12b"


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("nemotron")
    out = {}
    for key in (NANO, SUPER):
        write_layout(LAYOUTS[key], folder / f"{key}.gguf")
        out[key] = load_inventory(folder / f"{key}.gguf")
    return out


@pytest.fixture(scope="module")
def nano(layouts: dict[str, Inventory]) -> Inventory:
    return layouts[NANO]


@pytest.mark.parametrize(("model", "line"), LINES, ids=[f"{m}:{line}" for m, line in LINES])
def test_memory_matches_the_recorded_engine_figures(layouts: dict[str, Inventory], model: str, line: str) -> None:
    est = estimate_line(layouts[model], rpc_args(line, EPS))
    assert est.complete, est.notes
    assert not mismatches(est, [r for r in RECORDED["rows"] if r["model"] == model and r["args"] == line], EPS)


def test_the_recorded_figures_cover_the_lines_asked_for() -> None:
    for model in (NANO, SUPER):
        assert {"-c 32768 -ngl 999", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0", "-c 131072 -ngl 999 -ub 2048",
                "-c 32768 -ngl 999 -ot exps=CPU", "-c 32768 -ngl 999 --n-cpu-moe 20", "-c 32768 -ngl 30",
                "-c 32768 -ngl 999 -np 4", "2rpc -c 32768 -ngl 40 -ts 1,1"} <= {a for m, a in LINES if m == model}
    assert all(r["exact"] for r in RECORDED["rows"])


def test_layer_map_and_state_are_the_loaders(nano: Inventory) -> None:
    """23 Mamba-2 layers (head_count_kv and feed_forward_length both 0), 6 attention layers
    (feed_forward_length 0), 23 FFN layers; the state is F32 (conv (d_conv - 1) x (d_inner + 2
    n_group d_state) + SSM d_state x d_inner) per sequence: 47.6 MiB; the KV 192 MiB at 32k
    (6 layers x 2 heads x 128, K+V f16), q8_0 102 MiB; -np 4 keeps the KV and gives four states."""
    lay = LAYOUTS[NANO]
    assert isinstance(lay, NemotronLayout)
    assert rec.recurrent_layers(nano) == frozenset(il for il in range(52) if lay.kind(il) == "recurrent")
    placement = explain(nano, engine("llama.cpp"), rpc_args("-ngl 999", EPS), gpus=[]).placement
    g, _ = graph_model.build(placement, graph_model.Setup(n_tokens=512, n_outputs=512, n_kv=4096))
    assert set(g.rs) == rec.recurrent_layers(nano)
    assert {il for il in g.kv if g.w.layer(il, "attn_q") is not None} == {
        il for il in range(52) if lay.pattern[il] == "*"}
    rs = rec.shape(nano)
    assert rs is not None and round(23 * rs.state_bytes(1) / MiB, 1) == 47.6
    gpu = f"RPC0[{EPS[0]}]"
    state = 23 * rs.state_bytes(1)
    assert estimate_line(nano, rpc_args("-c 32768 -ngl 999", EPS)).devices[gpu].kv == 192 * MiB + state
    q8 = rpc_args("-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0", EPS)
    assert estimate_line(nano, q8).devices[gpu].kv == 102 * MiB + state
    assert estimate_line(nano, rpc_args("-c 32768 -ngl 999 -np 4", EPS)).devices[gpu].kv == 192 * MiB + 4 * state


def test_a_layer_map_from_other_arrays_moves_the_state(nano: Inventory) -> None:
    """The map is read from the per-layer arrays, not from the layout: an attention layer whose
    head_count_kv reads 0 becomes a Mamba-2 layer (state, no KV)."""
    md = nano.metadata
    assert isinstance(md.head_count_kv, tuple)
    kv = tuple(0 if il == 5 else v for il, v in enumerate(md.head_count_kv))
    alt = dataclasses.replace(nano, metadata=dataclasses.replace(md, head_count_kv=kv))
    assert 5 in rec.recurrent_layers(alt) and 5 not in rec.recurrent_layers(nano)


# what the older replay was not checked on and refused: the engine's graph composes every placement and setting
# (its nodes held to the engine's dumps, tests/test_memory_graph.py), so these are estimated like any other line
GRAPH_LINES = ("-c 32768 -ngl 999 -nkvo -ot exps=CPU", "-c 32768 -ngl 30 -nkvo", "-c 32768 -ngl 999 -nkvo -fa off",
               "-c 32768 -ngl 52 -ot exps=CPU", "2rpc -c 65536 -ngl 40 -ts 1,1 -ot exps=CPU")


@pytest.mark.parametrize("line", GRAPH_LINES)
def test_what_the_older_replay_refused_is_estimated_through_the_graph(nano: Inventory, line: str) -> None:
    est = estimate_line(nano, rpc_args(line, EPS))
    assert est.complete, est.notes
    assert all(m.compute > 0 for m in est.devices.values() if m.weights)


def test_experts_that_differ_per_layer_are_refused(nano: Inventory) -> None:
    """Nemotron-3 Puzzle gives each layer its own expert width and count (per-layer arrays): the
    graph's build_moe_ffn takes one count, so such a file is refused, not estimated with the first."""
    md = nano.metadata
    hp = tuple(sorted((*(kv for kv in md.hparams if kv[0] != "expert_used_count"),
                       ("expert_used_count", tuple(4 if il % 2 else 6 for il in range(52))))))
    puzzle = dataclasses.replace(nano, metadata=dataclasses.replace(md, hparams=hp))
    est = estimate_line(puzzle, rpc_args("-ngl 999", EPS))
    assert not est.complete and any("differ per layer" in n for n in est.notes)


def test_the_latent_is_read_not_ignored(layouts: dict[str, Inventory]) -> None:
    """moe_latent_size (Nemotron-3-Super's LatentMoE) shapes the routed experts and their latent projections,
    which the graph reads from the tensors: with the routed experts on the CPU their input and output copies
    are latent-wide (the engine's 324.12 MiB)."""
    sup = layouts[SUPER]
    gpu = f"RPC0[{EPS[0]}]"
    line = "-c 32768 -ngl 999 -ot exps=CPU"
    assert round(estimate_line(sup, rpc_args(line, EPS)).devices[gpu].compute / MiB, 2) == 324.12
    assert any(t.base == "ffn_latent_down" for t in sup.tensors)
