"""`moeconf machine`'s text: the machine's figures with their sources, what is missing and the flag
that gives it; and the card table as docs/speed.md shows it."""

from __future__ import annotations

from moeconf.machine import Machine, machine_assumptions, missing_lines
from moeconf.machine_cards import CARDS
from moeconf.textsafe import safe
from moeconf.units import GIB


def render_machine(machine: Machine) -> str:
    lines = []
    if not machine.gpus:
        lines.append("GPUs: none (nvidia-smi reports none; --gpu-model or --gpus names them)")
    for g in machine.gpus:
        card = f" ({g.family}, compute {g.compute})" if g.card else ""
        lines.append(f"{g.device}: {g.name or 'unknown card'}{card}")
    h = machine.host
    if h.cpu_model or h.ram_total or h.ram:
        parts = [p for p in (h.cpu_model, f"{h.ram_total.value / GIB:,.0f} GiB RAM" if h.ram_total else None,
                             h.ram) if p]
        lines.append("host: " + ", ".join(parts))
    lines += [f"assumed: {a}" for a in machine_assumptions(machine)]
    lines += [f"note: {n}" for n in machine.notes]
    miss = missing_lines(machine)
    lines += [f"missing: {m}" for m in miss]
    if not miss:
        lines.append("nothing missing: a speed prediction has every figure it reads")
    return "".join(safe(line) + "\n" for line in lines)


def render_cards() -> str:
    """The card table in Markdown (docs/speed.md carries exactly this; a test checks it)."""
    out = ["| card | memory | family (compute) | GB/s | PCIe | dense TFLOP/s | what | source |",
           "| --- | ---: | --- | ---: | --- | ---: | --- | --- |"]
    for c in CARDS:
        src = f"[{'vendor' if c.first_hand else 'vendor, derived'}]({c.source})"
        if c.checked:
            src += f", [checked]({c.checked})"
        out.append(f"| {c.key} | {c.memory_gb:g} GB | {c.family} ({c.compute}) | {c.memory_bandwidth:,g} | "
                   f"{c.pcie_gen}.0 x{c.pcie_lanes} | {c.matrix_tflops:g} | {c.matrix_kind} | {src} |")
    return "\n".join(out) + "\n"
