r"""shadowed-rule: an -ot item that matches tensors but is never the first match for any.

Why: the engine uses the first item that matches a tensor. An item whose every tensor an
earlier item (or an earlier `--cpu-moe`) already takes does nothing: usually the order is
backwards (write the exceptions first, the catch-all last).

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,blk\.(1|2|3)\.ffn_.*_exps=CUDA0"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "blk\.[1-3]\.ffn_.*_exps=CUDA0,exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, item_text, where_item

CODE = "MOE011"
NAME = "shadowed-rule"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    items = ctx.explanation.items
    for k, it in enumerate(items):
        if it.touches and not it.hits and it.raw_index is not None:
            first = next((j for j in range(k) if items[j].hits), None)
            by = f" (earlier: {item_text(ctx, first)!r})" if first is not None else ""
            yield Hit(*where_item(ctx, k), f"{it.pattern!r} matches {it.touches} tensors but an earlier item takes "
                      f"every one{by}: move it before the broader item")
