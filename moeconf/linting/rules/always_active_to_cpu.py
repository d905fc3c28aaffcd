r"""always-active-to-cpu: attention, shared experts, router or norms sent to the CPU by a rule.

Why: routed experts are used by a few tokens each; attention, shared experts, the router and the
norms run for every token. Putting them in system RAM while a GPU has room slows every token;
the usual recipe keeps them on the GPU and moves only routed experts.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "shexp=CPU,exps=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import ALWAYS_ACTIVE, Hit, moved_to_cpu

CODE = "MOE014"
NAME = "always-active-to-cpu"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    return moved_to_cpu(ctx, "always-active tensors", ALWAYS_ACTIVE,
                        "they run for every token, keep them on the GPU")
