"""Text from files (tensor names, metadata strings, file names, plan values) made safe to print:
control characters are shown escaped (`\\x1b`, `\\n`, `\\u202e`), so a name can neither move the cursor,
clear the screen, recolour the terminal, fake a line of a report nor reorder text (bidi controls).

Escaped: C0 and C1 controls and DEL, line and paragraph separators, bidi embedding/override/
isolate marks, the byte-order mark and the noncharacters U+FFFE/U+FFFF (which YAML refuses), and
lone surrogates (undecodable bytes of a file name), which
would otherwise make printing fail. A backslash is left alone (regexes are full of them).
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ufffe\uffff\ud800-\udfff]"
)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _code(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def safe(text: str, keep: str = "") -> str:
    """`text` with every unsafe character escaped, except those in `keep` (e.g. "\\n" for a
    message of several lines whose line structure is moeconf's own)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _code(m.group()), text)


def first_unsafe(text: str) -> str | None:
    """The first unsafe character of `text`, escaped (`\\n`, `\\x1b`), or None when it has none."""
    m = _UNSAFE.search(text)
    if m is None:
        return None
    return _code(m.group())
