"""space-in-list: an -ot item starts or ends with whitespace, so its regex matches nothing.

Why: the engines do not trim items: in `exps=CPU, attn=CPU` the second regex is ` attn` (with the
space), which no tensor name contains. Nothing says so; ik_llama.cpp trimmed before 2025-09, so
old recipes broke silently.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "ffn_up_exps=CPU, ffn_down_exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "ffn_up_exps=CPU,ffn_down_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE002"
NAME = "space-in-list"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    for item in ctx.invocation.items():
        if item.text and item.text != item.text.lstrip():
            yield Hit(*ctx.at_item(item), f"item {item.text!r} starts with whitespace: the engine keeps it, so "
                      f"the regex {item.pattern!r} matches nothing; remove the space after the comma")
        elif item.text and item.text != item.text.rstrip():
            yield Hit(*ctx.at_item(item, len(item.text.rstrip())),
                      f"item {item.text!r} ends with whitespace, which becomes part of the device name")
