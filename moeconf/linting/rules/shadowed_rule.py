r"""shadowed-rule: an -ot item that matches tensors but is never the first match for any.

Why: the engine uses the first item that matches a tensor. When earlier items (or an earlier
`--cpu-moe`) take every tensor an item matches, the item does nothing. If they send those
tensors to another device, the order is backwards (write the exception first, the catch-all
last); the finding names the item that really takes them. If they send them to the same
device, the item is merely redundant: remove it.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,blk\.(1|2|3)\.ffn_.*_exps=CUDA0"

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,ffn_up_exps=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "blk\.[1-3]\.ffn_.*_exps=CUDA0,exps=CPU"
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, created, item_text, matches, q, where_item

CODE = "MOE011"
NAME = "shadowed-rule"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    items = ctx.explanation.items
    by = ctx.explanation.matched_by
    names = [t.name for t in created(ctx)]
    for k, it in enumerate(items):
        if not (it.touches and not it.hits and it.raw_index is not None):
            continue
        m = matches(it.pattern)
        mine = [n for n in names if m is not None and m(n)]
        takers = Counter(by[n] for n in mine if by.get(n) is not None and by[n] != k)
        if not takers:
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
            yield Hit(*where_item(ctx, k), f"{q(item_text(ctx, k))} is never used: {named}{more}, earlier, take the "
                      f"{n} it matches (to {', '.join(sorted(devices))}); to send them to {it.device}, put it "
                      "before that item")
