r"""unknown-flag: a command-line flag the engine does not know (often a typo of one it does).

Why: both engines stop at an argument they do not know, and neither splits `--flag=value`. A
typo such as `--n-cpu-mo 4` for `--n-cpu-moe 4` means the server does not start, or, when the
line is edited until it does, that the placement the author meant is not the one used. The
finding names the closest known flag. Flags are read from the engines' own argument parsers
(`moeconf/engines/flagtable.py`); only servers and CLIs that use that parser are checked.
llama-bench has its own parser and options (`moeconf/engines/benchtable.py`): a server option
on its line (`-c`, `--no-mmap`, `-fit off`) stops it with "invalid parameter for argument".

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ngl 99 --n-cpu-mo 4

FAIL (engine=llama.cpp):
    llama-bench -m m.gguf -ngl 99 -c 4096 -p 512

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ngl 99 --n-cpu-moe 4

PASS (engine=llama.cpp):
    llama-bench -m m.gguf -ngl 99 -ncmoe 4 -nopo 1 -p 512 -d 4096
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines.argvread import unknown_flag_message
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE037"
NAME = "unknown-flag"
SEVERITY = "warning"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    bench = ctx.invocation.bench
    for arg, message in bench.unknown if bench is not None else ():
        yield Hit(*ctx.at_arg(arg), message)
    for arg, closest in ctx.invocation.unknown_flags:
        line, column = (arg.line, arg.column) if arg.line else (ctx.line, ctx.column)
        yield Hit(line, column, unknown_flag_message(ctx.engine, arg.text, closest))
