"""Holding the memory model to engine figures recorded as data (tests/data/*_memory_oracle.json):
the command line a recorded row was measured with, the estimate moeconf gives for it, and the
comparison, shared by the per-architecture tests (hybrid, Nemotron-3, Kimi-Linear; flagship, DSA,
keyed and large: figures per device as [weights, KV, compute] MiB, `errors`)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained

MiB = 1024 * 1024


TERMS = ("weights", "kv", "compute")


def rpc_line(line: str, eps: Sequence[str]) -> tuple[list[str], list[str]]:
    """A recorded line as llama-fit-params ran it, and the devices it ran on: `2rpc` / `3rpc` mean
    two / three RPC devices, `{EP0}`/`{EP1}` name them inside -ot."""
    words = shlex.split(line.replace("{EP0}", eps[0]).replace("{EP1}", eps[-1]))
    n = 3 if "3rpc" in words else 2 if "2rpc" in words else 1
    used = list(eps[:n])
    return ["--rpc", ",".join(used), "-fit", "off", *[w for w in words if w not in ("2rpc", "3rpc")]], used


def rpc_args(line: str, eps: Sequence[str]) -> list[str]:
    return rpc_line(line, eps)[0]


def estimate_line(inv: Inventory, argv: list[str]) -> MemoryEstimate:
    e = engine("llama.cpp")
    return estimate_explained(explain(inv, e, argv, gpus=[]), read_settings(argv, e))


def estimate_rpc(inv: Inventory, line: str, eps: Sequence[str]) -> tuple[MemoryEstimate, list[str]]:
    """moeconf's estimate for a recorded line, and the devices it ran on."""
    args, used = rpc_line(line, eps)
    return estimate_line(inv, args), used


def assert_recorded(inv: Inventory, line: Mapping[str, object], eps: Sequence[str]) -> None:
    """moeconf's estimate for a recorded line is complete and within `within` of each figure."""
    est, used = estimate_rpc(inv, str(line["args"]), eps)
    assert est.complete, est.notes
    assert not errors(est, line["devices"], used)  # type: ignore[arg-type]


def line_ids(figures: Iterable[Mapping[str, object]]) -> list[str]:
    """Test ids of recorded lines: `model:args`."""
    return [f"{f['model']}:{f['args']}" for f in figures]


def sparse_models(folder: Path, figures: Iterable[Mapping[str, object]],
                  write: Callable[[str, Path], object]) -> dict[str, Inventory]:
    """Each recorded line's model written by `write(key, path)` under `folder` (sparse: the header
    only), and read back."""
    out = {}
    for key in sorted({str(f["model"]) for f in figures}):
        write(key, folder / f"{key}.gguf")
        out[key] = load_inventory(folder / f"{key}.gguf")
    return out


def within(term: str, ours_mib: float, theirs: float, host: bool = False) -> bool:
    """The engine suite's tolerances: weights and KV within 1 MiB of the engine's floored MiB (two
    host buffers may each be floored), compute within max(3%, 16 MiB)."""
    if term == "compute":
        return abs(ours_mib - theirs) <= max(16.0, 0.03 * theirs)
    floors = 2 if host and term == "weights" else 1
    return 0 <= ours_mib - theirs < floors or abs(ours_mib - theirs) <= 1.0


def errors(est: MemoryEstimate, devices: Mapping[str, Sequence[float]], eps: Sequence[str],
           terms: tuple[str, ...] = TERMS) -> list[tuple[str, str, float, float]]:
    """Each (device, term) of `terms` where moeconf is outside `within` of the recorded figures
    ([weights, KV, compute] MiB per device: `host`, `rpc0`, ...)."""
    bad = []
    for name, figures in devices.items():
        m = est.devices[device_name(name, eps)]
        for term in terms:
            theirs = figures[TERMS.index(term)]
            ours = getattr(m, term) / MiB
            if not within(term, ours, theirs, host=name == "host"):
                bad.append((name, term, round(ours, 2), theirs))
    return bad


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
