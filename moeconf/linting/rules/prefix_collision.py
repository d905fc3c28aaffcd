r"""prefix-collision: a layer number that also takes other blocks (`blk\.1` takes blk.10-19).

Why: `-ot` regexes are searched, not anchored, so a block number must be closed by `\.`:
`blk\.1=CUDA0` takes blocks 1, 10-19 and 100+; `blk\.(1|2)` takes 1, 2, 10-29. The same holds
wherever a number stands for a block: `6.ffn_down_exps` (no `blk` at all) also takes blocks 16,
26, 36, ...; `blk.1.` takes blk.10-19 through its unescaped dots; `[1-4]\.` takes 11-14, 21-24,
... With the model known, the finding names the blocks the item really takes beyond the ones
its number says (and is silent when there are none); the fix writes `blk\.N\.`.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "blk\.1=CPU"

FAIL (engine=ik_llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "6.ffn_down_exps=CPU"

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk.1.=CUDA0,exps=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "blk\.1\.=CPU"

PASS (engine=ik_llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk.(0|1|2|3|4|5|6|7).ffn.=CUDA0,blk\.(2[5-9]|[3-6][0-9])\..*_exps\.=CPU"

PASS (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -ot "blk\.4[0-7]\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, explanation_index, item_tensors, matches, q, qfix
from moeconf.model.inventory import format_ranges

from ._patterns import LayerNumber, alternatives, layer_numbers

CODE = "MOE008"
NAME = "prefix-collision"
SEVERITY = "warning"
NEEDS_MODEL = False


_Compiled = list[tuple[int, str, list[LayerNumber], Callable[[str], bool] | None]]


def _fits_elsewhere(compiled: _Compiled, me: str, name: str, layer: int) -> bool:
    """Does another alternative of the item take this tensor as meant (no number, or its number)?"""
    for _, other, nums, m in compiled:
        if other is me or m is None or not m(name):
            continue
        if not nums or any(layer in n.meant for n in nums):
            return True
    return False


def check(ctx: Context) -> Iterator[Hit]:
    index = explanation_index(ctx) if ctx.explanation is not None else {}
    taken = item_tensors(ctx)
    n_layer = len(ctx.inventory.layers) if ctx.inventory is not None else 1000
    for raw_k, item in enumerate(ctx.invocation.items()):
        pat = item.pattern
        if not pat:
            continue
        alts = alternatives(pat)
        numbered = [(off, alt, layer_numbers(alt)) for off, alt in alts]
        if ctx.explanation is None or raw_k not in index:
            for off, alt, nums in numbered:
                for n in nums:
                    if not n.bounded:
                        fix = pat[:off] + n.fix(alt) + pat[off + len(alt):]
                        said = q(alt[n.prefix_start:n.end])
                        why = (f"{said} is not closed by '\\.', so it also matches longer block numbers "
                               "(blk.1 -> blk.10-19)") if n.prefix_start != n.start else (
                               f"{said} has no 'blk\\.' in front, so it also matches the end of longer block "
                               "numbers (6 -> 16, 26, ...)")
                        yield Hit(*ctx.at_item(item, off + n.end), f"{why}; write {qfix(fix)}")
            continue
        mine = taken.get(index[raw_k], [])
        compiled = [(off, alt, nums, matches(alt)) for off, alt, nums in numbered]
        for off, alt, nums, m in compiled:
            if not nums or m is None:
                continue
            meant = set().union(*(n.meant for n in nums))
            extra = [t for t in mine if t.layer is not None and t.layer not in meant and m(t.name)
                     and not _fits_elsewhere(compiled, alt, t.name, t.layer)]
            if not extra:
                continue
            n = nums[0]
            fixed_alt = alt
            for x in sorted(nums, key=lambda x: -x.start):
                fixed_alt = x.fix(fixed_alt)
            fix = pat[:off] + fixed_alt + pat[off + len(alt):]
            said = format_ranges(sorted(x for x in meant if x < n_layer)) or format_ranges(sorted(meant)[:3])
            also = format_ranges(sorted({t.layer for t in extra if t.layer is not None}))
            yield Hit(*ctx.at_item(item, off + n.end),
                      f"{q(alt[n.prefix_start:n.end])}{'' if alt == pat else ' in ' + q(pat)} means block(s) {said} "
                      f"but also takes blocks "
                      f"{also} ({len(extra)} tensors); write {qfix(fix)}")
