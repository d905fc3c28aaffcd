"""rpc-order: an `-ot` naming an RPC device before the `--rpc` that creates it.

Why: `-ot` checks buffer-type names while it parses, and an RPC device exists only once its
`--rpc` argument has been parsed. `-ot ...=RPC0[host:port]` before `--rpc host:port` fails with
"unknown buffer type".

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "exps=RPC0[127.0.0.1:50052]" --rpc 127.0.0.1:50052

PASS (engine=llama.cpp):
    llama-server -m m.gguf --rpc 127.0.0.1:50052 -ot "exps=RPC0[127.0.0.1:50052]"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE025"
NAME = "rpc-order"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    fmt = "RPC0[{}]" if ctx.engine.rpc_indexed else "RPC[{}]"
    created = {fmt.format(s): order for _f, v, order in ctx.invocation.rpc for s in v.text.split(",")}
    for item in ctx.invocation.items():
        dev = item.device
        if dev in created and item.source.order < created[dev]:
            yield Hit(*ctx.at_item(item, len(item.text) - len(dev)),
                      f"{dev} is created by a --rpc that comes after this -ot: move --rpc before -ot")
