r"""dense-layer-to-cpu: the feed-forward of a dense (non-MoE) layer sent to the CPU.

Why: DeepSeek, Kimi and GLM start with dense layers whose FFN runs for every token. Rules like
`ffn_(up|down|gate)=CPU` or `blk\.[0-2]\.=CPU` meant for experts move them too.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.[0-9]\.ffn_(up|down|gate)=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.[0-9]\.ffn_(up|down|gate)_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, moved_to_cpu

CODE = "MOE015"
NAME = "dense-layer-to-cpu"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    return moved_to_cpu(ctx, "dense-layer FFNs", ("dense",),
                        "they run for every token (only routed experts belong in RAM)")
