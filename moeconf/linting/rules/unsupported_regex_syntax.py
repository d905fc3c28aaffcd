r"""unsupported-regex-syntax: regex syntax that Python or PCRE has but `std::regex` ECMAScript lacks.

Why: patterns copied from Python or PCRE habits (lookbehind `(?<=`, named groups `(?P<n>`,
inline flags `(?i)`, atomic `(?>`) make `std::regex` throw when the model loads. Others load but
mean something else: `\A` `\Z` `\z` are the letters A, Z, z (no anchors), and `*+` `++` `?+`
repeat a repetition instead of being possessive.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "(?i)FFN_.*_EXPS=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "ffn_.*_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, regex_problems

CODE = "MOE006"
NAME = "unsupported-regex-syntax"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    yield from regex_problems(ctx, "unsupported")
    yield from regex_problems(ctx, "misread")
