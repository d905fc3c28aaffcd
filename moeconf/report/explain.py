"""`moeconf explain` in the terminal: a layer x group map coloured by device, per-device GiB,
what each item matched, and items that matched nothing."""

from __future__ import annotations

from collections import defaultdict

from moeconf.engines import AUTO_GPU, HOST
from moeconf.explanation import Explanation, ItemReport
from moeconf.linting.model import Finding
from moeconf.model.taxonomy import GROUPS
from moeconf.placement import TIED_OUTPUT
from moeconf.textsafe import safe
from moeconf.units import gib

_COLORS = ["\033[33m", "\033[32m", "\033[36m", "\033[35m", "\033[34m", "\033[31m"]
_RESET = "\033[0m"
_SHORT = {"experts": "exp", "shexp": "shx", "router": "rtr", "attn": "att", "dense": "dns", "norm": "nrm",
          "embd": "emb", "output": "out", "nextn": "nxt", "ssm": "ssm", "hc": "mhc", "other": "oth"}


def _symbols(devices: list[str]) -> dict[str, str]:
    out: dict[str, str] = {HOST: "C", AUTO_GPU: "?"}
    n = 0
    for d in devices:
        if d in out:
            continue
        digits = "".join(ch for ch in d if ch.isdigit())
        sym = digits[-1] if d.startswith(("CUDA", "ROCm", "Vulkan", "SYCL", "MUSA", "MTL")) and digits else None
        if sym is None or sym in out.values():
            sym = "ABDEFGHJKLMNPQRSTUVWXYZ"[n]
            n += 1
        out[d] = sym
    return out


# rules whose findings are the engine's refusals, which explain prints first ("error: the engine
# would refuse to start: ...")
_REFUSALS = frozenset({"invalid-regex", "slow-regex", "unknown-device", "missing-equals", "unknown-flag",
                       "flag-value-refused", "unsupported-regex-syntax"})


def _item_of(ex: Explanation, f: Finding) -> int | None:
    """The explanation item (index) a finding on the command line points into, if any."""
    if f.line != 1:
        return None
    for raw, item in enumerate(ex.invocation.items()):
        v = item.source.value
        if not v.line:
            continue
        start = v.column + item.offset
        if start <= f.column <= start + len(item.text):
            return next((k for k, it in enumerate(ex.items) if it.raw_index == raw), None)
    return None


def _word_at(ex: Explanation, f: Finding) -> str | None:
    """The command-line word a finding points at (None: the command line as a whole)."""
    if f.line != 1:
        return None
    for a in ex.invocation.args:
        if a.line and a.column <= f.column <= a.column + max(len(a.text) - 1, 0) and f.column > 1:
            return a.text
    return None


def _generated(ex: Explanation) -> list[tuple[int, int]]:
    """Runs [first, last] of consecutive items the engine adds for one flag (--cpu-moe,
    --n-cpu-moe, --n-cpu-ffn), shown as that flag rather than as items the user wrote."""
    runs: list[tuple[int, int]] = []
    for k, it in enumerate(ex.items):
        if it.raw_index is None and runs and runs[-1][1] == k - 1 and ex.items[runs[-1][0]].origin == it.origin:
            runs[-1] = (runs[-1][0], k)
        elif it.raw_index is None:
            runs.append((k, k))
    return runs


def _flag_line(ex: Explanation, first: int, last: int) -> str:
    from moeconf.model.inventory import format_ranges

    k_set = set(range(first, last + 1))
    taken = [t for t in ex.placement.inventory.tensors if ex.matched_by.get(t.name) in k_set]
    blocks = sorted({t.layer for t in taken if t.layer is not None})
    items: list[ItemReport] = list(ex.items[first:last + 1])
    device = ", ".join(sorted({it.device for it in items}))
    kinds = "the dense FFN" if items[0].origin.startswith("--n-cpu-ffn") else "the routed experts"
    what = (f"{kinds} of blocks {format_ranges(blocks)} ({len(taken)} tensors) to {device}" if taken
            else "no tensor")
    rules = f"{len(items)} rule(s) the engine adds" if len(items) > 1 else "1 rule the engine adds"
    span = f"{first + 1}-{last + 1}" if last > first else f"{first + 1}"
    return f"  {span:>2}. {items[0].origin}: {rules}, taking {what}"


