r"""merge-up-gate-split: ik_llama.cpp `-muge` with up and gate experts apart.

Why: `--merge-up-gate-experts` merges `ffn_up_exps` and `ffn_gate_exps` of a layer only when
both have the same type and shape and land in the same buffer after `-ot`. A rule that sends
only one of them elsewhere silently disables the merge for those layers.

FAIL (engine=ik_llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -muge -ot "ffn_up_exps=CPU"

PASS (engine=ik_llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -muge -ot "ffn_(up|gate)_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.model.inventory import format_ranges

CODE = "MOE022"
NAME = "merge-up-gate-split"
SEVERITY = "warning"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    flag = ctx.invocation.merge_up_gate
    if flag is None:
        return
    where = ctx.at_arg(flag)
    if not ctx.engine.has_merge_up_gate:
        yield Hit(*where, f"{ctx.engine.name} has no -muge (an ik_llama.cpp flag): the server will not start", "error")
        return
    if ctx.inventory is None or ctx.explanation is None:
        return
    by = ctx.inventory.by_name
    pl = ctx.explanation.placement
    apart, types = [], []
    for layer in ctx.inventory.layers:
        up, gate = f"blk.{layer.index}.ffn_up_exps.weight", f"blk.{layer.index}.ffn_gate_exps.weight"
        if up in by and gate in by:
            if pl.devices[up] != pl.devices[gate]:
                apart.append(layer.index)
            elif by[up].type != by[gate].type:
                types.append(layer.index)
    if apart:
        yield Hit(*where, f"up and gate experts of layers {format_ranges(apart)} go to different devices: -muge "
                  "skips them; place ffn_(up|gate)_exps together")
    if types:
        yield Hit(*where, f"up and gate experts of layers {format_ranges(types)} have different types: "
                  "-muge skips them")
