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

from moeconf.engines.cmdline import Arg
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


_K = ("-ctk", "--cache-type-k")
_V = ("-ctv", "--cache-type-v")
_FA = ("-fa", "--flash-attn")


def _word_for(ctx: Context, problem: str) -> Arg | None:
    """The word a problem is about: the refused cache type's value, the -ctk or -ctv given alone
    (the other is the default), the -ctv with -fa off; else its environment variable; else None
    (the launch)."""
    inv = ctx.invocation
    last: dict[str, Arg] = {}
    for i, a in enumerate(inv.args):
        name, eq, _ = a.text.partition("=") if a.text.startswith("--") else (a.text, "", "")
        for key, names in (("k", _K), ("v", _V), ("fa", _FA)):
            if name in names:
                value = Arg(a.text[len(name) + 1:], a.path, a.line, a.column + len(name) + 1 if a.column else 0) \
                    if eq else inv.args[i + 1] if i + 1 < len(inv.args) else a
                last[key] = value
    env = {"k": inv.env.get("LLAMA_ARG_CACHE_TYPE_K"), "v": inv.env.get("LLAMA_ARG_CACHE_TYPE_V"),
           "fa": inv.env.get("LLAMA_ARG_FLASH_ATTN")}

    def word(key: str) -> Arg | None:
        return last.get(key) or env[key]

    if problem.startswith(_K) or problem.startswith("LLAMA_ARG_CACHE_TYPE_K"):
        return word("k")
    if problem.startswith(_V) or problem.startswith("LLAMA_ARG_CACHE_TYPE_V"):
        return word("v")
    if "different K and V" in problem:
        k, v = word("k"), word("v")
        return k if v is None else v if k is None else max(k, v, key=lambda a: (a.line, a.column))
    if "flash attention off" in problem:
        return word("v") or word("fa")
    return None
