r"""item-not-simulated: an -ot item that the placement check could not include.

Why: a finding-free report should mean every item was simulated. Items the engine refuses are
reported by their own rules (unknown-device, invalid-regex, missing-equals, ...); anything else
left out of the simulation is reported here rather than silently dropped: ik_llama.cpp ignores
every `-ot` and `--n-cpu-moe` rule when nothing is offloaded (`-ngl 0`), so the item is never
applied (an error: the placement is certainly not what the line says); otherwise moeconf says
it could not check the item (info).

FAIL (engine=ik_llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 0 -ot "exps=CPU"

PASS (engine=ik_llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 99 -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines import HOST
from moeconf.engines.regex import check_regex
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, q

CODE = "MOE027"
NAME = "item-not-simulated"
SEVERITY = "info"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    simulated = {it.raw_index for it in ctx.explanation.items}
    devices = {HOST, *ctx.gpus, *ctx.invocation.rpc_devices()}
    dropped = [n for n in ctx.explanation.notes if "drops every -ot" in n]
    for k, item in enumerate(ctx.invocation.items()):
        pat, dev = item.pattern, item.device
        if k in simulated or pat is None or dev is None or item.text != item.text.strip():
            continue
        if ctx.engine.device_name_error(dev) or check_regex(pat) is not None or dev not in devices:
            continue  # unknown-device, invalid-regex, unsupported-regex-syntax say why
        if dropped:
            yield Hit(*ctx.at_item(item), f"{q(item.text)} has no effect: {dropped[0]}; offload layers with "
                      "-ngl N (N > 0) or remove the -ot", "error")
        else:
            yield Hit(*ctx.at_item(item), f"{q(item.text)} could not be simulated, so nothing was checked for it; "
                      "see `moeconf explain`")
