"""missing-equals: an -ot item without `=DEVICE`.

Why: each item must be `REGEX=DEVICE`; an item without `=` makes the engine refuse the whole
argument. Often a device was forgotten, or a second regex was meant to share the first's device
(write `(a|b)=CPU`).

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "ffn_up_exps,ffn_down_exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "ffn_(up|down)_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.linting.rules.comma_in_pattern import cut_pairs

CODE = "MOE004"
NAME = "missing-equals"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    items = ctx.invocation.items()
    cut = cut_pairs(ctx)
    for k, item in enumerate(items):
        if item.text and "=" not in item.text and k not in cut and k + 1 not in cut:
            yield Hit(*ctx.at_item(item, len(item.text)),
                      f"item '{item.text}' has no '=DEVICE': write '{item.text}=CPU' or join regexes "
                      "with '|' to share a device")
