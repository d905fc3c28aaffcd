r"""dense-layer-to-cpu: the feed-forward of a dense (non-MoE) layer sent to the CPU.

Why: DeepSeek, Kimi and GLM start with dense layers whose FFN runs for every token. Rules like
`ffn_(up|down|gate)=CPU` or `blk\.[0-2]\.=CPU` meant for experts move them too.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.[0-9]\.ffn_(up|down|gate)=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.[0-9]\.ffn_(up|down|gate)_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, describe, item_tensors, where_item

CODE = "MOE015"
NAME = "dense-layer-to-cpu"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    pl = ctx.explanation.placement
    for k, tensors in item_tensors(ctx).items():
        it = ctx.explanation.items[k]
        moved = [t for t in tensors if it.device == "CPU" and t.group == "dense"
                 and pl.defaults[t.name] not in (None, "CPU")]
        if moved:
            yield Hit(*where_item(ctx, k), f"{it.pattern!r} sends dense-layer FFNs to CPU: {describe(moved)}; "
                      "they run for every token (only routed experts belong in RAM)")
