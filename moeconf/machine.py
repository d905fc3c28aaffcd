"""The machine a command runs on, as the speed predictor needs it (issue 26, item 2).

A `Machine` holds what moves a command's bytes: each GPU's memory bandwidth, PCIe link and matrix
rate, the host's memory bandwidth and cores. Every figure carries where it came from (a card
table row and its source, what the machine itself reported, a flag, a plan's `[machine]`), so a
prediction can print its assumptions; a figure nothing gave is None, and `missing()` names it so
that the user is asked for it instead of given a number from a guess.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from moeconf.engines import HOST
from moeconf.errors import MoeconfError
from moeconf.machine_args import FIELDS as FIELDS  # re-exported
from moeconf.machine_args import add_machine_arguments as add_machine_arguments  # re-exported
from moeconf.machine_args import machine_flags_given as machine_flags_given  # re-exported

if TYPE_CHECKING:
    from moeconf.machine_detect import RamKind, SmiGPU


@dataclass(frozen=True)
class Figure:
    """One number and where it came from."""

    value: float
    source: str  # "table: <row> (<url>)", "nvidia-smi", "/proc/cpuinfo", "--host-bandwidth", "plan [machine]", ...

    def json(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


@dataclass(frozen=True)
class GPU:
    """One GPU as the predictor reads it (the device name is the engine's, CUDA0 ...)."""

    device: str
    name: str | None = None  # the card's model, as a table row names it
    memory_bandwidth: Figure | None = None  # bytes/s, the card's peak
    pcie_bandwidth: Figure | None = None  # bytes/s one way, from PCIe generation x lanes
    matrix_flops: Figure | None = None  # dense FP16 tensor FLOP/s, the card's peak
    # added with the card table (moeconf/machine_cards.py): the table row, architecture, CUDA compute
    # capability (or AMD gfx target), what matrix_flops counts, and the PCIe link in words
    card: str | None = None
    family: str | None = None
    compute: str | None = None
    matrix_kind: str | None = None
    pcie_link: str | None = None  # "PCIe 4.0 x16"

    def missing(self) -> list[str]:
        need = (("memory_bandwidth", self.memory_bandwidth), ("pcie_bandwidth", self.pcie_bandwidth),
                ("matrix_flops", self.matrix_flops))
        return [f"{self.device}: {what}" for what, fig in need if fig is None]

    def json(self) -> dict[str, Any]:
        def fig(f: Figure | None) -> dict[str, Any] | None:
            return None if f is None else f.json()
        return {"device": self.device, "name": self.name, "memory_bandwidth": fig(self.memory_bandwidth),
                "pcie_bandwidth": fig(self.pcie_bandwidth), "matrix_flops": fig(self.matrix_flops),
                "card": self.card, "family": self.family, "compute": self.compute, "matrix_kind": self.matrix_kind,
                "pcie_link": self.pcie_link}


@dataclass(frozen=True)
class Host:
    """The CPU side: system RAM's bandwidth and the cores the engine's threads run on."""

    memory_bandwidth: Figure | None = None  # bytes/s
    cores: Figure | None = None  # physical cores
    ram: str | None = None  # "DDR5-6000x2" where given or read
    ram_total: Figure | None = None  # bytes of system RAM (/proc/meminfo)
    cpu_model: str | None = None

    def missing(self) -> list[str]:
        need = (("memory_bandwidth", self.memory_bandwidth), ("cores", self.cores))
        return [f"host: {what}" for what, fig in need if fig is None]

    def json(self) -> dict[str, Any]:
        return {"memory_bandwidth": None if self.memory_bandwidth is None else self.memory_bandwidth.json(),
                "cores": None if self.cores is None else self.cores.json(), "ram": self.ram,
                "ram_total": None if self.ram_total is None else self.ram_total.json(), "cpu_model": self.cpu_model}


@dataclass(frozen=True)
class Machine:
    gpus: tuple[GPU, ...] = ()
    host: Host = field(default_factory=Host)
    notes: tuple[str, ...] = ()  # what detection could not decide, and why (shown with the figures)

    def gpu(self, device: str) -> GPU | None:
        return next((g for g in self.gpus if g.device == device), None)

    def missing(self, devices: tuple[str, ...] | None = None) -> list[str]:
        """What a prediction over `devices` (every GPU when None) lacks, as 'DEVICE: figure'."""
        out = self.host.missing()
        for g in self.gpus:
            if devices is None or g.device in devices:
                out += g.missing()
        return out

    def json(self) -> dict[str, Any]:
        return {"gpus": [g.json() for g in self.gpus], "host": self.host.json(), "notes": list(self.notes),
                "missing": self.missing()}

    def empty(self) -> bool:
        """True when nothing gave any figure (no flag, plan or detection)."""
        return not self.gpus_given() and all(
            f is None for f in (self.host.memory_bandwidth, self.host.cores, self.host.ram_total))

    def gpus_given(self) -> bool:
        return any(g.name or g.memory_bandwidth or g.pcie_bandwidth or g.matrix_flops for g in self.gpus)



# ---- values: the forms flags and a plan's [machine] take ----------------------------------------

class MachineValueError(MoeconfError, ValueError):
    """A machine value that is not of its form; the message names the flag or plan key and the form."""


# one direction of a PCIe lane, bytes/s: the transfer rate less the line code (8b/10b up to gen 2,
# 128b/130b for gens 3-5, gen 6's FLIT mode 242/256 of 64 GT/s)
PCIE_LANE_BYTES = {1: 2.5e9 * 8 / 10 / 8, 2: 5e9 * 8 / 10 / 8, 3: 8e9 * 128 / 130 / 8, 4: 16e9 * 128 / 130 / 8,
                   5: 32e9 * 128 / 130 / 8, 6: 64e9 * 242 / 256 / 8}
PCIE_LANES = (1, 2, 4, 8, 16)
# DDR speeds moeconf takes (MT/s), per kind: the JEDEC grades and the overclocking kits around them
DDR_SPEEDS = {"DDR3": (800, 3200), "DDR4": (1600, 6000), "DDR5": (3200, 12800)}
MAX_CHANNELS = 24

BANDWIDTH_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B)\s*(/\s*s)?\s*$"
PCIE_PATTERN = r"^\s*([Gg][Ee][Nn]\s*)?[1-6](\.0)?\s*([xX]\s*[0-9]+)?\s*$"
RAM_PATTERN = r"^\s*[Dd][Dd][Rr][345]\s*-\s*[0-9]+\s*[xX]\s*[0-9]+\s*$"

