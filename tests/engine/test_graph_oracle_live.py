"""The recorded figures of tests/data/graph_oracle/ are the engine's today: each layout written again,
each line projected again by `llama-fit-params -fitp on` over two RPC servers, equal to the record (the
default suite holds moeconf to the record: tests/test_memory_graph_layouts.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from tests import graph_oracle
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers
from tests.engine.record_graph_oracle import figures

pytestmark = pytest.mark.engine

RECORDED = graph_oracle.recorded()


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    if not oracle.available():
        pytest.fail(f"llama-fit-params is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="moeconf-graph-oracle-") as tmp:
        yield Path(tmp)


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_the_record_is_the_engines(endpoints: list[str], folder: Path, key: str) -> None:
    path = folder / f"{key}.gguf"
    write_layout(LAYOUTS[key], path)
    rows = RECORDED[key]["rows"]
    assert isinstance(rows, list)
    for row in rows:
        line = row["args"]
        if "refused" in row:
            with pytest.raises(RuntimeError, match="failed to create llama_context"):
                figures(path, line, endpoints)
            continue
        assert figures(path, line, endpoints) == row["engine"], line
