"""rule-selects-nothing: a plan rule that selects no tensor of the model (plans only).

Why: a rule that selects nothing is a typo or a stale plan (layers beyond the model, a tensor
kind another model had). `moeconf compile` warns; the linter makes it a finding.

FAIL (file=plan.toml, model=deepseek-v3):
    rules = ["experts -> cpu", "experts layers 70.. -> gpu"]
    [model]
    path = "@MODEL@"
    serve_path = "/m.gguf"

PASS (file=plan.toml, model=deepseek-v3):
    rules = ["experts -> cpu", "experts layers 50.. -> gpu"]
    [model]
    path = "@MODEL@"
    serve_path = "/m.gguf"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE030"
NAME = "rule-selects-nothing"
SEVERITY = "warning"
NEEDS_MODEL = True
PLAN_ONLY = True


def check(ctx: Context) -> Iterator[Hit]:
    for d in ctx.plan_diagnostics:
        if d.kind in ("selects-nothing", "not-loaded"):
            yield Hit(d.line or ctx.line, d.column or ctx.column, d.message)