_UNITS = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_bandwidth(text: str) -> float:
    """'90GB/s', '1.5 TB/s', '900 GiB/s' -> bytes/s (GB = 10^9, GiB = 2^30)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?)B\s*(?:/\s*s)?\s*", text)
    if m is None:
        raise MachineValueError(f"{text!r} is not a bandwidth: give e.g. 90GB/s, 1.5TB/s or 900GiB/s")
    v = float(m.group(1)) * _UNITS[m.group(2)]
    if not 1e6 <= v <= 1e15:
        raise MachineValueError(f"{text!r} is not a memory or link bandwidth (1 MB/s to 1,000 TB/s)")
    return v


def parse_pcie(text: str) -> tuple[int, int | None]:
    """'4x16', '4.0x8', 'gen5', '5' -> (generation, lanes or None)."""
    m = re.fullmatch(r"\s*(?:gen\s*)?([0-9]+)(?:\.0)?\s*(?:x\s*([0-9]+))?\s*", text, re.I)
    if m is None or int(m.group(1)) not in PCIE_LANE_BYTES:
        raise MachineValueError(f"{text!r} is not a PCIe link: give GEN[xLANES], e.g. 4x16, 5x8 or 4 "
                                f"(generations 1 to 6)")
    lanes = int(m.group(2)) if m.group(2) else None
    if lanes is not None and lanes not in PCIE_LANES:
        raise MachineValueError(f"{text!r}: a PCIe link has 1, 2, 4, 8 or 16 lanes")
    return int(m.group(1)), lanes


def pcie_bytes(gen: int, lanes: int) -> float:
    return PCIE_LANE_BYTES[gen] * lanes


def parse_ram(text: str) -> tuple[str, int, int]:
    """'DDR5-6000x2' -> ('DDR5', 6000, 2): kind, MT/s, 64-bit channels."""
    m = re.fullmatch(r"\s*(DDR[345])\s*-\s*([0-9]+)\s*x\s*([0-9]+)\s*", text, re.I)
    if m is None:
        raise MachineValueError(f"{text!r} is not a RAM configuration: give KIND-SPEEDxCHANNELS, e.g. DDR5-6000x2 "
                                "(DDR3, DDR4, DDR5; MT/s; 64-bit channels populated, not modules)")
    kind, speed, channels = m.group(1).upper(), int(m.group(2)), int(m.group(3))
    lo, hi = DDR_SPEEDS[kind]
    if not lo <= speed <= hi:
        raise MachineValueError(f"{text!r}: {kind} runs at {lo} to {hi} MT/s")
    if not 1 <= channels <= MAX_CHANNELS:
        raise MachineValueError(f"{text!r}: 1 to {MAX_CHANNELS} channels")
    return kind, speed, channels


def ram_bandwidth(speed_mts: int, channels: int) -> float:
    """Peak bytes/s: 8 bytes per channel per transfer (a 64-bit channel; DDR5's two 32-bit
    subchannels make one such channel)."""
    return speed_mts * 1e6 * 8 * channels


def parse_tflops(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*", text)
    if m is None or not 0.1 <= float(m.group(1)) <= 100_000:
        raise MachineValueError(f"{text!r} is not a matrix rate: give dense FP16 TFLOP/s, e.g. 330")
    return float(m.group(1)) * 1e12


def parse_cores(value: str | int) -> int:
    text = str(value)
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or not 1 <= int(text) <= 4096:
        raise MachineValueError(f"{text!r} is not a number of physical cores (1 to 4096)")
    return int(text)


# ---- the flags, a plan's [machine], detection: merged ---------------------------------------------

# what gives each figure a prediction may lack
GIVEN_BY = {"memory_bandwidth": "--gpu-model (a card of the table) or --gpu-bandwidth",
            "pcie_bandwidth": "--pcie GEN[xLANES] (or --gpu-model)",
            "matrix_flops": "--gpu-model (a card of the table) or --gpu-tflops",
            "host: memory_bandwidth": "--ram-speed DDR5-6000x2, --host-bandwidth 90GB/s or --probe-ram",
            "host: cores": "--cores N"}


@dataclass(frozen=True)
class _Given:
    """One layer's values (flags or the plan), each with the name an error and a source show."""

    values: dict[str, Any]
    name: Callable[[str], str]  # field -> "--gpu-model" / "plan.toml:12:1 [machine] gpu_model"
    source: Callable[[str], str]  # field -> the figure's source


