"""Every block on the CPU (-ngl 0; -ngl 1: only the output layer offloaded), issue 17: one layout of
each modelled architecture against llama.cpp's own projection (`llama-fit-params -fitp on`, which
allocates nothing), one RPC server on 127.0.0.1 as the GPU. The recorded figures
(tests/data/cpu_layers_oracle.json, which tests/test_memory_cpu_layers.py holds the model to in the
default suite) are measured again, and moeconf's figures, the engine's graph's, are within tolerance
of them."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.memory import read_settings
from moeconf.memory.support import MODELLED
from moeconf.model.inventory import Inventory
from moeconf.sizing import estimate_explained
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers
from tests.engine.memory_table import _ok
from tests.test_memory_cpu_layers import ARCHS, ROWS

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
RESULTS: list[dict[str, object]] = []
# one layout per modelled architecture (the smallest header), four lines each
KEYS = sorted({min((k for k, lay in LAYOUTS.items() if lay.arch == arch), key=lambda k: len(LAYOUTS[k].key))
               for arch in ARCHS})
LINES = ("-c 32768 -ngl 0", "-c 32768 -ngl 0 -ub 1024", "-c 32768 -ngl 1", "-c 32768 -ngl 1 -ub 1024")
CASES = [(k, line) for k in KEYS for line in LINES]


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not oracle.available():
        pytest.fail(f"llama-fit-params is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    return oracle.write_sparse(tmp_path_factory.mktemp("cpu-layers"), {k: LAYOUTS[k] for k in KEYS})


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with rpc_servers(MAINLINE, 1) as eps:
        yield eps[0]


@pytest.fixture(scope="module", autouse=True)
def results_file() -> Iterator[None]:
    yield
    from tests.engine import test_memory_oracle  # beside its rows when both run

    test_memory_oracle.RESULTS.extend(RESULTS)
    oracle.save_results("MOECONF_MEMORY_RESULTS", test_memory_oracle.RESULTS)


@pytest.mark.parametrize(("model", "line"), CASES, ids=[f"{m}:{c}" for m, c in CASES])
def test_cpu_layers_against_llama_cpp(model: str, line: str, sparse: dict[str, tuple[Path, Inventory]],
                                      endpoint: str) -> None:
    path, inv = sparse[model]
    args = ["--rpc", endpoint, "-fit", "off", *shlex.split(line)]
    proj = oracle.project(path, args, [endpoint])
    names = {"CPU": "host", f"RPC0[{endpoint}]": "RPC0"}
    theirs = {names[d]: (proj.model.get(d, 0), proj.context.get(d, 0),
                         proj.compute_exact.get(d, float(proj.compute.get(d, 0))))
              for d in set(proj.model) | set(proj.compute_exact)}
    # the engine still gives the recorded figures (else measure tests/data/cpu_layers_oracle.json again);
    # an architecture whose -ngl 0/1 figures are recorded elsewhere (the graph's: DSA, KDA) is checked live only
    rec = next((r["engine"] for r in ROWS if r["model"] == model and r["args"] == line), None)
    for name, fig in theirs.items() if rec is not None else ():
        got = rec.get(name, [0, 0, 0.0])
        assert (fig[0], fig[1]) == (got[0], got[1]) and abs(fig[2] - got[2]) < 0.02, (name, fig, got)
    eng = engine("llama.cpp")
    est = estimate_explained(explain(inv, eng, args, gpus=[]), read_settings(args, eng))
    case = "host" if " -ngl 0" in f" {line}" else "gpu_output"
    assert inv.arch in MODELLED, case  # the engine's graph gives every modelled architecture's figures
    assert est.complete, est.notes
    bad = []
    for dev, m in est.devices.items():
        name = names[dev]
        ours = (m.weights / MiB, m.kv / MiB, m.compute / MiB)
        fig = theirs.get(name, (0, 0, 0.0))
        RESULTS.append({"model": inv.arch, "args": line, "device": name, "weights": [ours[0], fig[0]],
                        "kv": [ours[1], fig[1]], "compute": [ours[2], fig[2]]})
        bad += [(name, t, o, f) for t, o, f in zip(("weights", "kv", "compute"), ours, fig, strict=True)
                if not _ok(t, name, o, f)]
    assert not bad
