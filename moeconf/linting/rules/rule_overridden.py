"""rule-overridden: a plan rule whose every tensor a later rule re-places (plans only).

Why: rules apply in order and later ones refine earlier ones; a rule that decides nothing is
usually in the wrong order (write the general rule first, then the exceptions).

FAIL (file=plan.toml, model=deepseek-v3):
    rules = ["experts layers 10..20 -> gpu", "experts -> cpu"]
    [model]
    path = "@MODEL@"
    serve_path = "/m.gguf"

PASS (file=plan.toml, model=deepseek-v3):
    rules = ["experts -> cpu", "experts layers 10..20 -> gpu"]
    [model]
    path = "@MODEL@"
    serve_path = "/m.gguf"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE031"
NAME = "rule-overridden"
SEVERITY = "warning"
NEEDS_MODEL = True
PLAN_ONLY = True


def check(ctx: Context) -> Iterator[Hit]:
    for d in ctx.plan_diagnostics:
        if d.kind == "overridden":
            yield Hit(d.line or ctx.line, d.column or ctx.column, d.message)
