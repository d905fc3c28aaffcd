"""The recorded engine graphs (tests/data/graphs/, which the default suite holds moeconf's graph to)
must be what the pinned llama.cpp reserves now: tests/engine/graphdump.cpp dumps every model of
moeconf.fixtures.graphmodels under every recorded line again and names what changed."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.engine import oracle
from tests.engine.graphdump import DATA, compile_tool, file_name, main, record_all, stale
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


def test_one_architecture_recorded_alone(tool: Path, tmp_path: Path) -> None:
    # `--arch dbrx` on a copy of the recorded folder with dbrx's files damaged: one changed, one missing,
    # one no longer dumped; dbrx's dumps come back as recorded, every other file is never rewritten
    folder = tmp_path / "graphs"
    shutil.copytree(DATA, folder)
    (folder / file_name("dbrx", "b", "ngl2")).write_bytes(gzip.compress(b'{"nodes": []}'))
    (folder / file_name("dbrx", "a", "rpc")).unlink()
    (folder / file_name("dbrx", "a", "expscpu32k")).write_bytes(b"")
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if not p.name.startswith("dbrx-")}
    assert main(["--arch", "dbrx", "--out", str(folder)], tool=tool) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in DATA.iterdir())
    for name in (p.name for p in folder.glob("dbrx-*")):
        assert json.loads(gzip.decompress((folder / name).read_bytes())) == \
            json.loads(gzip.decompress((DATA / name).read_bytes())), f"{name}: stale (python -m tests.engine.graphdump)"
    assert json.loads((folder / "index.json").read_text()) == json.loads((DATA / "index.json").read_text())
    after = {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if not p.name.startswith("dbrx-")}
    assert after == {**before, "index.json": after["index.json"]}
    assert all((folder / n).read_bytes() == (DATA / n).read_bytes() for n in before if n != "index.json")


def test_fused_probes_are_the_pinned_engines() -> None:
    """moeconf's fused-op probes (memory/graph/model.FUSED_PROBES) are the ones the pinned llama_context runs after
    flash attention's, in its order: resolve_fused_ops resolves a group only where its auto_* flag is set, and the
    pinned constructor sets auto_fgdn (the fused gated delta net) and auto_flid (the lightning indexer) false, so
    neither is probed or turned off; a build that turns one on would show here."""
    import re

    from moeconf.memory.graph.model import FUSED_PROBES
    from tests.engine.graphdump import TREE

    src = (TREE / "src" / "llama-context.cpp").read_text()
    probe = r"llm_fused_op_probe (llm_fused_op_\w+_probe) = \{\s*/\*\.op\s*=\*/ LLM_FUSED_OP_(\w+),"
    ops = dict(re.findall(probe, src))
    flags: dict[str, str] = {}  # each flag's first assignment: the constructor's (resolve_fused_ops clears them after)
    for flag, value in re.findall(r"^\s*cparams\.(auto_\w+)\s*=\s*(true|false);", src, re.M):
        flags.setdefault(flag, value)
    body = src[src.index("void llama_context::resolve_fused_ops"):]
    body = body[:body.index("\n}\n")]
    probed: list[str] = []
    for flag, block in re.findall(r"if \(cparams\.(auto_\w+)\) \{(.*?)\n    \}", body, re.S):
        if flag == "auto_fa":
            continue
        assert flags.get(flag) in ("true", "false"), f"{flag} is not set to a constant in the constructor"
        if flags[flag] == "true":
            probed += [ops[p] for p in re.findall(r"resolve\((llm_fused_op_\w+_probe),", block)]
    assert {"GDN_AR", "GDN_CH", "LIGHTNING_INDEXER"} <= set(ops.values()), ops
    assert tuple(probed) == FUSED_PROBES, (probed, flags)
