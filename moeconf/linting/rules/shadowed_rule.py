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
from moeconf.linting.rules._base import Hit, Simulation, created, item_text, matches, q, where_item

CODE = "MOE011"
NAME = "shadowed-rule"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    items = ctx.explanation.items
    by = ctx.explanation.matched_by
    names = [t.name for t in created(ctx)]
    sim = _Simulation(ctx, names)
    for k, it in enumerate(items):
        if not (it.touches and it.raw_index is not None):
            continue
        m = matches(it.pattern)
        mine = [n for n in names if m is not None and m(n)]
        takers = Counter(by[n] for n in mine if by.get(n) is not None and by[n] != k)
        if not takers:
            continue
        if it.hits:
            # catch-all first: what it takes goes where it would go anyway, and what it means to move
            # an earlier item takes elsewhere, so the item moves nothing
            own = [n for n in names if by.get(n) == k]
            if not sim.exact or any(sim.defaults.get(n) != it.device for n in own):
                continue  # (what it takes would go elsewhere without it: it does something)
            lost = [n for n in mine if by.get(n) not in (None, k) and items[by[n]].device != it.device]
            if not lost or len({by[n] for n in lost}) > 1:
                continue
            j0 = by[lost[0]]
            advice = sim.reorder_advice(k, j0)
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
            advice = ((sim.reorder_advice(k, min(diff)) if sim.exact else None) or
                      f"to send them to {it.device}, put it before {q(item_text(ctx, min(diff)))}"
                      ) if len(diff) == 1 else "as it stands it changes nothing: remove it"
            yield Hit(*where_item(ctx, k), f"{q(item_text(ctx, k))} is never used: {named}{more}, earlier, take the "
                      f"{n} it matches (to {', '.join(sorted(devices))}); {advice}")


class _Simulation(Simulation):
    """The reordering MOE011 advises, checked."""

    def reorder_advice(self, k: int, j0: int) -> str | None:
        """`k` moved just before item `j0`, checked: it then moves tensors to its device and every
        item that took a tensor still takes one. The -ot value written out where both are in one."""
        order = [j for j in range(len(self.items)) if j != k]
        order.insert(order.index(j0), k)
        devices, hits = self.run(order)
        dev = self.items[k].device
        if not any(devices[n] == dev != self.base[n] for n in self.names):
            return None
        if any(self.hits[j] and not hits[j] for j in range(len(self.items)) if j != k):
            return None
        raw = self.ctx.invocation.items()
        rk, rj = self.items[k].raw_index, self.items[j0].raw_index
        if rk is None or rj is None:
            return None
        if raw[rk].source is not raw[rj].source:
            return f"to send them to {dev}, put it before {q(item_text(self.ctx, j0))}"
        value = raw[rk].source
        in_value = [j for j in order if self.items[j].raw_index is not None
                    and raw[self.items[j].raw_index or 0].source is value]
        fixed = ",".join(raw[self.items[j].raw_index or 0].text for j in in_value)
        return f"to send them to {dev}, put it before {q(item_text(self.ctx, j0))}: -ot {q(fixed)}"
