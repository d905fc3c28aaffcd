"""Two details of the compute buffers, held to llama.cpp's own projection. The Hadamard rotations
llama.cpp adds for a quantized K or V cache (src/llama-kv-cache.cpp `attn_rot_k`/`attn_rot_v`: a
quantized type and a head width that is a multiple of 64; src/llama-graph.cpp `build_attn`: Q and K,
V and the attention's output each multiplied by a rotation matrix, a graph input of its own per
cache); and the host running the first layers (a partial -ngl). tests/data/replay_oracle.json holds
`llama-fit-params -fitp on` figures (llama.cpp 0.3.36, RPC devices, sparse full-size layouts) per
device: model MiB, context MiB, compute MiB, recorded for the older replays and held now through the
engine's graph (memory/graph); tests/data/classic_oracle.json holds the classic MoEs'. Without the
rotations Llama 4's logits come out 83 MiB too high at -ub 2048 (Hunyuan-A13B's 72 to 289 MiB too
low, ERNIE-4.5's 37 MiB too high with -ctk q8_0 alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf.memory.cachetypes import rotation
from moeconf.memory.graph import model as graph_model
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.test_memory_classic import _errors, _estimate

DATA = Path(__file__).parent / "data" / "replay_oracle.json"
ROWS = json.loads(DATA.read_text())
MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"


@pytest.fixture(scope="module")
def models() -> dict[str, Inventory]:
    return {k: load_inventory(MODELS / f"{k}.manifest.json") for k in sorted({r["model"] for r in ROWS})}


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['model']}:{r['args']}" for r in ROWS])
def test_replayed_compute_matches_recorded_engine_figures(models: dict[str, Inventory],
                                                                 row: dict[str, object]) -> None:
    est, names = _estimate(models[str(row["model"])], str(row["args"]))
    assert est.complete, est.notes
    assert _errors(est, names, row["engine"]) == []  # type: ignore[arg-type]


def test_the_rotations_left_out_are_caught(models: dict[str, Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama 4 at -c 65536 -ub 2048 with a q8_0 cache: without the rotation nodes the output
    device's compute is 83 MiB over (1741.5 against 1658.5 MiB); the comparison refuses it."""
    line = "-c 65536 -ngl 999 -ub 2048 -ctk q8_0 -ctv q8_0"
    row = next(r for r in ROWS if r["model"] == "llama-4-maverick" and r["args"] == line)
    monkeypatch.setattr(graph_model, "_rot", lambda *a: 0)
    wrong, names = _estimate(models["llama-4-maverick"], line)
    assert any("RPC0 compute" in e for e in _errors(wrong, names, row["engine"]))


@pytest.mark.parametrize(("ctype", "head", "k", "side"), [
    ("q8_0", 128, True, 128),  # K: the largest power of two from 64 dividing the head width
    ("q4_0", 128, False, 64),  # V: always 64
    ("q8_0", 64, True, 64),
    ("q8_0", 192, True, 64),
    ("q8_0", 96, True, 0),  # not a multiple of 64: no rotation
    ("f16", 128, True, 0),  # not quantized
    ("bf16", 128, False, 0),
])
def test_rotation_side(ctype: str, head: int, k: bool, side: int) -> None:
    assert rotation(ctype, head, k) == side
