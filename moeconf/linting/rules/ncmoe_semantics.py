"""ncmoe-semantics: `--n-cpu-moe N` that does not move the N MoE layers its author meant.

Why: mainline takes the first N block indices, dense leading blocks included (DeepSeek's 0-2
have no experts, so `--n-cpu-moe 3` moves nothing); ik_llama.cpp takes the last N layers that
have experts. So the same N means opposite layers in the two engines, some builds count nextn
blocks, and N larger than the MoE layer count silently moves them all.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\\.([3-9]|1[0-2])\\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines import ik, mainline
from moeconf.engines.cmdline import ncmoe_blocks
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.model.inventory import format_ranges

CODE = "MOE017"
NAME = "ncmoe-semantics"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    inv = ctx.inventory
    assert inv is not None
    moe = inv.layers_of_kind("moe")
    dense = set(inv.layers_of_kind("dense"))
    nextn = set(inv.layers_of_kind("nextn"))
    for flag, n, _order, _src in ctx.invocation.n_cpu_moe:
        blocks = ncmoe_blocks(ctx.engine, inv, n)
        where = ctx.at_arg(flag)
        problems = []
        if dense & set(blocks):
            problems.append(f"it counts dense blocks {format_ranges(dense & set(blocks))}, which have no experts, "
                            f"so only {len(set(blocks) - dense - nextn)} MoE layers move")
        if nextn & set(blocks):
            problems.append(f"it counts the nextn block {format_ranges(nextn & set(blocks))}")
        if n > len(moe):
            problems.append(f"{n} exceeds the model's {len(moe)} MoE layers: every expert moves")
        other = ik() if ctx.engine.name == "llama.cpp" else mainline()
        theirs = ncmoe_blocks(other, inv, n)
        if ctx.engine_source == "default" and set(theirs) != set(blocks):
            problems.append(f"the engine is not declared: on llama.cpp it takes blocks "
                            f"{format_ranges(ncmoe_blocks(mainline(), inv, n))}, on ik_llama.cpp "
                            f"{format_ranges(ncmoe_blocks(ik(), inv, n))} (add '# moeconf: engine=...')")
        if problems:
            yield Hit(*where, f"--n-cpu-moe {n} on {ctx.engine.name} takes blocks {format_ranges(blocks)}: "
                      + "; ".join(problems) + "; say which layers with -ot instead (moeconf compile)")
