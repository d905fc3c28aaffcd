"""The per-device memory table (weights, KV cache, compute, reserve, total, budget), shared by
`explain`, `compile` and the library's text output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from moeconf.memory import HOST, MemoryEstimate
from moeconf.units import MIB as MiB


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f}"


def render_memory(est: MemoryEstimate, budgets: Mapping[str, int] | None = None, said: Sequence[str] = ()) -> str:
    """A table in MiB, one row per device (host memory as CPU), and what is estimated; `said`: the
    refusals already printed above it (a problem of the memory settings among them is not repeated)."""
    budgets = budgets or {}
    s = est.settings
    # a command the engine refuses runs nothing: the figures are for the line with the refused values at their
    # defaults, and the header says so
    head = (("memory (MiB), were the refused values their defaults, " if s.problems else "memory (MiB) ")
            + f"at -c {est.n_ctx} -ub {min(s.n_ubatch, s.n_batch)} -ctk {s.cache_type_k} "
            f"-ctv {s.cache_type_v}, flash attention {'on' if est.flash_attn else 'off'}"
            + ("" if s.offload_kqv else ", KV in host memory (-nkvo)")
            + (f", {est.swa_cells} cells on sliding-window layers" if est.swa_cells else ""))
    lines = [head]
    cols: tuple[str, ...] = ("device", "weights", "KV", "compute", "reserve", "total", "budget", "free")
    rows: list[tuple[str, ...]] = []
    for d, m in est.devices.items():
        if d == HOST or m.total:
            b = budgets.get(d)
            rows.append((d + (" (host)" if d == HOST else "") + ("*" if m.estimated else ""), _mib(m.weights),
                         _mib(m.kv) if est.complete or est.kv_known else "?", _mib(m.compute) if est.complete else "?",
                         _mib(m.reserve), _mib(m.total) if est.complete else ">=" + _mib(m.total),
                         _mib(b) if b is not None else "-",
                         (_mib(b - m.total) if est.complete else "?") if b is not None else "-"))
    if not budgets:
        cols = cols[:6]
        rows = [r[:6] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines.append("  " + "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cols)))
    for r in rows:
        lines.append("  " + "  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)))
    for d, m in est.devices.items():
        for term in m.estimated:
            # a term that says how it is estimated (ik_llama.cpp's compute, memory/ikarchs.py) is printed as is
            lines.append(f"  * {d}: {term}" if "estimated (" in term
                         else f"  * {d}: {term} (estimated: not measurable without the device)")
    if any(m.reserve for m in est.devices.values()):
        lines.append(f"  reserve: {_mib(s.reserve)} MiB per GPU for what no engine reports (CUDA context, "
                     "cuBLAS workspace): --reserve, or reserve in a plan's [budget]")
    for n in est.notes:
        if n not in said:  # a refusal printed above (a file the loader stops on)
            lines.append(f"  note: {n}")
    if est.server is not None:
        lines.extend(f"  {line}" for line in est.server.lines())
        cpu_budget = budgets.get(HOST)
        if cpu_budget is not None and est.complete:
            left = cpu_budget - est.devices[HOST].total
            cap = est.server.cap
            if left >= 0 and (cap is None or cap > left):
                lines.append(f"  warning: these may outgrow the {_mib(left)} MiB the CPU budget leaves: set "
                             "--cache-ram and --ctx-checkpoints (`moeconf fit --ram` writes them)")
    for p in est.problems:
        if p not in said:
            lines.append(f"  error: the engine would refuse to start: {p}")
    return "\n".join(lines) + "\n"
