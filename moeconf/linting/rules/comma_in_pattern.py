r"""comma-in-pattern: a regex quantifier `{a,b}` was cut in two by -ot's comma splitting.

Why: both engines split the -ot value on every `,` before anything else, with no escaping, so
`blk\.[0-9]{1,2}\.=CPU` becomes the items `blk\.[0-9]{1` and `2}\.=CPU`: the engine refuses it.
Write the alternatives out instead.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\.[0-9]{1,2}\.ffn_.*_exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\.([0-9]|[0-9][0-9])\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE001"
NAME = "comma-in-pattern"
SEVERITY = "error"
NEEDS_MODEL = False

_OPEN = re.compile(r"\{\d*$")
_CLOSE = re.compile(r"^\d*\}")


def cut_pairs(ctx: Context) -> set[int]:
    """Indices of items that begin inside a quantifier cut at its comma."""
    items = ctx.invocation.items()
    out = set()
    for k in range(1, len(items)):
        a, b = items[k - 1], items[k]
        if a.source is b.source and _OPEN.search(a.text) and _CLOSE.match(b.text):
            out.add(k)
    return out


def check(ctx: Context) -> Iterator[Hit]:
    items = ctx.invocation.items()
    for k in sorted(cut_pairs(ctx)):
        a, b = items[k - 1], items[k]
        quant = a.text[a.text.rindex("{"):] + "," + b.text[: b.text.index("}") + 1]
        yield Hit(*ctx.at_item(b, -1),
                  f"'{quant}' was cut at its comma: -ot splits on every ','; write the alternatives out "
                  "(e.g. '([0-9]|[0-9][0-9])' for '[0-9]{1,2}')")
