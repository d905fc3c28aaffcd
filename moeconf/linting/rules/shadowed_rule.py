r"""shadowed-rule: an -ot item that matches tensors but is never the first match for any.

Why: the engine uses the first item that matches a tensor. When earlier items (or an earlier
`--cpu-moe`) take every tensor an item matches, the item does nothing. If they send those
tensors to another device, the order is backwards (write the exception first, the catch-all
last); the finding names the item that really takes them and gives the -ot reordered, checked
by simulation first. If they send them to the same device, the item is merely redundant: remove
it. An item that takes only tensors already on its device (`blk\.(1|2|3)\.=CUDA0` after
`exps=CPU` with every layer on the GPU) while an earlier catch-all takes the ones it would move
moves nothing either: the catch-all came first.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,blk\.(1|2|3)\.ffn_.*_exps=CUDA0"

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,ffn_up_exps=CPU"

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,blk\.(1|2|3)\.=CUDA0"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "blk\.[1-3]\.ffn_.*_exps=CUDA0,exps=CPU"
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import (
    QUOTE_LIMIT,
    Hit,
    Simulation,
    item_tensors,
    item_text,
    q,
    raw_items,
    simulation,
    where_item,
)

CODE = "MOE011"
NAME = "shadowed-rule"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    items = ctx.explanation.items
    by = ctx.explanation.matched_by
    sim = simulation(ctx)
    taken = item_tensors(ctx)
    values = _Values(ctx)
    for k, it in enumerate(items):
        if not (it.touches and it.raw_index is not None):
            continue
        mine = sim.matched(k)
        takers = Counter(by[n] for n in mine if by.get(n) is not None and by[n] != k)
        if not takers:
            continue
        if it.hits:
            # catch-all first: what it takes goes where it would go anyway, and what it means to move
            # an earlier item takes elsewhere, so the item moves nothing
            own = [t.name for t in taken.get(k, [])]
            if not sim.exact or any(sim.defaults.get(n) != it.device for n in own):
                continue  # (what it takes would go elsewhere without it: it does something)
            lost = [n for n in mine if by.get(n) not in (None, k) and items[by[n]].device != it.device]
            if not lost or len({by[n] for n in lost}) > 1:
                continue
            j0 = by[lost[0]]
            advice = reorder_advice(sim, values, k, j0)
            if advice is None:
                continue
            kept = it.hits
            yield Hit(*where_item(ctx, k), f"{q(item_text(ctx, k))} moves nothing: the {kept} tensor(s) it is the "
                      f"first match for are on {it.device} without it, and the {len(lost)} it matches that it would "
                      f"move are taken earlier by {q(item_text(ctx, j0))} (to {items[j0].device}); {advice}")
            continue
        devices = {items[j].device for j in takers}
        named = " and ".join(q(item_text(ctx, j)) for j, _ in takers.most_common(2))
        more = f" (and {len(takers) - 2} more)" if len(takers) > 2 else ""
        n = f"{len(mine)} tensor{'s' if len(mine) > 1 else ''}"
        if devices == {it.device}:
            yield Hit(*where_item(ctx, k), f"{q(item_text(ctx, k))} is redundant: the {n} it matches already "
                      f"{'go' if len(mine) > 1 else 'goes'} to "
                      f"{it.device} through {named}{more}; remove it")
        else:
            # one earlier item takes every tensor it would send elsewhere: it goes before that one; with
            # several, no order is advised (moving it could undo theirs): it does nothing as it stands
            diff = {by[n] for n in mine if by.get(n) is not None and items[by[n]].device != it.device}
            advice = ((reorder_advice(sim, values, k, min(diff)) if sim.exact else None) or
                      f"to send them to {it.device}, put it before {q(item_text(ctx, min(diff)))}"
                      ) if len(diff) == 1 else "as it stands it changes nothing: remove it"
            yield Hit(*where_item(ctx, k), f"{q(item_text(ctx, k))} is never used: {named}{more}, earlier, take the "
                      f"{n} it matches (to {', '.join(sorted(devices))}); {advice}")


def reorder_advice(sim: Simulation, values: _Values, k: int, j0: int) -> str | None:
    """`k` moved just before item `j0`, checked: it then moves tensors to its device and every
    item that took a tensor still takes one. The -ot value written out where both are in one."""
    changed = sim.moved_before(k, j0)
    dev = sim.items[k].device
    if not any(sim.device(n, changed) == dev != sim.base[n] for n in changed):
        return None
    if any(sim.hits[j] and not now for j, now in sim.hits_after(changed).items() if j != k):
        return None
    raw = raw_items(sim.ctx)
    rk, rj = sim.items[k].raw_index, sim.items[j0].raw_index
    if rk is None or rj is None:
        return None
    if raw[rk].source is not raw[rj].source:
        return f"to send them to {dev}, put it before {q(item_text(sim.ctx, j0))}"
    return f"to send them to {dev}, put it before {q(item_text(sim.ctx, j0))}: -ot {values.moved(k, j0)}"


class _Values:
    """Each -ot value's items (those the explanation simulates), in order, to quote one with an
    item moved without writing the whole value out for every finding."""

    def __init__(self, ctx: Context) -> None:
        assert ctx.explanation is not None
        raw = raw_items(ctx)
        self.texts: dict[int, str] = {}  # explanation item -> its raw text
        self.seqs: dict[int, list[int]] = {}  # id(value) -> its explanation items in order
        self.value_of: dict[int, int] = {}  # explanation item -> id(value)
        for j, it in enumerate(ctx.explanation.items):
            if it.raw_index is None:
                continue
            r = raw[it.raw_index]
            self.texts[j] = r.text
            self.value_of[j] = id(r.source)
            self.seqs.setdefault(id(r.source), []).append(j)
        self.pos: dict[int, int] = {j: i for seq in self.seqs.values() for i, j in enumerate(seq)}
        self.lengths = {v: sum(len(self.texts[j]) for j in seq) + len(seq) - 1 for v, seq in self.seqs.items()}

    def moved(self, k: int, j0: int) -> str:
        """q() of the value holding k and j0 with k moved just before j0."""
        v = self.value_of[k]
        seq = self.seqs[v]
        pk, pj = self.pos[k], self.pos[j0]
        ins = pj if pj < pk else pj - 1

        def at(i: int) -> str:
            if i == ins:
                return self.texts[k]
            i = i if i < ins else i - 1
            return self.texts[seq[i] if i < pk else seq[i + 1]]

        total, count = self.lengths[v], len(seq)
        if total <= QUOTE_LIMIT:
            return q(",".join(at(i) for i in range(count)))
        head: list[str] = []
        size = 0
        for i in range(count):
            if size > 60:
                break
            head.append(at(i))
            size += len(head[-1]) + 1
        tail: list[str] = []
        size = 0
        for i in range(count - 1, -1, -1):
            if size > 40:
                break
            tail.append(at(i))
            size += len(tail[-1]) + 1
        return f"'{','.join(head)[:60]}\u2026{','.join(reversed(tail))[-40:]}' ({total:,} chars)"
