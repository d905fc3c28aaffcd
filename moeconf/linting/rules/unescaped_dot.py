r"""unescaped-dot: a `.` between name parts, where a literal dot was meant.

Why: in a regex `.` matches any character. `blk.1.ffn` also matches `blk11ffn`-like text, and
combined with an unbounded number it widens what a rule takes. Write `\.` for the dot in tensor
names. (A deliberate `.*` or `.+` is fine.)

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk.3.ffn_up_exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\.3\.ffn_up_exps=CPU"
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE009"
NAME = "unescaped-dot"
SEVERITY = "warning"
NEEDS_MODEL = False

_DOT = re.compile(r"(?<![\\\[])(?:\\\\)*\.(?![*+?{])")


def check(ctx: Context) -> Iterator[Hit]:
    for item in ctx.invocation.items():
        pat = item.pattern
        if not pat:
            continue
        in_class = False
        for i, ch in enumerate(pat):
            if ch == "[" and (i == 0 or pat[i - 1] != "\\"):
                in_class = True
            elif ch == "]" and in_class:
                in_class = False
            if ch != "." or in_class or (i > 0 and pat[i - 1] == "\\"):
                continue
            nxt = pat[i + 1] if i + 1 < len(pat) else ""
            prev = pat[i - 1] if i > 0 else ""
            if nxt in "*+?{":
                continue
            if ((prev.isalnum() or prev in "_)") and (nxt.isalnum() or nxt in "_(")) or pat[max(0, i - 3):i] == "blk":
                yield Hit(*ctx.at_item(item, i),
                          f"'.' at {pat[max(0, i - 4):i + 5]!r} matches any character; write '\\.' for a literal dot")
                break
