r"""overbroad-catch-all: a catch-all sends tensors used on every token to the CPU.

Why: `ffn.*=CPU` or `.*=CPU` look like "the experts" but also take the shared experts, the
router, the norms and the dense FFNs (and `.*` attention too): everything not taken by an
earlier item, in every layer. Those run for every token; in RAM they cost speed on every token.
Only catch-alls that name none of those kinds and no blocks are reported (an item that names
them, `attn_kv_b=CPU` or `blk\.(4[0-9])\..*=CPU`, is deliberate), and only when they really
move such tensors off a GPU: `.*=CUDA0` after `exps=CPU`, or an explicit list of attention and
shared-expert tensors sent to a GPU, move nothing to the CPU and are fine.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "ffn.*=CPU"

FAIL (engine=ik_llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.(3|4|5)\.ffn_.*=CUDA0,ffn.*=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,.*=CUDA0"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot ".*=CUDA0"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "\.attn_.*\.weight|\.ffn_.*_shexp\.|blk\.[0-2]\.ffn=CUDA0,exps=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU,...=CUDA0"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import (
    Hit,
    always_active_moved_to_cpu,
    describe,
    implicit_catch_all,
    q,
    qfix,
    where_item,
)

CODE = "MOE013"
NAME = "overbroad-catch-all"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    for k, it in enumerate(ctx.explanation.items):
        if it.raw_index is None or not implicit_catch_all(ctx, k):
            continue
        moved = always_active_moved_to_cpu(ctx, k)
        fix = "ffn_.*_exps=CPU" if "ffn" in it.pattern else "exps=CPU"
        yield Hit(*where_item(ctx, k), f"{q(it.pattern + '=CPU')} is a catch-all: besides routed experts it sends "
                  f"{describe(moved)} to CPU, and those run for every token; name the experts: {qfix(fix)}")
