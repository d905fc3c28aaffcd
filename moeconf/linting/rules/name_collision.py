r"""name-collision: a bare tensor name that also takes other tensors containing it.

Why: `-ot` regexes are searched, not anchored, so a name is matched anywhere: `output=CUDA1`
(meant for the output matrix) also takes `output_norm` and every layer's `attn_output`;
`exp=CPU` (meant for the experts) also takes the shared experts and the router bias
(`ffn_up_shexp`, `exp_probs_b`). Anchor the name (`^output\.`) or write the exact kind
(`exps`). Reported only when the item really takes such tensors and moves them: `exp=CUDA0`
under `-ngl 999` also takes the shared experts, but to the GPU they were on anyway.

FAIL (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -fit off -ot "exps=CPU,output=CPU"

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -fit off -ot "exp=CPU"

PASS (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -fit off -ot "exps=CPU,^output\.=CUDA0"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -fit off -ot "exp=CUDA0"
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, describe, item_tensors, q, qfix, where_item

CODE = "MOE028"
NAME = "name-collision"
SEVERITY = "warning"
NEEDS_MODEL = True

_WORD = re.compile(r"[a-z][a-z0-9_]*")
_SUFFIX = re.compile(r"^blk\.\d+\.|\.(weight|bias|scale)$")


def _kind(name: str) -> str:
    return _SUFFIX.sub("", _SUFFIX.sub("", name))


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None and ctx.inventory is not None
    kinds = {_kind(t.name) for t in ctx.inventory.tensors}
    taken = item_tensors(ctx)
    for k, it in enumerate(ctx.explanation.items):
        word = it.pattern
        if it.raw_index is None or not _WORD.fullmatch(word) or not taken.get(k):
            continue
        if word in kinds:
            other = [t for t in taken[k] if _kind(t.name) != word]
            fix = f"^{word}\\." if not any(t.layer is not None and _kind(t.name) == word for t in taken[k]) \
                else f"\\.{word}\\."
        elif word == "exp" and any(_kind(t.name).endswith("_exps") for t in taken[k]):
            other = [t for t in taken[k] if not _kind(t.name).endswith("_exps")]
            fix = "exps"
        else:
            continue
        # tensors that end up where they would have gone anyway change nothing: not a finding
        # (`exp=CUDA0` under -ngl 999 also takes the shared experts, to the GPU they were on)
        defaults = ctx.explanation.placement.defaults
        other = [t for t in other if defaults.get(t.name) != it.device]
        if other:
            names = sorted({_kind(t.name) for t in other})
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            yield Hit(*where_item(ctx, k), f"{q(word)} is matched anywhere in a name, so it also takes {shown}: "
                      f"{describe(other)}; write {qfix(fix + '=' + it.device)}")
