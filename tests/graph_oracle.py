"""Each composed architecture's memory against `llama-fit-params -fitp on`, one file of recorded
figures per real layout (tests/data/graph_oracle/<layout>.json, written by
`python -m tests.engine.record_graph_oracle LAYOUT...`): the sparse full-size layout of a real model
(moeconf/fixtures/layouts*.py, LAYOUTS), RPC servers on 127.0.0.1 as GPUs, on the lines below. The
default suite holds moeconf's estimate to the recorded figures (tests/test_memory_graph_layouts.py);
the engine suite re-records them live and compares (tests/engine/test_graph_oracle_live.py).

A line is what the issue asks of every architecture: f16 and q8_0 caches at 32k, `-ub 2048` at the
model's longest context up to 128k, two devices, and the routed experts on the CPU. `2rpc` stands for
`--rpc` with both servers; the one-device lines get the first."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import DeviceMemory, MemoryEstimate
from moeconf.model.inventory import Inventory
from moeconf.sizing import estimate_explained

DATA = Path(__file__).parent / "data" / "graph_oracle"
MiB = 1024 * 1024
# the ports the recorded device names use (the live check maps its own servers onto them)
EPS = ("127.0.0.1:50052", "127.0.0.1:50053")
ENGINE = "llama.cpp 0.3.36 (llama-fit-params -fitp on, over RPC)"


def lines(inv: Inventory) -> list[str]:
    longest = min(inv.metadata.context_length or 131072, 131072)
    return ["-c 32768 -ngl 999",
            "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0",
            f"-c {longest} -ngl 999 -ub 2048",
            "2rpc -c 32768 -ngl 999 -ts 1,1",
            "-c 32768 -ngl 999 -ot exps=CPU"]


def args(line: str, eps: Sequence[str] = EPS) -> list[str]:
    words = shlex.split(line)
    n = 2 if "2rpc" in words else 1
    return ["--rpc", ",".join(eps[:n]), "-fit", "off", *[w for w in words if w != "2rpc"]]


def device(name: str, eps: Sequence[str] = EPS) -> str:
    """A recorded device name (`host`, `rpc0`, `rpc1`) as moeconf names it."""
    return "CPU" if name == "host" else f"RPC0[{eps[int(name[3:])]}]"


def recorded() -> dict[str, dict[str, object]]:
    """layout key -> its recorded file."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}


def estimate_line(inv: Inventory, line: str, eps: Sequence[str] = EPS) -> MemoryEstimate:
    a = args(line, eps)
    eng = engine("llama.cpp")
    return estimate_explained(explain(inv, eng, a, gpus=[]), read_settings(a, eng))


def misses(est: MemoryEstimate, figures: Mapping[str, Sequence[float]], eps: Sequence[str] = EPS) -> list[str]:
    """Where the estimate is outside the issue's tolerance of the engine's figures (MiB): weights and
    KV within 1 MiB (the engine prints whole MiB), compute within max(3%, 16 MiB)."""
    bad = []
    for name, (w, kv, comp) in figures.items():
        m = est.devices.get(device(name, eps)) or DeviceMemory(device(name, eps))  # a device the engine lists empty
        if not -1 <= m.weights / MiB - w < 2:
            bad.append(f"{name} weights {m.weights / MiB:.1f} MiB vs the engine's {w}")
        if not -1 <= m.kv / MiB - kv < 2:
            bad.append(f"{name} KV {m.kv / MiB:.1f} MiB vs the engine's {kv}")
        if abs(m.compute / MiB - comp) > max(16.0, 0.03 * comp):
            bad.append(f"{name} compute {m.compute / MiB:.2f} MiB vs the engine's {comp}")
    for dev, m in est.devices.items():  # a device the engine does not list holds nothing
        names = {device(n, eps) for n in figures}
        if dev not in names and (m.weights or m.kv or m.compute):
            bad.append(f"{dev}: {m.weights / MiB:.1f} MiB of weights, {m.kv / MiB:.1f} KV, {m.compute / MiB:.1f} "
                       "compute where the engine lists nothing")
    return bad


def worst_compute(est: MemoryEstimate, figures: Mapping[str, Sequence[float]], eps: Sequence[str] = EPS) -> float:
    """The largest compute difference over the devices (MiB, signed: positive is over the engine)."""
    diffs = [((est.devices.get(device(n, eps)) or DeviceMemory(device(n, eps))).compute / MiB - c)
             for n, (_, _, c) in figures.items()]
    return max(diffs, key=abs, default=0.0)
