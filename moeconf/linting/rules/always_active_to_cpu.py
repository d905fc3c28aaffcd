r"""always-active-to-cpu: attention, shared experts, router or norms sent to the CPU by a rule.

Why: routed experts are used by a few tokens each; attention, shared experts, the router and the
norms run for every token. Putting them in system RAM while a GPU has room slows every token;
the usual recipe keeps them on the GPU and moves only routed experts.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "shexp=CPU,exps=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import ALWAYS_ACTIVE, Hit, describe, item_tensors, where_item

CODE = "MOE014"
NAME = "always-active-to-cpu"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    pl = ctx.explanation.placement
    for k, tensors in item_tensors(ctx).items():
        it = ctx.explanation.items[k]
        moved = [t for t in tensors if it.device == "CPU" and t.group in ALWAYS_ACTIVE
                 and pl.defaults[t.name] not in (None, "CPU")]
        if moved:
            yield Hit(*where_item(ctx, k), f"{it.pattern!r} sends always-active tensors to CPU: {describe(moved)}; "
                      "they run for every token, keep them on the GPU")
