r"""sm-graph-overrides: ik_llama.cpp `-sm graph` (or `attn`) with `-ot` and no `-smgs`.

Why: split mode "graph" spreads each layer over the GPUs, but ik_llama.cpp turns graph
scheduling off as soon as there are tensor overrides (too many shapes to test), silently, and
the run falls back to a slower schedule. `-smgs` (`--split-mode-graph-scheduling`) forces it
on; drop it again if the run misbehaves. Mainline has no split mode graph.

FAIL (engine=ik_llama.cpp):
    llama-server -m m.gguf -ngl 999 -sm graph -ot "exps=CPU"

PASS (engine=ik_llama.cpp):
    llama-server -m m.gguf -ngl 999 -sm graph -smgs -ot "exps=CPU"

PASS (engine=ik_llama.cpp):
    llama-server -m m.gguf -ngl 999 -sm layer -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE026"
NAME = "sm-graph-overrides"
SEVERITY = "warning"
NEEDS_MODEL = False

_SMGS = ("-smgs", "--split-mode-graph-scheduling")


def check(ctx: Context) -> Iterator[Hit]:
    inv = ctx.invocation
    if ctx.engine.name != "ik_llama.cpp" or inv.split_mode is None or inv.split_mode.text not in ("graph", "attn"):
        return
    if not inv.ot or inv.reading.named(*_SMGS):
        return
    yield Hit(*ctx.at_arg(inv.split_mode), f"-sm {inv.split_mode.text} with -ot: ik_llama.cpp silently turns graph "
              "scheduling off when there are tensor overrides; add -smgs to keep it (or drop the -ot)")