def _per_gpu(given: _Given, key: str, devices: tuple[str, ...]) -> list[str | None]:
    v = given.values.get(key)
    if v is None or v == "" or v == []:
        return [None] * len(devices)
    items: list[str | None] = ([str(x) for x in v] if isinstance(v, list | tuple)
                               else [x.strip() for x in str(v).split(",")])
    if any(not x for x in items):
        raise MachineValueError(f"{given.name(key)}: an empty item in {v!r}")
    if len(items) == 1:
        return items * len(devices)
    if len(items) != len(devices):
        raise MachineValueError(f"{given.name(key)}: {len(items)} values for {len(devices)} GPU(s) "
                                f"({', '.join(devices) or 'none'}): give one for all, or one per GPU in order")
    return items


def _values(args_or_fields: argparse.Namespace | dict[str, Any] | None) -> dict[str, Any]:
    if args_or_fields is None:
        return {}
    if isinstance(args_or_fields, dict):
        return dict(args_or_fields)
    return {k: getattr(args_or_fields, k, None) for k in (*FIELDS, "probe_ram", "no_detect")}


def _check(given: _Given, key: str, parse: Callable[[str], Any], text: str) -> Any:
    try:
        return parse(text)
    except MachineValueError as e:
        raise MachineValueError(f"{given.name(key)}: {e}") from None


