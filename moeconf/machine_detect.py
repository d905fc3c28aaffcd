"""What the machine tells about itself: its NVIDIA GPUs (`nvidia-smi`), its cores (`lscpu`,
`/proc/cpuinfo`, `/sys`), its RAM (`/proc/meminfo`; the DDR kind, speed and channels only from
`dmidecode -t memory`, which needs root) and, only when asked, a short probe of the host's memory
bandwidth.

Each reader takes the text a command or file gave (so tests feed it recorded and garbled outputs)
and returns what it could read, or None: a figure the text does not give is missing, never
guessed. The runners call the commands with a short timeout; a command that is absent, fails or
hangs gives None too, never an exception.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

TIMEOUT_S = 3.0

NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max",
                    "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class SmiGPU:
    """One line of nvidia-smi's query: the card's name, memory and PCIe link (None: not given)."""

    index: int
    name: str
    memory_mib: float | None
    pcie_gen: int | None
    pcie_lanes: int | None


@dataclass(frozen=True)
class RamKind:
    """What dmidecode tells of the installed memory: kind (DDR4, DDR5), speed (MT/s), channels
    (None where the slot names do not say)."""

    kind: str
    speed_mts: int
    channels: int | None
    modules: int


def run(argv: tuple[str, ...], timeout: float = TIMEOUT_S) -> str | None:
    """A command's standard output, or None when it is absent, fails, or runs past `timeout`."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                           env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return r.stdout if r.returncode == 0 else None


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _number(text: str) -> float | None:
    """'24564', '24564 MiB', '4' -> the number; '[N/A]', '[Not Supported]', garbage -> None."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(MiB)?\s*", text)
    return float(m.group(1)) if m else None


def parse_nvidia_smi(text: str) -> list[SmiGPU] | None:
    """nvidia-smi's `--query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max
    --format=csv,noheader[,nounits]` output, one GPU a line; None when a line is not of that form
    (a garbled or foreign output is refused whole, not read in part)."""
    out: list[SmiGPU] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0] or parts[0].startswith("["):
            return None
        mem = _number(parts[1])
        gen, width = _number(parts[2]), _number(parts[3])
        if mem is None and not parts[1].startswith("["):
            return None
        gen_i = int(gen) if gen is not None and gen == int(gen) and 1 <= gen <= 7 else None
        width_i = int(width) if width is not None and width == int(width) and int(width) in (1, 2, 4, 8, 12, 16, 32) \
            else None
        if (gen is not None and gen_i is None) or (width is not None and width_i is None):
            return None
        out.append(SmiGPU(len(out), parts[0], mem, gen_i, width_i))
    return out or None


def detect_gpus() -> list[SmiGPU] | None:
    text = run(NVIDIA_SMI_QUERY)
    return None if text is None else parse_nvidia_smi(text)


def parse_meminfo(text: str) -> int | None:
    """MemTotal of /proc/meminfo, in bytes."""
    m = re.search(r"^MemTotal:\s+([0-9]+)\s+kB\s*$", text, re.M)
    return int(m.group(1)) * 1024 if m and int(m.group(1)) > 0 else None


def parse_lscpu_cores(text: str) -> int | None:
    """Physical cores from `lscpu -p=CORE,SOCKET` (lines `core,socket`, `#` comments): the distinct
    (socket, core) pairs; None when a line is not of that form."""
    pairs: set[tuple[str, str]] = set()
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"\s*([0-9]+),([0-9]*)\s*", line)
        if m is None:
            return None
        pairs.add((m.group(2), m.group(1)))
    return len(pairs) or None


def parse_cpuinfo(text: str) -> tuple[int | None, str | None]:
    """(physical cores, CPU model) from /proc/cpuinfo: distinct (physical id, core id) pairs where
    the kernel gives them (x86), else None; the first `model name`."""
    pairs: set[tuple[str, str]] = set()
    model = None
    for block in re.split(r"\n\s*\n", text):
        fields = dict((k.strip(), v.strip()) for k, _, v in
                      (ln.partition(":") for ln in block.splitlines() if ":" in ln))
        if model is None and fields.get("model name"):
            model = fields["model name"]
        if "physical id" in fields and "core id" in fields:
            pairs.add((fields["physical id"], fields["core id"]))
    return (len(pairs) or None), model


def sys_cores(root: str = "/sys/devices/system/cpu") -> int | None:
    """Physical cores from /sys: distinct (package, core) ids of the CPUs there."""
    pairs: set[tuple[str, str]] = set()
    try:
        names = os.listdir(root)
    except OSError:
        return None
    for n in names:
        if not re.fullmatch(r"cpu[0-9]+", n):
            continue
        pkg = read(os.path.join(root, n, "topology", "physical_package_id"))
        core = read(os.path.join(root, n, "topology", "core_id"))
        if pkg is None or core is None:
            continue
        pairs.add((pkg.strip(), core.strip()))
    return len(pairs) or None


def detect_cores() -> tuple[int | None, str, str | None]:
    """(physical cores, where from, CPU model)."""
    model = None
    info = read("/proc/cpuinfo")
    if info is not None:
        n, model = parse_cpuinfo(info)
        if n is not None:
            return n, "/proc/cpuinfo", model
    text = run(("lscpu", "-p=CORE,SOCKET"))
    n = parse_lscpu_cores(text) if text is not None else None
    if n is not None:
        return n, "lscpu", model
    n = sys_cores()
    return n, "/sys/devices/system/cpu", model


_CHANNEL = re.compile(r"(?:^|[^A-Za-z])(?:P(\d+)[ _]*)?(?:Controller\s*(\d+)\W*)?CHANNEL\s*([A-Z0-9]+)", re.I)


def parse_dmidecode(text: str) -> RamKind | None:
    """`dmidecode -t memory`: the populated modules' kind and configured speed (every module must
    agree), and the channels where the locators name them (`P0 CHANNEL A`,
    `Controller0-ChannelA-DIMM0`); None when no module or no agreeing kind and speed is given."""
    kinds: set[str] = set()
    speeds: set[int] = set()
    channels: set[tuple[str, str, str]] = set()
    named = True
    modules = 0
    for block in re.split(r"\n\s*\n", text):
        if "Memory Device" not in block:
            continue
        fields = dict((k.strip(), v.strip()) for k, _, v in
                      (ln.partition(":") for ln in block.splitlines() if ":" in ln))
        size = fields.get("Size", "")
        if not re.match(r"[0-9]+\s*[KMGT]B", size):
            continue  # "No Module Installed", "Unknown"
        modules += 1
        kinds.add(fields.get("Type", ""))
        m = re.fullmatch(r"([0-9]+)\s*(MT/s|MHz)", fields.get("Configured Memory Speed", "")
                         or fields.get("Configured Clock Speed", ""))
        if m is None:
            return None
        speeds.add(int(m.group(1)))
        where = f"{fields.get('Bank Locator', '')} {fields.get('Locator', '')}"
        c = _CHANNEL.search(where)
        if c is None:
            named = False
        else:
            channels.add((c.group(1) or "", c.group(2) or "", c.group(3).upper()))
    if modules == 0 or len(kinds) != 1 or len(speeds) != 1:
        return None
    kind = kinds.pop()
    if not re.fullmatch(r"DDR[345]", kind):
        return None
    return RamKind(kind, speeds.pop(), len(channels) if named and channels else None, modules)


def detect_ram_kind() -> RamKind | None:
    """dmidecode's view, where it runs (as root); otherwise None."""
    text = run(("dmidecode", "-t", "memory"))
    return None if text is None else parse_dmidecode(text)


