r"""nextn-experts-placed: a nextn (MTP) block loaded onto a GPU, where it only costs VRAM.

Why: GLM-4.5's last block (`blk.92`, `blk.46` on Air) is a multi-token-prediction block with its
own experts. llama.cpp does not load it; ik_llama.cpp 0.1.5 loads and places it like any layer,
so 1-4 GiB of VRAM go to tensors that run only when MTP is on. Send the block to the CPU.

FAIL (engine=ik_llama.cpp, version=0.1.5, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"

PASS (engine=ik_llama.cpp, version=0.1.5, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,blk\.46\.=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, describe

CODE = "MOE016"
NAME = "nextn-experts-placed"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None and ctx.inventory is not None
    pl = ctx.explanation.placement
    on_gpu = [t for t in ctx.inventory.tensors if t.group == "nextn" and pl.devices[t.name] not in (None, "CPU")]
    if on_gpu:
        blocks = sorted({t.layer for t in on_gpu if t.layer is not None})
        fix = ",".join(rf"blk\.{b}\.=CPU" for b in blocks)
        yield Hit(ctx.line, ctx.column, f"nextn (MTP) block {', '.join(map(str, blocks))} is loaded onto "
                  f"{', '.join(sorted({str(pl.devices[t.name]) for t in on_gpu}))}: {describe(on_gpu)} used only "
                  f"for MTP; add '{fix}'")
