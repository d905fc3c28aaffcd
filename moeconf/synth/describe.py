"""What each `-ot` item means, in the plan's words, read off what it matches in the simulation.

`describe_items` simulates the items against the inventory (first match wins, as the engines do)
and names, for each item, the tensors it decides: whole layers (`layers 0-10`), groups of layers
(`experts of layers 11-60`), tensor kinds (`ffn_up_exps of layer 7`) and tensors outside the
blocks (`output`). Tensors an item takes that were on its device anyway are named apart: they
are how a carve-out keeps them from the items after it. Nothing here reads the plan's rules, so
the description is of the regex as the engine will read it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from moeconf.engines.simulate import OverrideItem, simulate
from moeconf.model.inventory import Inventory, Tensor, format_ranges

_GROUP_WORDS = {"attn": "attention", "shexp": "shared experts", "embd": "embeddings", "norm": "norms",
                "router": "routers", "dense": "dense FFN", "ssm": "SSM tensors", "other": "other tensors"}


def _layers(values: Sequence[int]) -> str:
    vs = sorted(set(values))
    return ("layer " if len(vs) == 1 else "layers ") + format_ranges(vs)


def describe_tensors(inv: Inventory, chosen: Sequence[Tensor], created: Mapping[str, bool]) -> str:
    """`chosen` in words: whole layers first, then groups and kinds by layer, then globals."""
    if not chosen:
        return "nothing"
    names = {t.name for t in chosen}
    by_layer: dict[int, list[Tensor]] = defaultdict(list)
    for t in inv.tensors:
        if t.layer is not None and created[t.name]:
            by_layer[t.layer].append(t)
    whole = sorted(x for x, ts in by_layer.items() if all(t.name in names for t in ts))
    whole_set = set(whole)
    parts: list[str] = []
    if whole:
        parts.append(_layers(whole))
    rest = [t for t in chosen if t.layer is not None and t.layer not in whole_set]
    # per group: the layers where every created tensor of the group is chosen
    group_layers: dict[str, set[int]] = defaultdict(set)
    partial: list[Tensor] = []
    for g in sorted({t.group for t in rest}):
        in_group = [t for t in rest if t.group == g]
        for layer in sorted({t.layer for t in in_group if t.layer is not None}):
            members = [t for t in by_layer[layer] if t.group == g]
            picked = [t for t in in_group if t.layer == layer]
            if len(picked) == len(members):
                group_layers[g].add(layer)
            else:
                partial.extend(picked)
    for gname, ls in group_layers.items():
        parts.append(f"{_GROUP_WORDS.get(gname, gname)} of {_layers(sorted(ls))}")
    kind_layers: dict[str, set[int]] = defaultdict(set)
    for t in partial:
        assert t.layer is not None
        kind = t.name[len(f"blk.{t.layer}."):]
        kind = kind.rsplit(".", 1)[0] if kind.endswith((".weight", ".bias")) and kind.count(".") == 1 and \
            not any(o.name.startswith(f"blk.{t.layer}.{kind.rsplit('.', 1)[0]}.") and o.name not in names
                    for o in by_layer[t.layer]) else kind
        kind_layers[kind].add(t.layer)
    for k, ls in sorted(kind_layers.items()):
        parts.append(f"{k} of {_layers(sorted(ls))}")
    globals_ = sorted({t.base if t.name.rsplit(".", 1)[0] == t.base else t.name
                       for t in chosen if t.layer is None})
    parts.extend(globals_)
    return ", ".join(parts)


def describe_items(inv: Inventory, items: Sequence[OverrideItem], defaults: Mapping[str, str | None]) -> list[str]:
    """One phrase per item: what it moves to its device, and what it keeps there."""
    sim = simulate(inv, items, defaults)
    created = {t.name: defaults.get(t.name) is not None for t in inv.tensors}
    moved: list[list[Tensor]] = [[] for _ in items]
    kept: list[list[Tensor]] = [[] for _ in items]
    for t in inv.tensors:
        k = sim.matched_by.get(t.name)
        if k is None:
            continue
        (kept if defaults.get(t.name) == items[k].device else moved)[k].append(t)
    out = []
    for it, mv, kp in zip(items, moved, kept, strict=True):
        words = []
        if mv:
            words.append(describe_tensors(inv, mv, created))
        if kp:
            words.append(f"{describe_tensors(inv, kp, created)} stay on {it.device} (taken before the items after it)")
        out.append("; ".join(words) if words else "nothing")
    return out
