"""What the engine-source extractors (extract-engine-flags.py, extract-engine-names.py) share for
reading C/C++ text: the bracket matcher. Facts are read from the sources, nothing is copied."""

from __future__ import annotations


def matching(text: str, start: int, open_: str = "(", close: str = ")") -> int:
    """Index just past the bracket matching text[start] (strings and chars skipped)."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced")
