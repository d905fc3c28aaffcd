"""model-unknown: the model of an invocation could not be found, so model-aware rules were skipped.

Why: rules such as unmatched-pattern need the model's tensor names. moeconf finds the model from
the `-m` path (if that file exists) or from `[models]` in `.moeconf.toml`, which maps a path or a
file name to a GGUF or a manifest (`moeconf inspect MODEL --manifest -o FILE.json`).

FAIL (engine=llama.cpp):
    llama-server -m /nowhere/model.gguf -ot "exps=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE000"
NAME = "model-unknown"
SEVERITY = "info"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    if ctx.inventory is not None:
        return
    m = ctx.invocation.model
    what = f"model {m.text!r} not found" if m else "no -m model path"
    yield Hit(*ctx.at_arg(m), f"{what}: model-aware rules were skipped; map it in .moeconf.toml "
              "[models] to a GGUF or a manifest")
