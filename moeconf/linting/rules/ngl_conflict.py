r"""ngl-conflict: `-ngl` (or its default) leaves layers on the CPU, or drops the overrides.

Why: a tensor an -ot rule sends to a GPU goes there even if `-ngl` left its layer on the CPU,
but that layer's KV cache stays on the CPU. And `block_count` includes nextn blocks and mainline
counts the output layer: `-ngl 46` on GLM-4.5-Air (47 blocks) leaves blk.0 and blk.1 in RAM.
The default depends on the engine version: ik_llama.cpp before 2026-07-30 (package 0.1.5)
offloads nothing without `-ngl`; since then it offloads everything, but drops every `-ot` and
`--n-cpu-moe` with `-ngl 0`. Use `-ngl 999` and move tensors with rules.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 46 -ot "exps=CPU"

FAIL (engine=ik_llama.cpp, version=0.1.5, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ot "exps=CPU"

FAIL (engine=ik_llama.cpp, version=2026-08-15, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 0 --n-cpu-moe 20

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"

PASS (engine=ik_llama.cpp, version=2026-08-15, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines import HOST
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.model.inventory import format_ranges

CODE = "MOE018"
NAME = "ngl-conflict"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None and ctx.inventory is not None
    from moeconf.explanation import available_devices

    eng = ctx.engine
    inv_ = ctx.invocation
    has_gpu = len(available_devices(inv_, ctx.gpus)) > 1
    manual = bool(inv_.ot or inv_.cpu_moe or inv_.n_cpu_moe)
    if has_gpu and eng.ot_needs_gpu and inv_.n_gpu_layers() == 0 and manual:
        yield Hit(*ctx.at_arg(inv_.ngl[0] if inv_.ngl else None),
                  f"{eng.label} drops every -ot and --n-cpu-moe rule with -ngl 0 (and offloads nothing): "
                  "use -ngl 999 and move tensors with rules")
        return
    if has_gpu and inv_.ngl is None and eng.default_ngl == 0:
        yield Hit(ctx.line, ctx.column,
                  f"{eng.label} offloads nothing without -ngl (its default is 0): every layer stays on the CPU"
                  + (" and only what -ot sends to a GPU goes there" if inv_.ot else "") + "; add -ngl 999")
        return
    ngl = inv_.ngl
    if ngl is None or ngl[1] < 0:
        return
    inv = ctx.inventory
    pl = ctx.explanation.placement
    cpu_layers = sorted({t.layer for t in inv.tensors if t.layer is not None and pl.defaults[t.name] == HOST})
    if not cpu_layers or not ctx.explanation.items:
        if cpu_layers and ngl[1] >= inv.block_count - len(inv.layers_of_kind("nextn")):
            yield Hit(*ctx.at_arg(ngl[0]), _off_by_one(ctx, ngl[1], cpu_layers))
        return
    pulled = sorted({t.layer for t in inv.tensors
                     if t.layer in cpu_layers and pl.devices[t.name] not in (None, HOST)})
    if pulled:
        yield Hit(*ctx.at_arg(ngl[0]),
                  f"-ngl {ngl[1]} leaves layers {format_ranges(cpu_layers)} on the CPU, but -ot sends tensors of "
                  f"layers {format_ranges(pulled)} to a GPU: their KV cache stays on the CPU; use -ngl 999")
    elif ngl[1] >= inv.block_count - len(inv.layers_of_kind("nextn")):
        yield Hit(*ctx.at_arg(ngl[0]), _off_by_one(ctx, ngl[1], cpu_layers))


def _off_by_one(ctx: Context, n: int, cpu_layers: list[int]) -> str:
    assert ctx.inventory is not None
    return (f"-ngl {n} leaves blocks {format_ranges(cpu_layers)} on the CPU: block_count is "
            f"{ctx.inventory.block_count} (nextn blocks included)"
            + (" and -ngl counts the output layer" if ctx.engine.ngl_counts_output else "")
            + "; use -ngl 999 to offload every layer")
