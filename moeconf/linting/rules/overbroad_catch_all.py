r"""overbroad-catch-all: one item takes several kinds of tensor in (nearly) every layer.

Why: `ffn.*=CPU` looks like "the experts" but also takes the shared experts, the router and the
dense FFNs; `.*=CUDA0` takes everything, token embeddings included. Always-active tensors in RAM
cost speed on every token. Name the group you mean (`exps=CPU`), or bound the layers.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "ffn.*=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, describe, item_tensors, where_item

CODE = "MOE013"
NAME = "overbroad-catch-all"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None and ctx.inventory is not None
    all_layers = {layer.index for layer in ctx.inventory.layers}
    for k, tensors in item_tensors(ctx).items():
        it = ctx.explanation.items[k]
        if it.raw_index is None:
            continue
        groups = {t.group for t in tensors}
        layers = {t.layer for t in tensors if t.layer is not None}
        if len(groups) >= 3 and len(layers) >= 0.9 * len(all_layers):
            yield Hit(*where_item(ctx, k), f"{it.pattern!r} takes {describe(tensors)} to {it.device}: name the "
                      "group you mean (e.g. 'exps=CPU' for routed experts) or bound the layers")
