"""repeated-ot: more than one `-ot` on a command line.

Why: every `-ot` value appends, but mainline (b7464+) prints a misleading "DEPRECATED ... only
last value will be used" warning for repeats, and in server router/preset mode only the last
`-ot` survives. One comma-joined value says the same thing everywhere. ik_llama.cpp and older
mainline builds take repeats as they are: nothing is reported there. One finding per command
line, at the second `-ot`.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\\.3\\.=CUDA0" -ot "exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\\.3\\.=CUDA0,exps=CPU"

PASS (engine=ik_llama.cpp):
    llama-server -m m.gguf -ot "blk\\.3\\.=CUDA0" -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines.argvread import config_where
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE024"
NAME = "repeated-ot"
SEVERITY = "warning"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    eng = ctx.engine
    if eng.name != "llama.cpp" or (eng.build is not None and eng.build < 7464):
        return
    # a llama.cpp config file's override-tensor is not a repeat on the line (llama-config-placement)
    cli = [ov for ov in ctx.invocation.ot if ov.flag is not None and config_where(ov.flag) is None]
    if len(cli) > 1:
        yield Hit(*ctx.at_arg(cli[1].flag), f"-ot given {len(cli)} times: join the values with ',' into one -ot "
                  f"({eng.label} prints a misleading 'only last value will be used' for repeats, and router mode "
                  "keeps only the last)")
