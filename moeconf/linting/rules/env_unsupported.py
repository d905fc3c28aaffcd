"""env-unsupported: placement set through environment variables the engine does not read.

Why: `LLAMA_ARG_OVERRIDE_TENSOR` exists only in mainline b7536+; `LLAMA_ARG_CPU_MOE` and
`LLAMA_ARG_N_CPU_MOE` only in mainline. ik_llama.cpp reads a short fixed list of `LLAMA_ARG_*`
(model, threads, context, batch, -ngl, flash attention, host, port, cache types...) and
ignores the rest without a word. Mainline's switch `LLAMA_ARG_CPU_MOE` acts only on
on/enabled/true/1, as written; any other value is ignored (`LLAMA_ARG_FIT` takes on or off and
stops the engine on any other word: a problem of the line itself).

FAIL (engine=ik_llama.cpp, file=.env):
    LLAMA_ARG_MODEL=/models/m.gguf
    LLAMA_ARG_OVERRIDE_TENSOR=exps=CPU

PASS (engine=llama.cpp, file=.env):
    LLAMA_ARG_MODEL=/models/m.gguf
    LLAMA_ARG_OVERRIDE_TENSOR=exps=CPU
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines.llamaconfig import FALSE_WORDS, TRUE_WORDS
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE023"
NAME = "env-unsupported"
SEVERITY = "error"
NEEDS_MODEL = False

IK_ENV = {
    "LLAMA_ARG_MODEL", "LLAMA_ARG_MODEL_URL", "LLAMA_ARG_MODEL_ALIAS", "LLAMA_ARG_HF_REPO", "LLAMA_ARG_HF_FILE",
    "LLAMA_ARG_THREADS", "LLAMA_ARG_CTX_SIZE", "LLAMA_ARG_N_PARALLEL", "LLAMA_ARG_BATCH", "LLAMA_ARG_UBATCH",
    "LLAMA_ARG_N_GPU_LAYERS", "LLAMA_ARG_THREADS_HTTP", "LLAMA_ARG_CHAT_TEMPLATE", "LLAMA_ARG_N_PREDICT",
    "LLAMA_ARG_ENDPOINT_METRICS", "LLAMA_ARG_ENDPOINT_SLOTS", "LLAMA_ARG_EMBEDDINGS", "LLAMA_ARG_FLASH_ATTN",
    "LLAMA_ARG_DEFRAG_THOLD", "LLAMA_ARG_CONT_BATCHING", "LLAMA_ARG_HOST", "LLAMA_ARG_PORT",
    "LLAMA_ARG_CACHE_TYPE_K", "LLAMA_ARG_CACHE_TYPE_V", "LLAMA_ARG_MLOCK", "LLAMA_ARG_K_CACHE_HADAMARD",
    "LLAMA_ARG_V_CACHE_HADAMARD",
}
PLACEMENT_ENV = ("LLAMA_ARG_OVERRIDE_TENSOR", "LLAMA_ARG_CPU_MOE", "LLAMA_ARG_N_CPU_MOE", "LLAMA_ARG_FIT",
                 "LLAMA_ARG_SPLIT_MODE", "LLAMA_ARG_TENSOR_SPLIT", "LLAMA_ARG_RPC")
_BOOL = frozenset({*TRUE_WORDS, *FALSE_WORDS})  # as written: the engine compares the words exactly


def check(ctx: Context) -> Iterator[Hit]:
    eng = ctx.engine
    for name, value in ctx.invocation.env.items():
        where = ctx.at_arg(value)
        if eng.name == "ik_llama.cpp":
            if name not in IK_ENV and name in PLACEMENT_ENV:
                yield Hit(*where, f"ik_llama.cpp does not read {name}: it is ignored silently; pass the "
                          "flag on the command line")
            continue
        if name == "LLAMA_ARG_OVERRIDE_TENSOR" and not eng.env_override_tensor:
            yield Hit(*where, f"{eng.label} does not read {name} (b7536+): it is ignored; use -ot")
        # (LLAMA_ARG_FIT's handler throws on any other word: the engine stops, a problem of the line, engines/cmdline)
        elif name == "LLAMA_ARG_CPU_MOE" and value.text not in _BOOL:
            yield Hit(*where, f"{name}={value.text!r} is not one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}: "
                      "the engine ignores it", "warning")
