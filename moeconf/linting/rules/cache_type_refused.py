"""cache-type-refused: KV cache settings the engine refuses to start with.

Why: llama.cpp stops at context creation when an MLA model (DeepSeek, Kimi) gets different K
and V cache types (`-ctk q8_0` alone: "model does not support different K and V cache types"),
when a quantized V cache meets `-fa off` ("quantized V cache requires flash_attn"), and on a
cache type it does not know (`q6_0` is ik_llama.cpp's). Give `-ctk` and `-ctv` together.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ctk q8_0

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ctk q8_0 -ctv q8_0
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.linting.rules._memory import line_settings

CODE = "MOE041"
NAME = "cache-type-refused"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    from moeconf.memory.estimate import refused_settings

    inv = ctx.invocation
    settings = line_settings(ctx)
    problems = list(settings.problems)
    if ctx.inventory is not None:
        problems = refused_settings(ctx.inventory, ctx.engine, settings)
    elif settings.flash_attn == "off" and settings.cache_type_v not in ("f16", "f32", "bf16"):
        problems.append(f"{ctx.engine.label} refuses a quantized V cache ({settings.cache_type_v}) with flash "
                        "attention off")
    flags = {"-ctk", "--cache-type-k", "-ctv", "--cache-type-v"}
    where = next((a for a in inv.args if a.text in flags), None)
    for p in problems:
        if "cache" in p or "flash attention" in p:
            yield Hit(*ctx.at_arg(where), p)