def probe_host_bandwidth(seconds: float = 0.3, threads: int | None = None) -> tuple[float, str]:
    """A short measurement of the host's memory bandwidth: `threads` (default: the CPUs this
    process may run on) each copy their own array (64 MiB, less with many threads: 1 GiB in all)
    into another, repeatedly, for about `seconds`; the best round's read + write bytes per second.
    The copy's write-allocate reads are not counted and one process's threads rarely reach the
    controller's peak: a lower bound of the peak, which is what the figure's source says."""
    import threading
    import time

    import numpy as np

    n = threads or len(os.sched_getaffinity(0))
    n = max(1, min(n, 64))
    size = max(8 << 20, min(64 << 20, (1 << 30) // (2 * n)))  # at most 1 GiB in all
    src = [np.ones(size, dtype=np.uint8) for _ in range(n)]
    dst = [np.empty(size, dtype=np.uint8) for _ in range(n)]

    def copy(i: int) -> None:
        np.copyto(dst[i], src[i])

    best = 0.0
    end = time.perf_counter() + seconds
    rounds = 0
    while rounds < 4 or (time.perf_counter() < end and rounds < 50):
        ts = [threading.Thread(target=copy, args=(i,)) for i in range(n)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        rounds += 1
        if rounds > 1:  # the first round touches the pages
            best = max(best, 2 * size * n / dt)
    return best, (f"probe: {n} thread(s) copying {size >> 20} MiB each, the best of {rounds - 1} rounds, read + "
                  "write bytes (a lower bound of the peak)")
