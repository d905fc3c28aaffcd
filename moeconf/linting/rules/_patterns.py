"""Reading an `-ot` regex the way its author wrote it: top-level alternatives, unescaped dots,
and the layer-number parts (where a block number stands) with the block numbers they denote."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

# one atom of a layer number: a digit, \d, a class, or a group of those, with a quantifier
_ATOM = r"(?:\d|\\d|\[\^?[^\]]*\]|\((?:\?:)?(?:[\d|\-]|\\d|\[\^?[^\]]*\])+\))[?*+]?"
_RUN = re.compile(r"(?:" + _ATOM + r")+")
_BLK = re.compile(r"(?:blk)(?:\\\.|\.)$")


def _outside_classes(pattern: str) -> Iterator[tuple[int, str]]:
    """Each character of `pattern` that is neither escaped nor inside (or opening) a `[...]`
    class, with its offset."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        else:
            yield i, c
        i += 1


def alternatives(pattern: str) -> list[tuple[int, str]]:
    """Top-level `|` alternatives with their offsets (classes and groups respected)."""
    out: list[tuple[int, str]] = []
    depth, start = 0, 0
    for i, c in _outside_classes(pattern):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append((start, pattern[start:i]))
            start = i + 1
    out.append((start, pattern[start:]))
    return out


def unescaped_dots(pattern: str) -> list[int]:
    """Offsets of `.` that match any character and are not a `.*`/`.+`/`.?`/`.{}` wildcard."""
    return [i for i, c in _outside_classes(pattern)
            if c == "." and not (i + 1 < len(pattern) and pattern[i + 1] in "*+?{")]


@dataclass(frozen=True)
class LayerNumber:
    """A layer-number part of one alternative: `num` at [start, end) of the alternative, after
    `prefix_start` (where `blk.` begins, or `start`), and the block numbers it denotes."""

    start: int
    end: int
    prefix_start: int
    num: str
    meant: frozenset[int]
    bounded: bool  # after `blk.` and closed on the right: it cannot be part of a longer number

    def fix(self, alt: str) -> str:
        """The alternative with this number written `blk\\.N\\.`."""
        rest = alt[self.end:]
        if rest.startswith("\\."):
            rest = rest[2:]
        elif rest.startswith(".") and rest[1:2] not in ("*", "+", "?", "{"):
            rest = rest[1:]
        return alt[: self.prefix_start] + "blk\\." + self.num + "\\." + rest


def layer_numbers(alt: str, upto: int = 1000) -> list[LayerNumber]:
    """Layer-number parts of one alternative: right after `blk.`/`blk\\.`, or at its very start
    (`6.ffn`, `[1-4]\\.`, `(3|4)\\.`) when a `.` follows. Numbers elsewhere (`_exps.0`) are not
    block numbers."""
    out = []
    for m in _RUN.finditer(alt):
        before = alt[: m.start()]
        after = alt[m.end():]
        blk = _BLK.search(before)
        if blk:
            prefix_start = blk.start()
        elif before in ("", "^") and (after.startswith(("\\.", ".")) or after == ""):
            prefix_start = m.start()
        else:
            continue
        meant = _meant(m.group(0), upto)
        if not meant:
            continue
        # closed by `\.`, or by any character followed by a letter (`blk.1.ffn`: a longer number
        # would have to be followed by `.ffn` there, which no tensor name has)
        # without `blk.` in front, `6` also matches the end of 16, 26, ...
        bounded = bool(blk) and (after.startswith(("\\.", "_", "\\b", "[^0-9]", "\\D"))
                                 or bool(re.match(r"\.[A-Za-z_]", after)))
        out.append(LayerNumber(m.start(), m.end(), prefix_start, m.group(0), meant, bounded))
    return out


@lru_cache(maxsize=4096)
def _meant(num: str, upto: int) -> frozenset[int]:
    """The block numbers below `upto` a layer-number part matches whole (none if it is not a
    regex Python reads)."""
    if num.isascii() and num.isdigit():  # a plain number (the usual case): itself, without leading zeros
        small = len(num) <= len(str(upto)) and str(int(num)) == num and int(num) < upto
        return frozenset({int(num)}) if small else frozenset()
    try:
        rx = re.compile(r"(?:" + num + r")\Z")
    except re.error:
        return frozenset()
    return frozenset(n for n in range(upto) if rx.match(str(n)))


ALWAYS_ACTIVE_WORDS = re.compile(r"attn|shexp|gate_inp|norm|router|ffn_(?:up|down|gate)(?![_a-z])|token_embd|output")


def names_always_active(pattern: str) -> bool:
    """Does the pattern name an always-active kind (so sending it somewhere is deliberate)?"""
    return bool(ALWAYS_ACTIVE_WORDS.search(pattern))


def names_blocks(pattern: str) -> bool:
    return any(layer_numbers(alt) for _, alt in alternatives(pattern))
