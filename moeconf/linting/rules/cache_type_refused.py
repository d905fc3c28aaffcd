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

from moeconf.engines.argvread import Arg
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.linting.rules._memory import line_settings

CODE = "MOE041"
NAME = "cache-type-refused"
SEVERITY = "error"
NEEDS_MODEL = False
READS_SETTINGS = True  # skipped on a line the engine cannot read (flag-value-refused)


def check(ctx: Context) -> Iterator[Hit]:
    from moeconf.memory.estimate import refused_settings

    settings = line_settings(ctx)
    problems = [p for p in settings.problems if "cache type" in p]  # the rest is flag-value-refused's
    if ctx.inventory is not None:
        problems += [p for p in refused_settings(ctx.inventory, ctx.engine, settings)
                     if p not in settings.problems]
    elif settings.flash_attn == "off" and settings.cache_type_v not in ("f16", "f32", "bf16"):
        problems.append(f"{ctx.engine.label} refuses a quantized V cache ({settings.cache_type_v}) with flash "
                        "attention off")
    for p in problems:
        yield Hit(*ctx.at_arg(_word_for(ctx, p)), p)


def _word_for(ctx: Context, problem: str) -> Arg | None:
    """The word a problem is about: the refused cache type's value, the -ctk or -ctv given alone
    (the other is the default), the -ctv with -fa off; else its environment variable; else None
    (the launch)."""
    from moeconf.engines.options import env_var, row

    inv = ctx.invocation
    last: dict[str, Arg] = {}
    env: dict[str, Arg | None] = {}
    for key in ("-ctk", "-ctv", "-fa"):
        given = inv.reading.last(key)  # the line as the engine reads it: the last one counts
        if given is not None:
            last[key] = given.value or given.word
        env[key] = inv.env.get(env_var(key))

    def word(key: str) -> Arg | None:
        return last.get(key) or env[key]

    about = {f: (*row(f).spellings, env_var(f)) for f in ("-ctk", "-ctv")}
    if problem.startswith(about["-ctk"]):
        return word("-ctk")
    if problem.startswith(about["-ctv"]):
        return word("-ctv")
    if "different K and V" in problem:
        k, v = word("-ctk"), word("-ctv")
        return k if v is None else v if k is None else max(k, v, key=lambda a: (a.line, a.column))
    if "flash attention off" in problem:
        return word("-ctv") or word("-fa")
    return None