def render(ex: Explanation, color: bool = False, tensors: bool = False,
           findings: tuple[Finding, ...] | list[Finding] = ()) -> str:
    pl = ex.placement
    inv = pl.inventory
    devices = sorted({d for d in pl.devices.values() if d is not None}, key=lambda d: (d != HOST, d))
    sym = _symbols(devices)
    palette = {d: ("" if d == HOST else _COLORS[i % len(_COLORS)]) for i, d in enumerate(devices)}

    def paint(dev: str | None, text: str) -> str:
        if not color or dev is None or dev == HOST or dev not in palette:
            return text
        return palette[dev] + text + _RESET

    lines = [f"{inv.metadata.name or inv.arch} ({inv.arch}) on {ex.invocation.engine.label}: "
             f"{len(ex.items)} override item(s)"]
    for r in ex.all_refusals:
        lines.append(f"error: the engine would refuse to start: {r}")
    for n in ex.notes:
        lines.append(f"note: {n}")
    legend = ", ".join(f"{sym[d]} = {d}" for d in devices)
    lines.append(f"devices: {legend}; * = mixed, - = not loaded, . = none")
    groups = [g for g in GROUPS if any(t.group == g and t.layer is not None for t in inv.tensors)]
    cells: dict[tuple[int, str], set[str | None]] = defaultdict(set)
    for t in inv.tensors:
        if t.layer is not None:
            cells[(t.layer, t.group)].add(pl.devices[t.name])
    header = " blk  kind   " + " ".join(_SHORT[g] for g in groups)
    lines.append(header)
    kinds = {layer.index: layer.kind for layer in inv.layers}
    painted: set[int] = set()  # the map rows: moeconf's own symbols and colours, nothing from a file
    for il in sorted(kinds):
        row = []
        for g in groups:
            ds = cells.get((il, g))
            if not ds:
                row.append(" . ")
            elif ds == {None}:
                row.append(" - ")
            elif len(ds) > 1:
                row.append(" * ")
            else:
                d = next(iter(ds))
                assert d is not None
                row.append(paint(d, f" {sym[d]} "))
        painted.add(len(lines))
        lines.append((f"{il:4d}  {safe(kinds[il]):5s} " + " ".join(row)).rstrip())
    glob = [t for t in inv.tensors if t.layer is None]
    tied = pl.tied_output()  # the engine's second copy of token_embd, as the output
    if glob or tied is not None:
        lines.append("global: " + ", ".join([f"{t.name} {pl.devices[t.name]}" for t in glob]
                                            + ([f"{TIED_OUTPUT} {tied}"] if tied is not None else [])))
    lines.append("")
    per = pl.bytes_by_device()
    lines.append("GiB by device: " + ", ".join(f"{d} {gib(b)}" for d, b in sorted(per.items(), key=lambda kv: kv[0])))
    on_item: dict[int, list[Finding]] = defaultdict(list)
    elsewhere: list[Finding] = []
    for f in findings:
        if f.name in _REFUSALS and ex.refusals:
            continue  # said above, as why the engine would refuse to start
        k = _item_of(ex, f)
        (on_item[k] if k is not None else elsewhere).append(f)
    if ex.items:
        lines.append("")
        lines.append("items (in the order the engine tests them):")
        runs = {first: last for first, last in _generated(ex)}
        k = 0
        while k < len(ex.items):
            if k in runs:
                lines.append(_flag_line(ex, k, runs[k]))
                k = runs[k] + 1
                continue
            it = ex.items[k]
            status = "matches nothing" if not it.touches else (
                f"first match for {it.hits} of {it.touches} tensors it matches")
            lines.append(f"  {k + 1:2d}. {it.pattern}={it.device}  [{it.origin}]  {status}")
            for f in on_item.get(k, ()):
                lines.append(f"      {f.code} {f.name} [{f.severity}] {f.message}")
            k += 1
    if ex.unmatched:
        lines.append("")
        lines.append("unmatched: " + ", ".join(f"{it.pattern}={it.device}" for it in ex.unmatched))
    if elsewhere:
        lines.append("")
        lines.append("the command line (the rules of `moeconf lint`; `moeconf rule CODE` explains each):")
        for f in elsewhere:
            word = _word_at(ex, f)
            at = f"at {word!r}: " if word is not None else ""
            lines.append(f"  {f.code} {f.name} [{f.severity}] {at}{f.message}")
    if tensors:
        lines.append("")
        width = max(len(safe(t.name)) for t in inv.tensors)
        for t in inv.tensors:
            dev = pl.devices[t.name]
            lines.append(f"{safe(t.name):{width}}  {dev or '-':8}  {pl.reasons[t.name]}")
        if tied is not None:
            lines.append(f"{TIED_OUTPUT:{width}}  {tied:8}  tied output: the engine loads token_embd again "
                         "as the output layer's tensor")
    # names, patterns, devices and notes come from files and command lines: escape what could
    # act on a terminal (the colours above are the only escape sequences moeconf writes)
    return "\n".join(line if i in painted else safe(line) for i, line in enumerate(lines)) + "\n"
