"""llama-server's output reservation against the engine: tests/engine/outputs.cpp, compiled against
the pinned llama.cpp build, loads each sparse full-size layout with no_alloc (nothing allocated, as
llama-fit-params) and creates the context as llama-server does; the figures recorded in
tests/data/server_outputs_oracle.json (which the default suite holds the model to,
tests/test_memory_outputs.py) must still be what it measures. With llama-fit-params's parsing
(n_outputs_max 0) the probe gives llama-fit-params's own figures."""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.fixtures.layouts import LAYOUTS
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers
from tests.engine.outputs_probe import compile_probe, measure
from tests.recorded_memory import rpc_args
from tests.test_memory_outputs import LINES, RECORDED

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
# lines on which the probe, parsing as llama-fit-params does, must give llama-fit-params's figures
SAME_AS_FIT_PARAMS = [("qwen3-30b-a3b", "-c 32768 -ngl 999"), ("qwen3-30b-a3b", "-c 32768 -ngl 999 -ot exps=CPU"),
                      ("qwen3-30b-a3b", "2rpc -c 32768 -ngl 999 -ts 1,1"), ("gpt-oss-20b", "-c 32768 -ngl 999")]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MAINLINE.available() or not oracle.available():
        pytest.fail("llama.cpp build not available: run scripts/build-engines.sh")
    return compile_probe(tmp_path_factory.mktemp("probe") / "outputs")


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    keys = sorted({m for m, _ in LINES} | {m for m, _ in SAME_AS_FIT_PARAMS})
    written = oracle.write_sparse(tmp_path_factory.mktemp("outputs"), {k: LAYOUTS[k] for k in keys})
    return {k: path for k, (path, _) in written.items()}


@pytest.mark.parametrize(("model", "line"), LINES, ids=[f"{m}:{line}" for m, line in LINES])
def test_recorded_figures_are_the_engines(probe: Path, models: dict[str, Path], endpoints: list[str], model: str,
                                          line: str) -> None:
    outputs, devices = measure(probe, models[model], rpc_args(line, endpoints))
    names = {"host": "CPU", **{f"rpc{i}": f"RPC0[{ep}]" for i, ep in enumerate(endpoints)}}
    rows = [r for r in RECORDED["rows"] if r["model"] == model and r["args"] == line]
    assert rows
    for r in rows:
        assert outputs == r["outputs"]
        assert devices[names[str(r["device"])]] == [r["weights"], r["kv"], r["compute"]], \
            "the recorded figure no longer matches the engine (python -m tests.engine.outputs_probe records them)"


@pytest.mark.parametrize(("model", "line"), SAME_AS_FIT_PARAMS, ids=[f"{m}:{line}" for m, line in SAME_AS_FIT_PARAMS])
def test_the_probe_gives_llama_fit_params_figures(probe: Path, models: dict[str, Path], endpoints: list[str],
                                                  model: str, line: str) -> None:
    args = rpc_args(line, endpoints)
    outputs, devices = measure(probe, models[model], args, mode="fit-params")
    assert outputs == 0  # n_outputs_max 0: n_batch
    proj = oracle.project(models[model], args, endpoints[: 2 if "2rpc" in shlex.split(line) else 1])
    for dev, (w, kv, comp) in devices.items():
        # llama-fit-params prints whole MiB (floored), the compute also to 0.01 MiB in its reserve log
        assert math.isclose(comp / MiB, proj.compute_exact.get(dev, 0.0), abs_tol=0.006), dev
        assert comp // MiB == proj.compute.get(dev, 0), dev
        if dev != "CPU":  # the host's breakdown in llama-fit-params counts CPU_REPACK too
            assert (w // MiB, kv // MiB) == (proj.model.get(dev, 0), proj.context.get(dev, 0)), dev
