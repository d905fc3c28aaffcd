r"""space-in-list: whitespace around an -ot item.

Why: mainline and ik_llama.cpp since 2025-09-01 (build 3870) do not trim items: in
`exps=CPU, attn=CPU` the second regex is ` attn` (with the space), which no tensor name
contains, so the item silently does nothing (a warning, like any item that matches nothing);
whitespace after the device makes the device name unknown and the engine refuses to start (an
error). ik_llama.cpp before 2025-09-01 read each item as a word, dropping the whitespace: the
same line works there, so for those versions (`engine_version = "2025-08-15"` or a build
number below 3870) the finding is an info note that newer builds will break it; text after a
space inside an item is silently ignored by those builds (an error: the items it holds are
never applied).

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "ffn_up_exps=CPU, ffn_down_exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "ffn_up_exps=CPU,ffn_down_exps=CPU"

PASS (engine=ik_llama.cpp, version=2025-06-01):
    llama-server -m m.gguf -ot "ffn_up_exps=CPU,ffn_down_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, q

CODE = "MOE002"
NAME = "space-in-list"
SEVERITY = "warning"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    if ctx.engine.ot_items_read_as_words:
        for ov in ctx.invocation.ot:
            pos = 0
            for part in ov.value.text.split(","):
                words = part.split()
                if len(words) > 1:
                    at = ctx.at_arg(ov.value, pos + part.index(words[1]))
                    yield Hit(*at, f"{ctx.engine.label} reads the item {q(part.strip())} only up to the space: "
                              f"{q(' '.join(words[1:]))} is ignored; remove the space", "error")
                elif part != part.strip() and words:
                    yield Hit(*ctx.at_arg(ov.value, pos), f"{ctx.engine.label} drops the whitespace around "
                              f"{q(part.strip())}, but ik_llama.cpp since 2025-09-01 and mainline keep it and the "
                              "item then matches nothing; remove the space", "info")
                pos += len(part) + 1
        return
    for item in ctx.invocation.items():
        if item.text and item.text != item.text.lstrip():
            yield Hit(*ctx.at_item(item), f"item {q(item.text)} starts with whitespace: the engine keeps it, so "
                      f"the regex {q(item.pattern or item.text)} matches nothing; remove the space after the comma")
        elif item.text and item.text != item.text.rstrip():
            yield Hit(*ctx.at_item(item, len(item.text.rstrip())),
                      f"item {q(item.text)} ends with whitespace, which becomes part of the device name: the "
                      "engine refuses it; remove the space", "error")
