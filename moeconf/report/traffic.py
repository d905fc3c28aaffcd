"""The traffic block of `explain --traffic` (moeconf/traffic.py): bytes read per device per generated
token, and bytes copied between devices per generated token and per prompt ubatch."""

from __future__ import annotations

from moeconf.engines import HOST
from moeconf.traffic import Copy, Traffic
from moeconf.units import MIB as MiB


def _mib(n: int) -> str:
    if n == 0:
        return "0"
    if n < MiB // 20:
        return "<0.1"
    return f"{n / MiB:,.1f}"


def _size(n: int) -> str:
    """Bytes in the unit that keeps a copy's figure readable (KiB, MiB, GiB)."""
    if n < MiB:
        return f"{n / 1024:,.1f} KiB"
    if n < 1024 * MiB:
        return f"{n / MiB:,.1f} MiB"
    return f"{n / (1024 * MiB):,.2f} GiB"


def _copy(c: Copy) -> str:
    parts = [f"op offload {_size(c.weights)} of {c.tensors} host weight{'s' if c.tensors != 1 else ''}"
             if c.weights else "", f"activations {_size(c.activations)}" if c.activations else "",
             f"inputs {_size(c.inputs)}" if c.inputs else ""]
    link = " over the network" if c.link == "network" else ""
    return f"    {c.src} -> {c.dst}{link}: {_size(c.total)} ({', '.join(p for p in parts if p)})"


def render_traffic(tr: Traffic) -> str:
    lines = [f"traffic (MiB) per generated token at depth {tr.depth:,} (one sequence)"]
    cols = ("device", "weights", "experts", "KV", "recurrent", "total")
    rows = [(d + (" (host)" if d == HOST else ""), _mib(r.weights), _mib(r.experts), _mib(r.kv), _mib(r.recurrent),
             _mib(r.total)) for d, r in tr.reads.items()]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines.append("  " + "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cols)))
    for r in rows:
        lines.append("  " + "  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)))
    for title, copies in ((f"  copied per generated token (PCIe {_size(tr.link_bytes(tr.token_copies, 'pcie'))}):",
                           tr.token_copies),
                          (f"  copied per prompt ubatch of {tr.n_ubatch} tokens (PCIe "
                           f"{_size(tr.link_bytes(tr.ubatch_copies, 'pcie'))}):", tr.ubatch_copies)):
        lines.append(title + ("" if copies else " nothing"))
        lines.extend(_copy(c) for c in sorted(copies, key=lambda c: -c.total))
    lines.extend(f"  assumed: {a}" for a in tr.assumptions)
    return "\n".join(lines) + "\n"
