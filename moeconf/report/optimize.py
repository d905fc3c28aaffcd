"""The trade-off table of `fit --optimize` (moeconf/optimize.py): per setting, the routed experts
that fit on the GPUs, each GPU's memory, the traffic that decides the speeds and the predicted
tokens/s, and which setting the goal chose."""

from __future__ import annotations

from moeconf.optimize import NotPredicted, Optimized, Row, Speed
from moeconf.speed import rounded
from moeconf.textsafe import safe
from moeconf.units import GIB as GiB
from moeconf.units import MIB as MiB


def _speed(s: Speed | NotPredicted | None, which: str) -> str:
    if not isinstance(s, Speed):
        return "-"
    value, error = (s.prompt_tps, s.prompt_error) if which == "prompt" else (s.generation_tps, s.generation_error)
    return f"{rounded(value, error)} +-{error:.0%}"


def _layers(row: Row) -> str:
    parts = []
    for _d, (whole, part) in row.expert_layers().items():
        parts.append(f"{whole}" + (f"+{part} part" if part else ""))
    return ", ".join(parts) if parts else "0"


def _mib(n: float | None) -> str:
    if n is None:
        return "-"
    return "0" if n == 0 else "<0.1" if n < MiB / 20 else f"{n / MiB:,.1f}"


def _cache(row: Row) -> str:
    k, v = row.cache_types
    return k if k == v else f"{k}/{v}"


def _setting_cache(row: Row) -> str:
    k, v = row.setting.cache_type_k, row.setting.cache_type_v
    if k is None or v is None:
        return "-"
    return k if k == v else f"{k}/{v}"


def _short(why: str) -> str:
    """A row's reason without the advice (the error after the table carries it whole)."""
    return why.removeprefix("does not fit: ").split(". What would help: ")[0]


def render_optimized(opt: Optimized) -> str:
    fitting = [r for r in opt.rows if r.result is not None]
    gpus = list(fitting[0].gpu_memory()) if fitting else []
    depth = f" at depth {opt.depth:,}" if opt.depth is not None else ""
    lines = [f"trade-off (--optimize {opt.goal}): traffic per generated token{depth}, per prompt ubatch"]
    cols = ["", "-ub", "-b", "cache", "expert layers", "experts GiB", *(f"{d} MiB" for d in gpus),
            "host MiB/token", "PCIe MiB/ubatch", "PCIe MiB/prompt tok", "prompt t/s", "gen t/s"]
    rows: list[list[str]] = []
    unfit: list[str] = []
    for i, r in enumerate(opt.rows):
        mark = "*" if i == opt.chosen else ""
        if r.result is None:
            rows.append([mark, str(r.setting.ubatch), str(r.setting.batch), _setting_cache(r), "-", "-",
                         *("-" for _ in gpus), "-", "-", "-", "-", "-"])
            unfit.append(f"{'refused' if r.refused else 'does not fit'}: {r.setting.flags()}: {_short(r.why or '')}")
            continue
        mem = r.gpu_memory()
        rows.append([mark, str(r.setting.ubatch), str(r.batch), _cache(r), _layers(r),
                     f"{r.experts_on_gpus() / GiB:.2f}", *(f"{mem[d] / MiB:,.0f}" if d in mem else "-" for d in gpus),
                     _mib(r.host_bytes_per_token), _mib(r.pcie_bytes_per_ubatch), _mib(r.pcie_bytes_per_prompt_token),
                     _speed(r.speed, "prompt"), _speed(r.speed, "generation")])
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]

    def line(values: list[str]) -> str:
        return " " + "  ".join(v.ljust(widths[i]) if i in (0, 3, 4) else v.rjust(widths[i])
                              for i, v in enumerate(values)).rstrip()

    lines.append(line(cols))
    lines += [line(row) for row in rows]
    for text in unfit:
        lines.append(f"  {text}")
    # why the traffic or speed columns are empty: one line per distinct reason, with the settings it is for
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in fitting:
        if r.traffic_why:
            reasons.setdefault(("traffic and t/s not given", r.traffic_why), []).append(r.setting.flags())
        elif isinstance(r.speed, NotPredicted):
            reasons.setdefault(("prompt and gen t/s not predicted", r.speed.why), []).append(r.setting.flags())
    for (what, why), which in reasons.items():
        scope = "" if len(which) == len(fitting) else f" for {'; '.join(which)}"
        lines.append(f"  {what}{scope}: {why}")
    lines.extend(f"  note: {n}" for n in opt.notes)
    if opt.chosen is not None:
        lines.append(f"  * chosen: {opt.rows[opt.chosen].setting.flags()}, by {opt.rule}")
    return "\n".join(safe(x) for x in lines) + "\n"
