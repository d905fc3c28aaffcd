r"""unescaped-dot: a `.` that matches any character and so lets the item take more tensors.

Why: in a regex `.` matches any character. Usually that changes nothing (`blk\.3.ffn` takes the
same tensors as `blk\.3\.ffn`), and sometimes the dot deliberately stands for another
character (`ffn.exps` for `ffn_exps`): neither is reported. It is reported only when writing
the dot as `\.` would change the set of tensors the item takes, and then the message says which
tensors it also takes. With a layer number (`blk.1.` also takes blk.10-19) prefix-collision
says the same from the number's side.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.2.=CUDA0,exps=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.2\.=CUDA0,exps=CPU"

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\.3.ffn_up_exps=CPU,ffn.(up|down|gate)_exps=CPU"

PASS (engine=ik_llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk.(3|4|5|6).ffn.=CUDA0,ffn.*=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, describe, item_tensors, q, qfix, takes_if, where_item
from moeconf.linting.rules._patterns import unescaped_dots

CODE = "MOE009"
NAME = "unescaped-dot"
SEVERITY = "warning"
NEEDS_MODEL = True


def _escape(pattern: str, dots: list[int]) -> str:
    for pos in sorted(dots, reverse=True):
        pattern = pattern[:pos] + "\\." + pattern[pos + 1:]
    return pattern


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None
    taken = item_tensors(ctx)
    for k, it in enumerate(ctx.explanation.items):
        if it.raw_index is None or not taken.get(k):
            continue
        now = {t.name for t in taken[k]}
        widening, literal = [], []
        for pos in unescaped_dots(it.pattern):
            then = {t.name for t in takes_if(ctx, k, _escape(it.pattern, [pos]))}
            if then:  # empty: the dot stands for another character (ffn.exps): leave it
                literal.append(pos)
                if then != now:
                    widening.append(pos)
        if not widening:
            continue  # escaping changes nothing: style only
        fixed = _escape(it.pattern, literal)
        kept = {x.name for x in takes_if(ctx, k, fixed)}
        if not kept or not kept <= now:
            fixed = _escape(it.pattern, widening)
            kept = {x.name for x in takes_if(ctx, k, fixed)}
        extra = [t for t in taken[k] if t.name not in kept]
        if not extra:
            continue
        yield Hit(*where_item(ctx, k, widening[0]),
                  f"'.' in {q(it.pattern)} matches any character, so the item also takes {describe(extra)} "
                  f"(e.g. {extra[0].name}); write {qfix(fixed)}")