def machine_from(args_or_fields: argparse.Namespace | dict[str, Any] | None, devices: tuple[str, ...],
                 plan_machine: dict[str, Any] | None = None, *, plan_where: Callable[[str], str] | None = None,
                 detect: Detected | None = None) -> Machine:
    """The machine for a command over `devices` (its GPUs' buffer names, CUDA0 ...; CPU is left out):
    flags over the plan's `[machine]` over what this machine reports over the card table. Each
    figure keeps its source; one nothing gives stays None (`Machine.missing`). `plan_where(key)`
    names a plan key's place (file:line:col) in errors. `detect` replaces this machine's own
    reports (tests; `Detected.none()` for none); --no-detect or `detect = false` in the plan reads
    nothing. Raises MachineValueError naming the flag or plan key of a value that is not of its
    form, or of a card the table does not have."""
    flags = _Given(_values(args_or_fields), lambda k: FIELDS[k][0] if k in FIELDS else f"--{k.replace('_', '-')}",
                   lambda k: FIELDS[k][0] if k in FIELDS else f"--{k.replace('_', '-')}")
    where = plan_where or (lambda k: f"[machine] {k}")
    plan = _Given(dict(plan_machine or {}), where, lambda k: f"plan [machine] {k}")
    gpus_dev = tuple(d for d in devices if d.upper() != HOST)
    no_detect = bool(flags.values.get("no_detect")) or plan.values.get("detect") is False
    if detect is None:
        detect = Detected.none() if no_detect else Detected.here(want_gpus=bool(gpus_dev))
    elif no_detect:
        detect = Detected.none()
    if not gpus_dev:
        for key in ("gpu_model", "gpu_bandwidth", "gpu_tflops", "pcie"):
            if flags.values.get(key) not in (None, "", []):
                raise MachineValueError(f"{flags.name(key)}: the command uses no GPU (devices: "
                                        f"{', '.join(devices) or 'none'})")
    notes = list(detect.notes)
    smi = _cuda_cards(detect, gpus_dev, notes)
    gpus = tuple(_gpu(dev, i, flags, plan, smi.get(dev), gpus_dev, notes) for i, dev in enumerate(gpus_dev))
    host = _host(flags, plan, detect)
    return Machine(gpus, host, tuple(notes))


def _gpu(dev: str, i: int, flags: _Given, plan: _Given, smi: SmiGPU | None, devs: tuple[str, ...],
         notes: list[str]) -> GPU:
    from moeconf.machine_cards import CardUnknown, find_card

    card = None
    model_src = None
    for layer in (flags, plan):
        name = _per_gpu(layer, "gpu_model", devs)[i]
        if name is not None:
            try:
                card = find_card(name)
            except CardUnknown as e:
                raise MachineValueError(f"{layer.name('gpu_model')}: {e}; give --gpu-bandwidth, --gpu-tflops and "
                                        "--pcie for a card it has not") from None
            model_src = layer.source("gpu_model")
            break
    if card is None and smi is not None:
        try:
            card = find_card(smi.name, smi.memory_mib)
            model_src = "nvidia-smi"
        except CardUnknown as e:
            notes.append(f"{dev}: {e}: give --gpu-bandwidth and --gpu-tflops (or --gpu-model)")
    table = f"table: {card.key} named by {model_src} ({card.source})" if card is not None else ""

    def figure(key: str, parse: Callable[[str], float], from_card: float | None) -> Figure | None:
        for layer in (flags, plan):
            text = _per_gpu(layer, key, devs)[i]
            if text is not None:
                return Figure(_check(layer, key, parse, text), layer.source(key))
        return Figure(from_card, table) if from_card is not None else None

    bw = figure("gpu_bandwidth", parse_bandwidth, card.memory_bandwidth * 1e9 if card else None)
    tf = figure("gpu_tflops", parse_tflops, card.matrix_tflops * 1e12 if card else None)
    # the link: generation and lanes each from the first layer that gives them
    gen: tuple[int, str] | None = None
    lanes: tuple[int, str] | None = None
    for layer in (flags, plan):
        text = _per_gpu(layer, "pcie", devs)[i]
        if text is not None:
            g, n = _check(layer, "pcie", parse_pcie, text)
            gen = gen or (g, layer.source("pcie"))
            if n is not None:
                lanes = lanes or (n, layer.source("pcie"))
    if smi is not None:
        if gen is None and smi.pcie_gen is not None:
            gen = (smi.pcie_gen, "nvidia-smi")
        if lanes is None and smi.pcie_lanes is not None:
            lanes = (smi.pcie_lanes, "nvidia-smi")
    if card is not None:
        gen = gen or (card.pcie_gen, table)
        lanes = lanes or (card.pcie_lanes, table)
    pcie = link = None
    if gen is not None and lanes is not None:
        src = gen[1] if gen[1] == lanes[1] else f"{gen[1]} (generation), {lanes[1]} (lanes)"
        pcie = Figure(pcie_bytes(gen[0], lanes[0]), src)
        link = f"PCIe {gen[0]}.0 x{lanes[0]}"
    name = card.key if card is not None else (smi.name if smi is not None else None)
    return GPU(dev, name, bw, pcie, tf, card=card.key if card else None, family=card.family if card else None,
               compute=card.compute if card else None, matrix_kind=card.matrix_kind if card else None,
               pcie_link=link)


