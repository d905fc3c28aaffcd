"""The recorded engine graphs (tests/data/graphs/, which the default suite holds moeconf's graph to)
must be what the pinned llama.cpp reserves now: tests/engine/graphdump.cpp dumps every model of
moeconf.fixtures.graphmodels under every recorded line again and names what changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engine import oracle
from tests.engine.graphdump import DATA, compile_tool, record_all, stale
from tests.engine.harness import MAINLINE
from tests.enginegraph import from_dict

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MAINLINE.available() or not oracle.available():
        pytest.fail("llama.cpp build not available: run scripts/build-engines.sh")
    return compile_tool(tmp_path_factory.mktemp("graphdump") / "graphdump")


@pytest.fixture(scope="module")
def fresh(tool: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], dict[str, Any]]:
    return record_all(tool, tmp_path_factory.mktemp("graphs"))


def test_recorded_graphs_are_current(fresh: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    problems = stale(DATA, fresh)
    assert not problems, "tests/data/graphs is stale (python -m tests.engine.graphdump):\n" + "\n".join(problems)


def test_every_tensor_reference_resolves(fresh: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    # the dump places every source: a node, a leaf, or the scheduler's copy of one (never "other")
    for key, doc in fresh.items():
        g = from_dict(doc)
        refs = [r for n in g.nodes for r in (n.view_src, *n.src) if r is not None]
        refs += [r for s in g.splits for r in s.inputs]
        assert all(r.kind != "other" for r in refs), key
        assert g.splits[0].start == 0 and g.splits[-1].end == len(g.nodes), key
        assert all(a.end == b.start for a, b in zip(g.splits, g.splits[1:], strict=False)), key
        assert json.dumps(doc).count("127.0.0.1") == 0, key
