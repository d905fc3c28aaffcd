"""The architectures the engine's graph models (moeconf/memory/graph, support.MODELLED) against
`llama-fit-params -fitp on` live: sparse full-size layouts of real configs (tests/graph_real.py),
RPC servers on 127.0.0.1 as GPUs, weights and KV within 1 MiB, compute within max(3%, 16 MiB).
The same lines are recorded in tests/data/graph_real_oracle.json for the default suite."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import DeviceMemory
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers
from tests.graph_real import EXTRA, REAL, write_extra_real, write_real

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
ROWS = json.loads((Path(__file__).parent.parent / "data" / "graph_real_oracle.json").read_text())["rows"]
CASES = [(r["model"], r["args"]) for r in ROWS if r["model"] in REAL or r["model"] in EXTRA]


@pytest.fixture(scope="module")
def endpoints() -> object:
    if not oracle.available():
        pytest.skip("llama-fit-params not built")
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


@pytest.mark.parametrize(("key", "line"), CASES, ids=[f"{k}:{x}" for k, x in CASES])
def test_graph_memory_against_fit_params(endpoints: list[str], tmp_path_factory: pytest.TempPathFactory, key: str,
                                         line: str) -> None:
    folder = tmp_path_factory.getbasetemp() / "graph-real"
    folder.mkdir(exist_ok=True)
    path = folder / f"{key}.gguf"
    if not path.exists():
        (write_extra_real if key in EXTRA else write_real)(key, path)
    inv = load_inventory(path)
    words = shlex.split(line)
    n = 2 if "2rpc" in words else 1
    args = ["--rpc", ",".join(endpoints[:n]), "-fit", "off", *[w for w in words if w != "2rpc"]]
    proj = oracle.project(path, args, endpoints[:n])
    eng = engine("llama.cpp")
    est = estimate_explained(explain(inv, eng, args, gpus=[]), read_settings(args, eng))
    assert est.complete, est.notes
    bad = []
    for dev in set(proj.model) | set(proj.compute_exact):
        m = est.devices.get(dev) or DeviceMemory(dev)  # a device the engine lists empty
        if not -1 <= m.weights / MiB - proj.model.get(dev, 0) < 2:
            bad.append(f"{dev} weights {m.weights / MiB:.0f} vs {proj.model.get(dev, 0)}")
        if not -1 <= m.kv / MiB - proj.context.get(dev, 0) < 2:
            bad.append(f"{dev} KV {m.kv / MiB:.0f} vs {proj.context.get(dev, 0)}")
        theirs = proj.compute_exact.get(dev, 0.0)
        if abs(m.compute / MiB - theirs) > max(16.0, 0.03 * theirs):
            bad.append(f"{dev} compute {m.compute / MiB:.2f} vs {theirs}")
    assert bad == []
