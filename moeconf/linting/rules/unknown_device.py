r"""unknown-device: a buffer-type name the engine (at this version) will not accept.

Why: names are exact and case-sensitive and come from the devices present at run time. The
engine prints "Available buffer types" and exits. Common slips: `cuda0`, placeholders such as
`CUDAx` or an unexpanded `$GPU`, host buffers (`CUDA_Host`, `CPU_REPACK`), old names (`Metal`
for `MTL0`, `RPC[host:port]` for `RPC0[host:port]`), and an RPC device whose `--rpc` server is
not given. When the machine's GPUs are known (`gpus` in `.moeconf.toml`, or a
`# moeconf: gpus=CUDA0+CUDA1` directive), a well-formed name of a device it does not have is
reported too: the engine refuses it just the same.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "exps=cuda0"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "exps=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\.(3|4)\.ffn_.*_exps=CUDA3,exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines import HOST
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE007"
NAME = "unknown-device"
SEVERITY = "error"
NEEDS_MODEL = False


def check(ctx: Context) -> Iterator[Hit]:
    rpc = ctx.invocation.rpc_devices()
    for item in ctx.invocation.items():
        dev = item.device
        if dev is None or dev != dev.strip():
            continue
        where = ctx.at_item(item, len(item.text) - len(dev))
        why = ctx.engine.device_name_error(dev)
        if why:
            yield Hit(*where, f"{why}; fix the device after '='")
        elif dev.startswith("RPC") and dev not in rpc:
            known = ", ".join(rpc) or "none: there is no --rpc"
            yield Hit(*where, f"'{dev}' is not one of the RPC devices ({known}); add --rpc host:port before -ot")
        elif ctx.gpus_known and dev not in (HOST, *ctx.gpus, *rpc):
            have = ", ".join([HOST, *ctx.gpus, *rpc])
            yield Hit(*where, f"'{dev}' is not a device of this machine (it has {have}): the engine will list "
                      "its buffer types and exit; fix the name or `gpus` in .moeconf.toml")