def _host(flags: _Given, plan: _Given, detect: Detected) -> Host:
    bw: Figure | None = None
    ram: str | None = None
    if flags.values.get("host_bandwidth") and flags.values.get("ram_speed"):
        raise MachineValueError("--host-bandwidth and --ram-speed both give the RAM's bandwidth: give one")
    if flags.values.get("probe_ram") and (flags.values.get("host_bandwidth") or flags.values.get("ram_speed")):
        raise MachineValueError("--probe-ram measures what --host-bandwidth or --ram-speed gives: give one")
    if plan.values.get("host_bandwidth") and plan.values.get("ram_speed"):
        raise MachineValueError(f"{plan.name('host_bandwidth')}: and ram_speed both give the RAM's bandwidth: "
                                "give one")
    for layer in (flags, plan):
        if bw is not None:
            break
        if layer.values.get("host_bandwidth"):
            bw = Figure(_check(layer, "host_bandwidth", parse_bandwidth, str(layer.values["host_bandwidth"])),
                        layer.source("host_bandwidth"))
        elif layer.values.get("ram_speed"):
            kind, speed, channels = _check(layer, "ram_speed", parse_ram, str(layer.values["ram_speed"]))
            ram = f"{kind}-{speed}x{channels}"
            bw = Figure(ram_bandwidth(speed, channels), f"{layer.source('ram_speed')} {ram}: {speed} MT/s x 8 bytes x "
                        f"{channels} channel(s), peak")
        elif layer is flags and layer.values.get("probe_ram"):
            from moeconf.machine_detect import probe_host_bandwidth

            value, how = probe_host_bandwidth()
            bw = Figure(value, how)
    rk = detect.ram_kind
    if bw is None and rk is not None and rk.channels is not None:
        ram = f"{rk.kind}-{rk.speed_mts}x{rk.channels}"
        bw = Figure(ram_bandwidth(rk.speed_mts, rk.channels), f"dmidecode {ram}: {rk.speed_mts} MT/s x 8 bytes x "
                    f"{rk.channels} channel(s), peak")
    elif ram is None and detect.ram_kind is not None:
        ram = f"{detect.ram_kind.kind}-{detect.ram_kind.speed_mts}"
    cores: Figure | None = None
    for layer in (flags, plan):
        v = layer.values.get("cores")
        if v not in (None, ""):
            cores = Figure(float(_check(layer, "cores", parse_cores, str(v))), layer.source("cores"))
            break
    if cores is None and detect.cores is not None:
        cores = Figure(float(detect.cores[0]), detect.cores[1])
    total = Figure(float(detect.ram_total), "/proc/meminfo") if detect.ram_total is not None else None
    return Host(bw, cores, ram=ram, ram_total=total, cpu_model=detect.cpu_model)


def _cuda_cards(detect: Detected, devices: tuple[str, ...], notes: list[str]) -> dict[str, SmiGPU]:
    """nvidia-smi's GPUs as the engine's CUDA devices. nvidia-smi lists them in PCI bus order; CUDA
    numbers the fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES picks
    and renumbers them: where that leaves which card is CUDA0 open, none is taken."""
    if detect.gpus is None:
        return {}
    cards = list(detect.gpus)
    visible = detect.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [x.strip() for x in visible.split(",") if x.strip()]
        if not all(re.fullmatch(r"[0-9]+", x) for x in items):
            notes.append("CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG instance: nvidia-smi's cards are not matched "
                         "to CUDA0...; give --gpu-model")
            return {}
        picked = [cards[int(x)] for x in items if int(x) < len(cards)]
        if len(picked) != len(items):
            notes.append(f"CUDA_VISIBLE_DEVICES={visible} names GPUs nvidia-smi does not list: none taken")
            return {}
        cards = picked
    if len({c.name for c in cards}) > 1 and detect.env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        notes.append("the GPUs differ and CUDA numbers the fastest first (nvidia-smi lists them by PCI bus): which "
                     "is CUDA0 is not known here; give --gpu-model in CUDA's order, or set "
                     "CUDA_DEVICE_ORDER=PCI_BUS_ID")
        return {}
    out = {f"CUDA{i}": c for i, c in enumerate(cards)}
    for d in devices:
        if d.startswith("CUDA") and d not in out:
            notes.append(f"{d}: nvidia-smi lists {len(cards)} GPU(s)")
    return out


