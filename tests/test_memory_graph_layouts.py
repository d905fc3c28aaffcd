"""Every recorded real layout (tests/data/graph_oracle/, tests/graph_oracle.py) against moeconf's
estimate: where moeconf models the architecture's memory, each line within the issue's tolerance of
`llama-fit-params -fitp on` (weights and KV within 1 MiB, compute within max(3%, 16 MiB)); where the
engine refused a line, moeconf refuses it too; where moeconf does not model the architecture, it
prints no complete estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory import support
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests import graph_oracle

RECORDED = graph_oracle.recorded()
ROWS = [(key, i) for key, doc in RECORDED.items() for i in range(len(doc["rows"]))]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("graph-oracle")
    out = {}
    for key in RECORDED:
        path = Path(folder) / f"{key}.gguf"
        write_layout(LAYOUTS[key], path)
        out[key] = load_inventory(path)
    return out


def _row(key: str, i: int) -> dict[str, object]:
    rows = RECORDED[key]["rows"]
    assert isinstance(rows, list)
    row = rows[i]
    assert isinstance(row, dict)
    return row


@pytest.mark.parametrize(("key", "i"), ROWS, ids=[f"{k}:{_row(k, i)['args']}" for k, i in ROWS])
def test_recorded_layouts_within_tolerance(layouts: dict[str, Inventory], key: str, i: int) -> None:
    inv = layouts[key]
    row = _row(key, i)
    line = str(row["args"])
    est = graph_oracle.estimate_line(inv, line)
    if "refused" in row:  # the engine would not create this context: neither does moeconf
        assert est.problems or not est.complete, f"the engine refuses {line!r} ({row['refused']}); moeconf does not"
        return
    if support.unmodelled(inv, "llama.cpp"):
        assert not est.complete, f"{inv.arch}: memory printed as complete where it is not modelled"
        return
    assert est.complete, est.notes
    figures = row["engine"]
    assert isinstance(figures, dict)
    assert graph_oracle.misses(est, figures) == []


def test_a_wrong_figure_is_caught(layouts: dict[str, Inventory]) -> None:
    """The comparison itself: the engine's compute 17 MiB higher than recorded (above the 16 MiB floor on
    a small buffer), or its KV 2 MiB higher, is a miss naming the device."""
    row = _row("qwen3-30b-a3b", 0)
    figures = {d: list(v) for d, v in row["engine"].items()}  # type: ignore[union-attr]
    est = graph_oracle.estimate_line(layouts["qwen3-30b-a3b"], str(row["args"]))
    assert graph_oracle.misses(est, figures) == []
    figures["rpc0"][2] += 17 + 0.03 * figures["rpc0"][2]
    assert any(m.startswith("rpc0 compute") for m in graph_oracle.misses(est, figures))
    figures["rpc0"][2] = row["engine"]["rpc0"][2]  # type: ignore[index]
    figures["rpc0"][1] += 2
    assert any(m.startswith("rpc0 KV") for m in graph_oracle.misses(est, figures))
    del figures["host"]
    assert any(m.startswith("CPU:") for m in graph_oracle.misses(est, {"rpc0": row["engine"]["rpc0"]}))  # type: ignore[index]
