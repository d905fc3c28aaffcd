"""llama-server's output reservation measured by tests/engine/outputs.cpp, compiled against the
pinned llama.cpp build: a model loaded with no_alloc (nothing allocated, as llama-fit-params),
the context created as llama-server creates it (n_outputs_max from the engine's own
common_speculative_get_output_limits), each device's model, context and compute bytes printed.

`python -m tests.engine.outputs_probe` measures the lines of tests/test_memory_outputs.py (LINES)
and writes tests/data/server_outputs_oracle.json, which the default suite holds the memory model to
(tests/test_memory_outputs.py) and the engine suite re-measures (tests/engine/test_server_outputs.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path

from tests.engine.harness import MAINLINE, compile_against_mainline
from tests.test_memory_outputs import EXACT

SRC = Path(__file__).parent / "outputs.cpp"


def compile_probe(out: Path) -> Path:
    """The probe built at `out` (a C++ compiler is needed: the engine suite builds the engines)."""
    return compile_against_mainline(SRC, out)


@functools.lru_cache(maxsize=1)
def shared_probe() -> Path:
    """The probe, compiled once per test session (into a temporary folder)."""
    return compile_probe(Path(tempfile.mkdtemp(prefix="moeconf-outputs-probe-")) / "outputs")


def server_totals(model: Path, args: list[str]) -> dict[str, int]:
    """Each device's model + context + compute bytes as llama-server allocates them for `args`
    (what `moeconf fit` prints is a llama-server line: its output rows are the server's)."""
    _, devices = measure(shared_probe(), model, args)
    return {d: sum(v) for d, v in devices.items()}


def measure(probe: Path, model: Path, args: list[str], mode: str = "server") -> tuple[int, dict[str, list[int]]]:
    """(n_outputs_max the context was created with, {buffer type: [model, context, compute] bytes});
    the host's as `CPU`. `mode`: "server" (llama-server's parsing and limits) or "fit-params"
    (llama-fit-params's: n_outputs_max 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    p = subprocess.run([str(probe), mode, "-m", str(model), *args], capture_output=True, text=True, timeout=300,
                       env=env, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"outputs probe failed ({p.returncode}): {' '.join(args)}\n{p.stderr[-3000:]}")
    words = [line.split() for line in p.stdout.splitlines() if line.strip()]
    outputs = int(words[0][1])
    return outputs, {("CPU" if w[0] == "Host" else w[0]): [int(x) for x in w[1:4]] for w in words[1:]}


def record() -> None:
    from moeconf.fixtures.layouts import LAYOUTS
    from tests.engine import oracle
    from tests.engine.harness import rpc_servers
    from tests.recorded_memory import rpc_args
    from tests.test_memory_outputs import DATA, LINES

    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="moeconf-outputs-") as tmp:
        probe = compile_probe(Path(tmp) / "outputs")
        models = sorted({m for m, _ in LINES})
        with rpc_servers(MAINLINE, 2) as eps:
            for key in models:
                # one sparse full-size model at a time (the RPC servers hold nothing: no_alloc)
                path, _ = oracle.write_sparse(Path(tmp), {key: LAYOUTS[key]})[key]
                for model, line in LINES:
                    if model != key:
                        continue
                    outputs, devices = measure(probe, path, rpc_args(line, eps))
                    names = {f"RPC0[{ep}]": f"rpc{i}" for i, ep in enumerate(eps)}
                    for dev, (w, kv, comp) in devices.items():
                        rows.append({"model": model, "args": line, "device": "host" if dev == "CPU" else names[dev],
                                     "outputs": outputs, "weights": w, "kv": kv, "compute": comp})
                    print(model, line, outputs, {d: round(v[2] / 2**20, 4) for d, v in devices.items()}, flush=True)
                path.unlink()
            endpoints = list(eps)
    classify(rows, endpoints)
    DATA.write_text(json.dumps({
        "source": "tests/engine/outputs.cpp (llama.cpp 0.3.36, llama-server's parsing and output limits, the model "
                  "loaded with no_alloc), RPC servers on 127.0.0.1 as devices; bytes per device: weights, context "
                  "(KV), compute; outputs: the n_outputs_max the context was created with; '2rpc' = two RPC devices",
        "endpoints": endpoints, "rows": rows}, indent=1) + "\n")


def classify(rows: list[dict[str, object]], eps: list[str]) -> None:
    """Each row's kind, as moeconf gives it today (reviewed when recorded): `exact` within 1 KiB,
    `bound` where the estimate notes the output device's figure is for the whole ubatch, else `phase`."""
    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout
    from moeconf.model.load import load_inventory
    from tests.recorded_memory import device_name
    from tests.test_memory_outputs import NOTE, server_estimate

    with tempfile.TemporaryDirectory(prefix="moeconf-outputs-") as tmp:
        for key in sorted({str(r["model"]) for r in rows}):
            write_layout(LAYOUTS[key], Path(tmp) / f"{key}.gguf")
            inv = load_inventory(Path(tmp) / f"{key}.gguf")
            for r in rows:
                if r["model"] != key:
                    continue
                dev = device_name(str(r["device"]), eps)
                est = server_estimate(inv, str(r["args"]), eps)
                ours, theirs = est.devices[dev].compute, int(str(r["compute"]))
                noted = any(NOTE.format(n=r["outputs"]) in n and dev in n for n in est.notes)
                exact = abs(ours - theirs) <= EXACT and not noted
                r["kind"] = "exact" if exact else "bound" if noted else "phase"
            (Path(tmp) / f"{key}.gguf").unlink()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--classify"]:  # the recorded rows' kinds again, after a model change
        from tests.test_memory_outputs import DATA

        data = json.loads(DATA.read_text())
        classify(data["rows"], data["endpoints"])
        DATA.write_text(json.dumps(data, indent=1) + "\n")
    else:
        record()
