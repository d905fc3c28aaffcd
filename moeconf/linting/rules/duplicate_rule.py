"""duplicate-rule: the same -ot item twice.

Why: the second copy can never win; it hides what the author meant to change (often a device
edited in one copy and not the other, or a repeated `-ot` in a copy-pasted script).

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU" -ot "exps=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE012"
NAME = "duplicate-rule"
SEVERITY = "warning"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    seen: dict[str, int] = {}
    for k, item in enumerate(ctx.invocation.items()):
        if not item.text or item.pattern is None:
            continue
        if item.text in seen:
            yield Hit(*ctx.at_item(item), f"'{item.text}' repeats item {seen[item.text] + 1}; remove one")
        else:
            seen[item.text] = k
