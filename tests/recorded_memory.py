"""Holding the memory model to engine figures recorded as data (tests/data/*_memory_oracle.json):
the command line a recorded row was measured with, the estimate moeconf gives for it, and the
comparison, shared by the per-architecture tests (hybrid, Nemotron-3, Kimi-Linear)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.inventory import Inventory
from moeconf.sizing import estimate_explained

MiB = 1024 * 1024


def rpc_args(line: str, eps: Sequence[str]) -> list[str]:
    """A recorded line as llama-fit-params ran it: `2rpc` means two RPC devices, `{EP0}`/`{EP1}`
    name them inside -ot."""
    words = shlex.split(line.replace("{EP0}", eps[0]).replace("{EP1}", eps[-1]))
    n = 2 if "2rpc" in words else 1
    return ["--rpc", ",".join(eps[:n]), "-fit", "off", *[w for w in words if w != "2rpc"]]


def estimate_line(inv: Inventory, argv: list[str]) -> MemoryEstimate:
    e = engine("llama.cpp")
    return estimate_explained(explain(inv, e, argv, gpus=[]), read_settings(argv, e))


def device_name(name: str, eps: Sequence[str]) -> str:
    """A recorded device (`host`, `rpc0`, `rpc1`) as moeconf names its buffer type."""
    return "CPU" if name == "host" else f"RPC0[{eps[int(name[3:])]}]"


def mismatches(est: MemoryEstimate, rows: Iterable[Mapping[str, object]],
               eps: Sequence[str]) -> list[tuple[object, ...]]:
    """Each recorded (device, term) moeconf misses: weights and KV within the engine's flooring
    (each buffer floored to whole MiB: the host's weights are two, the KV and the state two),
    compute to 0.05 MiB where recorded as replayed (`exact`), else within max(3%, 16 MiB)."""
    bad: list[tuple[object, ...]] = []
    for row in rows:
        m = est.devices[device_name(str(row["device"]), eps)]
        ours = {"weights": m.weights / MiB, "kv": m.kv / MiB, "compute": m.compute / MiB}
        for term in ("weights", "kv"):
            if not -1.0 <= ours[term] - float(str(row[term])) < 2.0:
                bad.append((row["device"], term, ours[term], row[term]))
        theirs = float(str(row["compute"]))
        tol = 0.05 if row["exact"] else max(16.0, 0.03 * theirs)
        if abs(ours["compute"] - theirs) > tol:
            bad.append((row["device"], "compute", ours["compute"], theirs))
    return bad
