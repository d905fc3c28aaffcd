"""`moeconf inspect`: the inventory as a readable summary and as JSON
(`schemas/inventory.schema.json`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from moeconf.model.inventory import Inventory, Tensor, format_ranges
from moeconf.model.required import missing_tensors
from moeconf.model.taxonomy import GROUPS, LAYER_KINDS
from moeconf.textsafe import safe
from moeconf.units import MIB, gib


def inventory_json(inv: Inventory) -> dict[str, Any]:
    md = inv.metadata
    return {
        "arch": inv.arch,
        "name": md.name,
        "file_type": md.file_type_name,
        "block_count": inv.block_count,
        "metadata": md.as_dict(),
        "source": inv.source,
        "shards": list(inv.shards),
        "total_bytes": inv.total_bytes(),
        "layers": [{"index": layer.index, "kind": layer.kind, "recurrent": layer.recurrent} for layer in inv.layers],
        "tensors": [
            {
                "name": t.name, "type": t.type, "shape": list(t.shape), "nbytes": t.nbytes,
                "group": t.group, "role": t.role, "layer": t.layer,
            }
            for t in inv.tensors
        ],
        "unknown_tensors": list(inv.unknown_tensors),
        "missing_tensors": list(missing_tensors(inv)),
        "warnings": list(inv.warnings),
    }


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    rows = [[safe(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return out


_UNKNOWN_SHOWN = 20


def render_summary(inv: Inventory, *, list_tensors: bool = False) -> str:
    md = inv.metadata
    lines: list[str] = []
    title = md.name or (inv.source.rsplit("/", 1)[-1] if inv.source else inv.arch)
    facts = [inv.arch]
    if md.file_type_name:
        facts.append(md.file_type_name)
    lines.append(f"{title} ({', '.join(facts)})")
    files = f"{len(inv.shards)} shards" if len(inv.shards) > 1 else "1 file"
    lines.append(f"  {len(inv.tensors)} tensors, {gib(inv.total_bytes())} GiB, {files}")
    experts = []
    if md.expert_count:
        experts.append(f"{md.expert_count} routed experts, {md.expert_used_count} used per token")
    if md.expert_shared_count:
        experts.append(f"{md.expert_shared_count} shared")
    if experts:
        lines.append("  " + ", ".join(experts))
    kinds = ", ".join(
        f"{k} {format_ranges(inv.layers_of_kind(k))}" for k in LAYER_KINDS if inv.layers_of_kind(k)
    )
    lines.append(f"  {inv.block_count} blocks: {kinds}")
    lines.append("")

    by_kind: dict[str, list[Tensor]] = defaultdict(list)
    kind_of = {layer.index: layer.kind for layer in inv.layers}
    for t in inv.tensors:
        by_kind[kind_of[t.layer] if t.layer is not None else "(global)"].append(t)
    rows = [["layer kind", "layers", "tensors", "GiB"]]
    for k in (*LAYER_KINDS, "(global)"):
        ts = by_kind.get(k)
        if not ts:
            continue
        layers = format_ranges(inv.layers_of_kind(k)) if k != "(global)" else "-"  # type: ignore[arg-type]
        rows.append([k, layers, str(len(ts)), gib(inv.total_bytes(ts))])
    lines += _table(rows, {2, 3})
    lines.append("")

    by_group: dict[str, list[Tensor]] = defaultdict(list)
    for t in inv.tensors:
        by_group[t.group].append(t)
    rows = [["group", "tensors", "GiB", "layers", "types"]]
    for g in GROUPS:
        ts = by_group.get(g)
        if not ts:
            continue
        in_blocks = [t.layer for t in ts if t.layer is not None]
        layers = format_ranges(in_blocks) if in_blocks else "-"
        types = ", ".join(sorted({t.type for t in ts}))
        rows.append([g, str(len(ts)), gib(inv.total_bytes(ts)), layers, types])
    lines += _table(rows, {1, 2})
    if list_tensors:
        lines.append("")
        rows = [["tensor", "type", "shape", "MiB", "group"]]
        for t in inv.tensors:
            rows.append([t.name, t.type, "[" + ", ".join(map(str, t.shape)) + "]",
                         f"{t.nbytes / MIB:.2f}", t.group])
        lines += _table(rows, {3})
    unknown = inv.unknown_tensors
    if unknown:
        lines.append("")
        lines.append(f"unknown tensors ({len(unknown)}, no pinned engine knows them; grouped as 'other'):")
        lines += [f"  {n}" for n in unknown[:_UNKNOWN_SHOWN]]
        if len(unknown) > _UNKNOWN_SHOWN:
            lines.append(f"  ... and {len(unknown) - _UNKNOWN_SHOWN} more (--json lists all)")
    missing = missing_tensors(inv)
    if missing:
        lines.append("")
        lines.append(f"missing tensors ({len(missing)}: llama.cpp's {inv.arch} loader requires them and stops "
                     "without them, \"tensor ... not found\"):")
        lines += [f"  {n}" for n in missing[:_UNKNOWN_SHOWN]]
        if len(missing) > _UNKNOWN_SHOWN:
            lines.append(f"  ... and {len(missing) - _UNKNOWN_SHOWN} more (--json lists all)")
    if inv.warnings:
        lines.append("")
        lines += [f"warning: {w}" for w in inv.warnings]
    return "\n".join(safe(line) for line in lines) + "\n"