@dataclass(frozen=True)
class Detected:
    """What the machine reported: nvidia-smi's GPUs (None: no nvidia-smi, or it failed), physical
    cores with where from, RAM bytes, dmidecode's RAM kind, the CPU model, the CUDA environment, and
    notes on what could not be read."""

    gpus: tuple[SmiGPU, ...] | None = None
    cores: tuple[int, str] | None = None
    ram_total: int | None = None
    ram_kind: RamKind | None = None
    cpu_model: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @staticmethod
    def none() -> Detected:
        return Detected()

    @staticmethod
    def here(want_gpus: bool = True) -> Detected:
        from moeconf.machine_detect import detect_cores, detect_gpus, detect_ram_kind, parse_meminfo, read

        notes = []
        gpus = detect_gpus() if want_gpus else None
        if want_gpus and gpus is None:
            notes.append("no NVIDIA GPU reported: nvidia-smi is absent, failed or printed something else")
        n, where, model = detect_cores()
        meminfo = read("/proc/meminfo")
        ram_kind = detect_ram_kind()
        if ram_kind is None:
            notes.append("the RAM's kind, speed and channels are not readable here (dmidecode -t memory needs root)")
        elif ram_kind.channels is None:
            notes.append(f"dmidecode gives {ram_kind.kind}-{ram_kind.speed_mts} on {ram_kind.modules} module(s) but "
                         "not the channels they fill")
        env = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER") if k in os.environ}
        return Detected(tuple(gpus) if gpus is not None else None, (n, where) if n is not None else None,
                        parse_meminfo(meminfo) if meminfo is not None else None, ram_kind, model, env, tuple(notes))


# ---- for a reader -------------------------------------------------------------------------------

def number(v: float) -> str:
    """A machine figure as given: whole numbers with separators, else up to three significant digits
    (the machine report and the speed's assumptions print figures alike)."""
    return f"{v:,.0f}" if v >= 100 or v == int(v) else f"{v:.3g}"


def _rate(v: float, unit: str) -> str:
    return f"{number(v / (1e9 if unit == 'GB/s' else 1e12))} {unit}"


def _short(source: str) -> str:
    """A source without its URL (the JSON keeps it): `table: RTX 4090 named by nvidia-smi`."""
    return re.sub(r" \(https?://[^)]*\)", "", source)


def _figures(items: list[tuple[str, Figure]]) -> str:
    sources = {_short(f.source) for _, f in items}
    if len(sources) == 1:
        return ", ".join(text for text, _ in items) + f" ({sources.pop()})"
    return ", ".join(f"{text} ({_short(f.source)})" for text, f in items)


def machine_assumptions(machine: Machine) -> list[str]:
    """The machine's figures as `assumed:` lines (without the prefix), each with its source (the
    table's URL left to the JSON); GPUs with the same figures share a line. `machine.notes` (what
    detection could not decide) are for `note:` lines beside them."""
    lines: dict[str, list[str]] = {}
    for g in machine.gpus:
        items: list[tuple[str, Figure]] = []
        if g.memory_bandwidth:
            items.append((f"memory {_rate(g.memory_bandwidth.value, 'GB/s')}", g.memory_bandwidth))
        if g.pcie_bandwidth:
            items.append((f"{g.pcie_link} {_rate(g.pcie_bandwidth.value, 'GB/s')} each way", g.pcie_bandwidth))
        if g.matrix_flops:
            items.append((f"{g.matrix_kind or 'dense FP16 tensor'} {_rate(g.matrix_flops.value, 'TFLOP/s')}",
                          g.matrix_flops))
        if items:
            text = (f"{g.name}: " if g.name else "") + _figures(items)
            lines.setdefault(text, []).append(g.device)
    out = [f"{', '.join(devs)} {text}" for text, devs in lines.items()]
    h = machine.host
    items = []
    if h.memory_bandwidth:
        items.append((f"RAM {_rate(h.memory_bandwidth.value, 'GB/s')}", h.memory_bandwidth))
    if h.cores:
        items.append((f"{h.cores.value:.0f} physical cores", h.cores))
    if items:
        out.append("host: " + _figures(items))
    return out


def given_by(item: str) -> str:
    """The flag that gives one missing figure, as `missing()` names it ('CUDA0: memory_bandwidth',
    'host: cores'); a whole card missing ('CUDA0: the card (...)') is given by --gpu-model or its figures."""
    dev, _, what = item.partition(": ")
    key = item if dev == "host" else what
    return GIVEN_BY.get(key, "--gpu-model NAME (a card of the table) or its figures")


def missing_lines(machine: Machine, devices: tuple[str, ...] | None = None) -> list[str]:
    """Each missing figure with the flag (or [machine] key) that gives it."""
    return [f"{m}: give {given_by(m)}" for m in machine.missing(devices)]
