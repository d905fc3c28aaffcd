"""trailing-comma: an empty -ot item (a trailing, leading or doubled comma).

Why: the empty item has no `=`; mainline refuses it ("invalid value"), ik_llama.cpp too
("Invalid tensor buffer type override"). The server does not start.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "exps=CPU,"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE003"
NAME = "trailing-comma"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    for item in ctx.invocation.items():
        if item.text == "":
            where = "a trailing" if item.offset == len(item.source.value.text) else (
                "a leading" if item.offset == 0 else "a doubled")
            yield Hit(*ctx.at_item(item, -1 if item.offset else 0),
                      f"empty -ot item from {where} comma: the engine refuses it; remove the comma")
