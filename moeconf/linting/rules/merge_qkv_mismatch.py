r"""merge-qkv-mismatch: ik_llama.cpp `-mqkv` that will not merge (all) layers.

Why: `--merge-qkv` merges Q, K and V of a layer only where their quant types agree (Q4_K_M
files often give attn_v Q6_K in some layers), not under `-sm graph`/`attn`, only on some
architectures, and merged layers ignore rules that place attn_q/attn_k/attn_v separately. All
of this is silent (an INFO log at most). Mainline has no such flag.

FAIL (engine=ik_llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -mqkv -ot "exps=CPU"

PASS (engine=ik_llama.cpp, model=gpt-oss-120b):
    llama-server -m m.gguf -ngl 999 -mqkv -ot "exps=CPU"
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from moeconf.engines.mergeqkv import MERGING_ARCHS
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.model.inventory import format_ranges

CODE = "MOE021"
NAME = "merge-qkv-mismatch"
SEVERITY = "warning"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    flag = ctx.invocation.merge_qkv
    if flag is None:
        return
    where = ctx.at_arg(flag)
    if not ctx.engine.has_merge_qkv:
        yield Hit(*where, f"{ctx.engine.name} has no -mqkv (an ik_llama.cpp flag): the server will not start", "error")
        return
    sm = ctx.invocation.split_mode
    if sm is not None and sm.text in ("graph", "attn"):
        yield Hit(*where, f"-mqkv turns itself off with -sm {sm.text}")
    inv = ctx.inventory
    if inv is None:
        return
    if inv.arch not in MERGING_ARCHS:
        yield Hit(*where, f"-mqkv does nothing on {inv.arch}: ik_llama.cpp merges Q/K/V only on "
                  "llama/qwen3/glm4moe/gpt-oss-style architectures")
        return
    types: dict[int, dict[str, str]] = defaultdict(dict)
    for t in inv.tensors:
        if t.layer is not None and t.base in ("attn_q", "attn_k", "attn_v") and t.name.endswith(".weight"):
            types[t.layer][t.base] = t.type
    differ = sorted(il for il, d in types.items() if len(d) == 3 and len(set(d.values())) > 1)
    if differ:
        example = types[differ[0]]
        yield Hit(*where, f"Q/K/V types differ in layers {format_ranges(differ)} (e.g. layer {differ[0]}: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(example.items()))
                  + "): -mqkv skips those layers silently")
    if ctx.explanation is not None:
        pl = ctx.explanation.placement
        split = sorted({il for il in types if len({pl.devices.get(f"blk.{il}.{b}.weight") for b in types[il]}) > 1})
        if split:
            yield Hit(*where, f"rules place attn_q/attn_k/attn_v of layers {format_ranges(split)} on different "
                      "devices: merged layers ignore those rules")
