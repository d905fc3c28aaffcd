"""llama.cpp's own memory projection, with no GPU: `llama-fit-params -fitp on` prints, for any
command line, each device's model, context (KV) and compute MiB, without allocating or reading
weights (shared/memory-facts.md section 3). RPC servers on 127.0.0.1 stand in for GPUs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moeconf.fixtures.layouts import ModelLayout
from moeconf.fixtures.writer import write_layout
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.engine.harness import CACHE
from tests.engine.shards import shard_path

FIT_PARAMS = CACHE / "llama-cpp-python-0.3.36" / "build" / "bin" / "llama-fit-params"

MiB = 1024 * 1024

_ROW = re.compile(r"^(\S+) (\d+) (\d+) (\d+) *$")
# `|   - RPC0 (127.0.0.1:50101) | 24105 = 24105 + (22085 = 18712 +    3072 +     300) + ... |`
# `|   - Host                   |                    206 =   166 +       0 +      40                |`
_BREAKDOWN = re.compile(
    r"\|\s+- (?P<name>[^|(]+?)(?: \((?P<ep>[^)]*)\))?\s+\|[^|]*?(?P<self>\d+) = +(?P<model>\d+) \+ +(?P<ctx>\d+) \+ +"
    r"(?P<compute>\d+)"
)
_FREE = re.compile(r"\|\s+- RPC\d+ \(([^)]*)\)\s+\|\s+\d+ = (\d+) \+ \(")
_COMPUTE = re.compile(r"sched_reserve: +(\S+) compute buffer size = +([\d.]+) MiB")


@dataclass(frozen=True)
class Projection:
    """Per buffer type (`RPC0[127.0.0.1:PORT]`, `CPU` for every host buffer summed): MiB as the
    engine prints them (floored), and compute to 0.01 MiB from its reserve log."""

    model: dict[str, int]
    context: dict[str, int]
    compute: dict[str, int]
    compute_exact: dict[str, float]
    log: str
    free: dict[str, int] = dataclasses.field(default_factory=dict)  # MiB the device reports free

    def total(self, device: str) -> float:
        """Model + context + compute in MiB (compute to 0.01 MiB)."""
        return self.model.get(device, 0) + self.context.get(device, 0) + self.compute_exact.get(
            device, float(self.compute.get(device, 0)))


def available() -> bool:
    return FIT_PARAMS.is_file()


def fit_print(model: Path, args: Sequence[str], *, tries: int = 3) -> subprocess.CompletedProcess[str]:
    """`llama-fit-params -fitp on -v`: a run whose log holds all it printed (the breakdown is its last line)."""
    argv = [str(FIT_PARAMS), "-m", str(model), "-fitp", "on", "-v", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    for run in range(tries):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            # a failed run logs its reason at the error level (` E `), or ggml's abort prints it (unlogged); a log
            # that lost it runs again (below)
            if run + 1 < tries and not any(" E " in line or "GGML_ASSERT" in line for line in p.stderr.splitlines()):
                continue
            raise RuntimeError(f"llama-fit-params failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-3000:]}")
        printed = {m.group(1) for m in map(_ROW.match, p.stdout.splitlines()) if m}
        if not printed:
            raise RuntimeError(f"no projection printed: {p.stdout[-2000:]}")
        # the breakdown comes through the engine's log, the rows on stdout through printf. The log is written by a
        # thread of a logger the engine leaks on purpose at exit (common/log.cpp, common_log_main), so the lines after
        # its last flush can be lost when the machine is busy (session 33's CI: GLM-5's host row, twice in a row;
        # session 34's: every row of a Qwen3 line). The log keeps its order, so a breakdown that has every device
        # stdout names has the reserve lines before it too; one that lacks a device runs again, and after `tries`
        # runs is an error, never a row of zeros
        if printed <= {m.group("name").strip() for m in _BREAKDOWN.finditer(p.stderr)}:
            break
    else:
        raise RuntimeError(f"llama-fit-params' breakdown lacks a device of {sorted(printed)} in {tries} runs: "
                           f"{' '.join(argv)}\n{p.stderr[-3000:]}")
    return p


def load_failure(model: Path, expect: str, args: Sequence[str] = (), *, tries: int = 3
                 ) -> subprocess.CompletedProcess[str]:
    """`llama-fit-params -fitp on` on a file its loader refuses: the run whose log holds `expect`, the engine's
    message. The failure is the engine's and the same each run; the log's last lines are not (`fit_print`), so a
    failed run whose log lacks the message runs again, up to `tries` runs (the last reaches the caller's check)."""
    argv = [str(FIT_PARAMS), "-m", str(model), "-fitp", "on", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    for _ in range(tries):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
        if p.returncode == 0 or expect in p.stderr:
            break
    return p


def project(model: Path, args: Sequence[str], endpoints: Sequence[str] = (), *, tries: int = 3) -> Projection:
    p = fit_print(model, args, tries=tries)
    names = {f"RPC{i}": f"RPC0[{ep}]" for i, ep in enumerate(endpoints)}
    model_mib: dict[str, int] = {}
    ctx_mib: dict[str, int] = {}
    comp_mib: dict[str, int] = {}
    # the breakdown counts every host buffer (CPU_REPACK too); the stdout `Host` row does not
    for m in _BREAKDOWN.finditer(p.stderr):
        name = m.group("name").strip()
        if m.group("ep"):
            key = f"RPC0[{m.group('ep')}]"
        elif name.startswith("RPC"):
            key = names.get(name, name)
        else:
            key = "CPU"
        model_mib[key] = model_mib.get(key, 0) + int(m.group("model"))
        ctx_mib[key] = ctx_mib.get(key, 0) + int(m.group("ctx"))
        comp_mib[key] = comp_mib.get(key, 0) + int(m.group("compute"))
    free: dict[str, int] = {}
    for m in _FREE.finditer(p.stderr):
        free[f"RPC0[{m.group(1)}]"] = int(m.group(2))
    exact: dict[str, float] = {}
    for m in _COMPUTE.finditer(p.stderr):
        key = m.group(1)
        key = "CPU" if not key.startswith("RPC") else key
        exact[key] = exact.get(key, 0.0) + float(m.group(2))
    return Projection(model_mib, ctx_mib, comp_mib, exact, p.stderr, free)


def llama_fit(model: Path, args: Sequence[str], targets_mib: Sequence[int]) -> list[str]:
    """llama.cpp's own fit (`llama-fit-params` without -fitp): the arguments it would add
    (`-c -ngl [-ts] [-ot]`), aiming to leave `targets_mib` free on each device (-fitt)."""
    import shlex

    argv = [str(FIT_PARAMS), "-m", str(model), *args, "-fitt", ",".join(str(t) for t in targets_mib)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"llama-fit-params fit failed ({p.returncode}): {p.stderr[-3000:]}")
    return shlex.split(p.stdout.strip().splitlines()[-1])


def write_sparse(folder: Path, layouts: Mapping[str, ModelLayout]) -> dict[str, tuple[Path, Inventory]]:
    """Each layout as a sparse full-size GGUF in `folder` (`KEY.gguf`), with its inventory."""
    out = {}
    for key, layout in layouts.items():
        path = folder / f"{key}.gguf"
        write_layout(layout, path)
        out[key] = (path, load_inventory(path))
    return out


def save_results(env_var: str, rows: Sequence[object], *, sharded: bool = True) -> None:
    """The suite's rows as JSON where `env_var` says (the docs/ tables are rendered from them), a shard of
    it in a pytest-xdist worker (tests/engine/shards.py) unless one module alone writes the file."""
    target = os.environ.get(env_var)
    if rows and target:
        (shard_path(target) if sharded else Path(target)).write_text(json.dumps(rows, indent=1) + "\n")
