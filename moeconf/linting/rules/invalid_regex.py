r"""invalid-regex: a pattern that C++ `std::regex` (ECMAScript) cannot compile.

Why: the engines do not check patterns when they parse arguments; the model load fails later,
after minutes of reading weights. Typical: `[6-10]` (a range is per character: write
`([6-9]|10)`), unbalanced parentheses, a stray `*` at the start.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\.[6-10]\.ffn_.*_exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\.([6-9]|10)\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, regex_problems

CODE = "MOE005"
NAME = "invalid-regex"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    return regex_problems(ctx, "invalid")
