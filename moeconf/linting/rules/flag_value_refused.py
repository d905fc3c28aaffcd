"""flag-value-refused: a flag whose value the engine cannot read, so it stops at start.

Why: both engines read the word after a valued flag as its value, whatever it is. A bare `-fa`
(a switch on old builds, a valued flag on llama.cpp since b6325 and on ik_llama.cpp since
2025-11-13) before another flag takes that flag as its value: `-fa --ctx-size 4096` stops with
"unknown value for --flash-attn". The same holds for `-c`, `-ngl`, `--n-cpu-moe`, `-b`, `-ub`,
`-np` or `-mla` given a word that is not a number, or a flag given no value at the end of the
line; and a number the engine reads only the start of (`-c 32k`: std::stoi reads 32 and drops the
`k` in silence, so the server starts with a context of 32 tokens). A line the engine cannot read
is not judged further: the memory and fit rules (memory-over-device, fit-conflict,
cache-type-refused) are skipped for it, since what they would compute is not what the engine
would run. Write the value (`-fa on`).

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 --cpu-moe -fa --ctx-size 4096

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ngl 999 -c 32k -ot exps=CPU

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 --cpu-moe -fa on --ctx-size 4096

PASS (engine=llama.cpp, version=b6000, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 --cpu-moe -fa --ctx-size 4096
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines.argvread import Arg
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE042"
NAME = "flag-value-refused"
SEVERITY = "error"
NEEDS_MODEL = False

# the memory settings' valued flags whose values the rule reads (the cache types are
# cache-type-refused's, -fa and -ngl the command-line reader's), every spelling
_NUMERIC = ("-c", "-b", "-ub", "-np", "-mla")


def problems(ctx: Context) -> list[tuple[Arg | None, str]]:
    """Every value of the line the engine cannot read, with the word it is about (None: the
    launch): the command-line reader's (a bare -fa before another word, a flag without a value,
    -ngl or --n-cpu-moe not a number) and the memory settings' numbers. Cached per line."""
    cached = ctx.cache.get(NAME)
    if cached is not None:
        return list(cached)
    from moeconf.engines.options import spellings
    from moeconf.memory import read_settings

    inv = ctx.invocation
    reading = inv.reading  # the line as the engine reads it (engines/argvread.py read_argv)
    owner = {id(v): o for o in reading.options for v in o.values}
    fa = spellings("-fa")
    numeric = {n for f in _NUMERIC for n in spellings(f)}
    out: list[tuple[Arg | None, str]] = []
    seen = set()
    for arg, message in inv.problems:
        seen.add(id(arg))
        flag = owner.get(id(arg))
        if flag is not None and flag.name in fa and not flag.inline and arg.text.startswith("-"):
            # a bare -fa before another flag: the finding is about the -fa
            w = flag.word.text
            out.append((flag.word, f"a bare {w} takes the next word as its value on {ctx.engine.label}, here "
                                   f"{arg.text!r}, which it refuses, so the engine stops at start (and {arg.text} is "
                                   f"never read); write '{w} on'"))
        else:
            out.append((arg, message))
    for given in reading.options:
        at = given.value
        if given.name not in numeric or at is None or id(at) in seen:
            continue  # no value: "needs a value", the command-line reader's
        for p in read_settings([given.name, at.text], ctx.engine).problems:
            out.append((at, p))
    # a number the engine reads only the start of (`-c 32k` is 32): it starts, with another value
    from moeconf.engines.flags import value_misread

    for given in reading.options:
        at = given.value
        said = value_misread(ctx.engine, given.name, at.text) if at is not None and not given.inline else None
        if said is not None and at is not None and id(at) not in seen:
            out.append((at, said))
    for key, arg in inv.env.items():
        for p in read_settings([], ctx.engine, {key: arg.text}).problems:
            if "cache type" not in p:
                out.append((arg, p))
    if inv.bench is not None:  # what llama-bench's own parser refuses (engines/benchline.py)
        out.extend(inv.bench.problems)
    ctx.cache[NAME] = tuple(out)
    return out


def misread(ctx: Context) -> bool:
    """The engine would not read this line as written: a value it refuses, or a flag it does not
    know (both engines stop there, and the words after it are read only as a guess)."""
    bench = ctx.invocation.bench
    return bool(problems(ctx) or ctx.invocation.unknown_flags or (bench is not None and bench.unknown))


def check(ctx: Context) -> Iterator[Hit]:
    for arg, message in problems(ctx):
        yield Hit(*ctx.at_arg(arg), message)
