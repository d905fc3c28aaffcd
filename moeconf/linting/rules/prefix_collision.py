r"""prefix-collision: a layer number not bounded by `\.`, so `blk\.1` also matches blk.10-19.

Why: `-ot` regexes are searched, not anchored. `blk\.1=CUDA0` matches `blk.1.*` but also
`blk.10.*` .. `blk.19.*` and `blk.100.*`; `blk\.(1|2)` matches 1, 2, 10-29. End the number with
`\.`.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "blk\.1=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "blk\.1\.=CPU"
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.model.inventory import format_ranges

CODE = "MOE008"
NAME = "prefix-collision"
SEVERITY = "warning"
NEEDS_MODEL = False

# blk\. or blk. then a number part: digits, \d, classes, groups of those, with ? * + quantifiers
_NUM = r"(?:\d|\\d|\[[^\]]*\]|\((?:\?:)?[\d|\\d\[\]\-?]*\))[?*+]?"
_BLK = re.compile(r"blk(?:\\\.|\.)(?P<num>(?:" + _NUM + r")+)")
_BOUNDED = re.compile(r"^(?:\\\.|\\b|\[\^0-9\]|\\D|_|\.(?![*+?]))")


def intended(num: str) -> set[int] | None:
    try:
        rx = re.compile(r"(?:" + num + r")\Z")
    except re.error:
        return None
    return {n for n in range(1000) if rx.match(str(n))}


def check(ctx: Context) -> Iterator[Hit]:
    for item in ctx.invocation.items():
        pat = item.pattern
        if not pat:
            continue
        for m in _BLK.finditer(pat):
            rest = pat[m.end():]
            if _BOUNDED.match(rest):
                continue
            meant = intended(m.group("num"))
            if not meant:
                continue
            fix = pat[: m.end()] + r"\." + rest
            if ctx.inventory is not None:
                try:
                    rx = re.compile(pat)
                except re.error:
                    continue
                extra = [t for t in ctx.inventory.tensors
                         if t.layer is not None and t.layer not in meant and rx.search(t.name)]
                if not extra:
                    continue
                layers = format_ranges({t.layer for t in extra if t.layer is not None})
                yield Hit(*ctx.at_item(item, m.end()),
                          f"{m.group(0)!r} also matches blocks {layers} ({len(extra)} tensors); write {fix!r}")
            else:
                yield Hit(*ctx.at_item(item, m.end()),
                          f"{m.group(0)!r} is not followed by '\\.', so it also matches longer block numbers "
                          f"(blk.1 -> blk.10-19); write {fix!r}")
