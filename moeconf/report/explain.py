"""`moeconf explain` in the terminal: a layer x group map coloured by device, per-device GiB,
what each item matched, and items that matched nothing."""

from __future__ import annotations

from collections import defaultdict

from moeconf.engines import AUTO_GPU
from moeconf.explanation import Explanation
from moeconf.model.taxonomy import GROUPS
from moeconf.placement import TIED_OUTPUT
from moeconf.textsafe import safe
from moeconf.units import gib

_COLORS = ["\033[33m", "\033[32m", "\033[36m", "\033[35m", "\033[34m", "\033[31m"]
_RESET = "\033[0m"
_SHORT = {"experts": "exp", "shexp": "shx", "router": "rtr", "attn": "att", "dense": "dns", "norm": "nrm",
          "embd": "emb", "output": "out", "nextn": "nxt", "ssm": "ssm", "other": "oth"}


def _symbols(devices: list[str]) -> dict[str, str]:
    out: dict[str, str] = {"CPU": "C", AUTO_GPU: "?"}
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


def render(ex: Explanation, color: bool = False, tensors: bool = False) -> str:
    pl = ex.placement
    inv = pl.inventory
    devices = sorted({d for d in pl.devices.values() if d is not None}, key=lambda d: (d != "CPU", d))
    sym = _symbols(devices)
    palette = {d: ("" if d == "CPU" else _COLORS[i % len(_COLORS)]) for i, d in enumerate(devices)}

    def paint(dev: str | None, text: str) -> str:
        if not color or dev is None or dev == "CPU" or dev not in palette:
            return text
        return palette[dev] + text + _RESET

    lines = [f"{inv.metadata.name or inv.arch} ({inv.arch}) on {ex.invocation.engine.label}: "
             f"{len(ex.items)} override item(s)"]
    for r in ex.refusals:
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
    tied = pl.tied_output()  # h17classic: the engine's second copy of token_embd, as the output
    if glob or tied is not None:
        lines.append("global: " + ", ".join([f"{t.name} {pl.devices[t.name]}" for t in glob]
                                            + ([f"{TIED_OUTPUT} {tied}"] if tied is not None else [])))
    lines.append("")
    per = pl.bytes_by_device()
    lines.append("GiB by device: " + ", ".join(f"{d} {gib(b)}" for d, b in sorted(per.items(), key=lambda kv: kv[0])))
    if ex.items:
        lines.append("")
        lines.append("items (in the order the engine tests them):")
        for k, it in enumerate(ex.items):
            status = "matches nothing" if not it.touches else (
                f"first match for {it.hits} of {it.touches} tensors it matches")
            lines.append(f"  {k + 1:2d}. {it.pattern}={it.device}  [{it.origin}]  {status}")
    if ex.unmatched:
        lines.append("")
        lines.append("unmatched: " + ", ".join(f"{it.pattern}={it.device}" for it in ex.unmatched))
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
