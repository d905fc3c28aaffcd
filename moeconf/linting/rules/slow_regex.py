r"""slow-regex: a pattern whose matching time explodes (catastrophic backtracking).

Why: `std::regex` is a backtracking matcher. Nested or overlapping repetitions such as
`(.|.)*Q`, `(a+)+$` or `(ffn_.*)*x` take time exponential in the length of the tensor name when
the pattern fails to match: the engine tests every tensor name at load time and the load stalls
(libstdc++ 12 did not finish `(.|.)*Q` on one 24-character name in 20 s). moeconf matches such
patterns under a time limit: over the model's tensor names when the model is known, otherwise
over typical names.

FAIL (engine=llama.cpp):
    llama-server -m m.gguf -ot "(.|.)*Q=CPU"

PASS (engine=llama.cpp):
    llama-server -m m.gguf -ot "blk\.(1|2)\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines.regex import TimeBudget, ecmascript_search, provably_cheap
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, q

CODE = "MOE036"
NAME = "slow-regex"
SEVERITY = "error"
NEEDS_MODEL = False

# Names of the usual shapes and lengths, for when the model is not known.
_BASES = ("attn_q", "attn_kv_a_mqa", "ffn_up_exps", "ffn_down_shexp", "ffn_gate_inp", "exp_probs_b")
TYPICAL_NAMES = (
    *(f"blk.{il}.{base}.weight" for il in (0, 9, 61, 93) for base in _BASES),
    "token_embd.weight", "output_norm.weight", "output.weight",
)


def check(ctx: Context) -> Iterator[Hit]:
    names = [t.name for t in ctx.inventory.tensors] if ctx.inventory is not None else list(TYPICAL_NAMES)
    seen: set[str] = set()
    budget = TimeBudget()
    for item in ctx.invocation.items():
        pat = item.pattern
        if not pat or pat in seen:
            continue
        seen.add(pat)
        if provably_cheap(pat):
            continue  # matched in process, never timed out: only screened patterns can be slow
        found = ecmascript_search(pat, names, budget.limit())
        if not isinstance(found, frozenset) and found.kind == "slow":
            yield Hit(*ctx.at_item(item), f"{q(pat)}: {found.message}")
