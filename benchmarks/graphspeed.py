"""The engine-graph memory model's speed and its results over every example manifest.

    python benchmarks/graphspeed.py save before.json   # every manifest x 4 command lines: the results
    python benchmarks/graphspeed.py check before.json  # the same, compared: any difference is printed
    python benchmarks/graphspeed.py save --wide F      # also every graph model (tiny a, b and real) of
    python benchmarks/graphspeed.py check --wide F     # each architecture, on llama.cpp and ik_llama.cpp
    python benchmarks/graphspeed.py time [MODEL...]    # CPU ms per `estimate` (least of 7), the first two lines
    python benchmarks/graphspeed.py profile MODEL      # cProfile of `estimate` on the first line

A result is the whole `estimate` (each device's weights, KV, compute; the notes) and, for every
architecture the graph composes, each device's compute buffer straight from the graph (with and
without pipeline parallelism), so that a change to the graph's mechanics shows as a difference."""

from __future__ import annotations

import cProfile
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LINES = [
    "-ngl 999 -c 32768 -ot exps=CPU",
    "-ngl 999 -c 32768 --rpc 127.0.0.1:50052,127.0.0.1:50053 -ts 1,1",
    "-ngl 999 -c 16384 -fa off -ctk q8_0 -ctv q8_0",
    "-ngl 12 -c 8192 -np 4 -ub 1024 --rpc 127.0.0.1:50052 -ot exps=CPU",
]
TIMED = ["qwen3-30b-a3b", "glm-5", "deepseek-v3.2", "qwen3.5-397b-a17b", "kimi-linear-48b-a3b"]


def _prepare(model: str | Path, line: str, engine: str = "llama.cpp") -> tuple[Any, Any]:
    import moeconf
    from moeconf.engines import ik, mainline
    from moeconf.engines.settings import read_settings
    from moeconf.model.load import load_inventory

    path = model if isinstance(model, Path) else REPO / "examples" / "models" / f"{model}.manifest.json"
    inv = load_inventory(path)
    argv = ["llama-server", *line.split()]
    e = moeconf.explain(inv, argv, engine=engine)
    return e.placement, read_settings(argv[1:], ik() if engine == "ik_llama.cpp" else mainline(),
                                      binary="llama-server")


def _result(model: str | Path, line: str, engine: str = "llama.cpp") -> dict[str, Any]:
    from moeconf.memory.estimate import estimate
    from moeconf.memory.graph.model import ARCHS, graph_compute

    out: dict[str, Any] = {}
    try:
        placement, settings = _prepare(model, line, engine)
    except Exception as err:  # a line a model refuses is a result too
        return {"error": repr(err)}
    try:
        est = estimate(placement, settings)
        out["estimate"] = est.json()
        out["complete"] = est.complete
        out["notes"] = list(est.notes)
    except Exception as err:
        out["estimate_error"] = repr(err)
    if placement.inventory.arch in ARCHS:
        for pipeline in (False, True):
            try:
                out[f"graph_pp{int(pipeline)}"] = graph_compute(placement, settings, pipeline)
            except Exception as err:
                out[f"graph_pp{int(pipeline)}"] = repr(err)
    return out


def results() -> dict[str, Any]:
    models = sorted(p.name.removesuffix(".manifest.json") for p in (REPO / "examples" / "models").glob("*.json"))
    return {f"{m} | {line}": _result(m, line) for m in models for line in LINES}


def wide_results() -> dict[str, Any]:
    """Every graph model of every architecture (tiny sets a and b, the real-config one) on both engines."""
    import tempfile

    from moeconf.fixtures.graphmodels import ARCHS, DIMS, REAL, write_graph_model, write_real_model

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            files = {d: write_graph_model(arch, d, Path(tmp) / f"{arch}-{d}.gguf") for d in DIMS}
            if arch in REAL:
                files["real"] = write_real_model(arch, Path(tmp) / f"{arch}-real.gguf")
            for name, path in files.items():
                for engine in ("llama.cpp", "ik_llama.cpp"):
                    for line in LINES:
                        out[f"{arch}-{name} | {engine} | {line}"] = _result(path, line, engine)
    return out


def time_estimate(models: list[str], runs: int = 7) -> None:
    from moeconf.memory.estimate import estimate
    from moeconf.memory.graph.model import graph_compute

    print("model: estimate on LINES[0], on LINES[1] (two devices), graph_compute on LINES[0] (CPU ms, least of 7)")
    for m in models:
        cells = []
        for line in LINES[:2]:
            placement, settings = _prepare(m, line)
            estimate(placement, settings)
            ts = []
            for _ in range(runs):  # CPU time, the least of the runs: the machine is shared
                t = time.process_time()
                estimate(placement, settings)
                ts.append(time.process_time() - t)
            cells.append(f"{min(ts) * 1000:.1f} ms")
        placement, settings = _prepare(m, LINES[0])
        ts = []
        for _ in range(runs):  # the graph alone (an architecture whose estimate takes another replay)
            t = time.process_time()
            graph_compute(placement, settings, False)
            ts.append(time.process_time() - t)
        cells.append(f"{min(ts) * 1000:.1f} ms")
        print(f"{m:24s} " + "  ".join(cells), flush=True)


def main() -> None:
    cmd = sys.argv[1]
    wide = "--wide" in sys.argv
    if wide:
        sys.argv.remove("--wide")
    if cmd == "save":
        got = {**results(), **(wide_results() if wide else {})}
        Path(sys.argv[2]).write_text(json.dumps(got, indent=1, sort_keys=True))
    elif cmd == "check":
        before = json.loads(Path(sys.argv[2]).read_text())
        now = json.loads(json.dumps({**results(), **(wide_results() if wide else {})}, sort_keys=True))
        bad = [k for k in before if before[k] != now.get(k)]
        for k in bad:
            print(f"DIFFERS {k}\n  before {before[k]}\n  now    {now.get(k)}")
        print(f"{len(before) - len(bad)} of {len(before)} results identical")
        sys.exit(1 if bad else 0)
    elif cmd == "time":
        time_estimate(sys.argv[2:] or TIMED)
    elif cmd == "profile":
        from moeconf.memory.estimate import estimate

        placement, settings = _prepare(sys.argv[2], LINES[int(sys.argv[3]) if len(sys.argv) > 3 else 0])
        estimate(placement, settings)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            estimate(placement, settings)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
