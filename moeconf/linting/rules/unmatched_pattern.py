r"""unmatched-pattern: an -ot item that matches no tensor the engine loads, and why.

Why: neither engine reports patterns that match nothing: the tensors simply stay where `-ngl`
put them, and VRAM runs out (or RAM sits idle) with no hint why. The finding says why when it
can tell, with a fix for that pitfall: a space inside the regex; `(0-9)` (a group matching the
text "0-9") for `[0-9]`; a kind this model does not have (`shexp` on Qwen3, the other MLA
layout: `attn_kv_b` where the GGUF has `attn_k_b`/`attn_v_b`, or the reverse); `_exp` for
`_exps`; experts asked of dense blocks (DeepSeek's 0-2 have `ffn_up`, no `_exps`); a block
beyond the model; a guide whose `.*` a web page ate (`ffn._exps`); a nextn block the engine
does not load.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "ffn._exps=CPU"

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "attn_kv_b=CPU,exps=CPU"

FAIL (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -ot "blk\.(0-9)\.ffn_.*_exps=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "ffn_.*_exps=CPU"
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit, matches, q, qfix, where_item
from moeconf.linting.rules._patterns import alternatives, layer_numbers
from moeconf.model.inventory import format_ranges

CODE = "MOE010"
NAME = "unmatched-pattern"
SEVERITY = "warning"
NEEDS_MODEL = True

# tensor-kind words people write, and what to write instead when the model lacks them
_KINDS = ("chexps", "shexp", "exps", "gate_inp", "attn_kv_b", "attn_k_b", "attn_v_b", "attn_q_a", "attn_q_b",
          "attn_qkv", "attn_kv_a_mqa", "ffn_gate_up", "attn_sinks", "exp_probs_b", "post_attention_norm", "nextn")


def number_range(lo: int, hi: int) -> str:
    """A regex for the block numbers lo..hi: `[0-9]`, `1[0-9]`, `([3-9]|1[0-2])`."""
    parts: list[str] = []
    n = lo
    while n <= hi:
        if n < 10:
            top = min(hi, 9)
            parts.append(f"[{n}-{top}]" if top > n else str(n))
        else:
            head, digit = divmod(n, 10)
            top = min(hi, head * 10 + 9)
            last = top % 10
            parts.append(f"{head}[{digit}-{last}]" if last > digit else str(n))
        n = top + 1
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def why(ctx: Context, pattern: str) -> str:
    assert ctx.inventory is not None and ctx.explanation is not None
    model = ctx.inventory.metadata.name or "the model"
    space = re.search(r"\s", pattern)
    if space:
        fixed = re.sub(r"\s+", "", pattern)
        return f"the regex contains a space (at {q(pattern[max(0, space.start() - 6):space.start() + 6])}), which " \
               f"no tensor name has; write {qfix(fixed)}"
    rng = re.search(r"\((\d+)-(\d+)\)", pattern)
    if rng and int(rng.group(1)) <= int(rng.group(2)) < 1000:
        written = number_range(int(rng.group(1)), int(rng.group(2)))
        fixed = pattern[:rng.start()] + written + pattern[rng.end():]
        return f"{q(rng.group(0))} is a group matching the text '{rng.group(0)[1:-1]}', not a range of numbers; " \
               f"write {qfix(fixed)}"
    m = matches(pattern)
    not_loaded: list[str] | None = ctx.cache.get("not_loaded")
    if not_loaded is None:
        devices = ctx.explanation.placement.devices
        not_loaded = ctx.cache["not_loaded"] = [t.name for t in ctx.inventory.tensors if devices[t.name] is None]
    unloaded = [n for n in not_loaded if m is not None and m(n)]
    if unloaded:
        return f"it matches only tensors {ctx.engine.name} does not load ({len(unloaded)}, e.g. {unloaded[0]})"
    has: dict[str, bool] | None = ctx.cache.get(NAME)
    if has is None:  # once per invocation: a line may have thousands of unmatched items
        names = [t.name for t in ctx.inventory.tensors]
        has = ctx.cache[NAME] = {k: any(k in n for n in names) for k in _KINDS}
    if "attn_kv_b" in pattern and not has["attn_kv_b"] and has["attn_k_b"]:
        return f"{model} has the split MLA tensors attn_k_b/attn_v_b (newer conversions), not attn_kv_b; write " \
               f"{qfix(pattern.replace('attn_kv_b', 'attn_(k|v)_b'))}"
    if re.search(r"attn_[kv]_b|attn_\(k\|v\)_b", pattern) and not has["attn_k_b"] and has["attn_kv_b"]:
        return f"{model} has the older MLA layout attn_kv_b (no attn_k_b/attn_v_b); write it with attn_kv_b"
    exp = re.search(r"_exp(?![s])", pattern)
    if exp and has["exps"]:
        fixed = pattern[:exp.end()] + "s" + pattern[exp.end():]
        return f"routed-expert tensors are named ..._exps; write {qfix(fixed)}"
    n_layer = len(ctx.inventory.layers)
    for _, alt in alternatives(pattern):
        for n in layer_numbers(alt):
            inside = sorted(x for x in n.meant if x < n_layer)
            if not inside:
                return f"{model} has blocks 0-{n_layer - 1}; {q(alt[n.prefix_start:n.end])} names none of them"
            moe = set(ctx.inventory.layers_with("experts"))
            if "exps" in alt and not set(inside) & moe:
                return f"block(s) {format_ranges(inside)} are dense (no routed experts: ffn_up/ffn_down/ffn_gate); " \
                       f"experts start at block {min(moe)}" if moe else f"{model} has no routed experts"
    for k in _KINDS:
        if k in pattern and not has[k] and not (k == "exps" and "chexps" in pattern):
            return f"{model} has no {k} tensors; see its names with `moeconf inspect MODEL --tensors`"
    if ("._" in pattern or "_." in pattern) and ".*" not in pattern:
        return "a '.*' may have been lost (write 'ffn_.*_exps')"
    return "see the names with `moeconf inspect MODEL --tensors`"


def check(ctx: Context) -> Iterator[Hit]:
    assert ctx.explanation is not None and ctx.inventory is not None
    model = ctx.inventory.metadata.name or "the model"
    for k, it in enumerate(ctx.explanation.items):
        if it.touches or it.raw_index is None:
            continue
        if it.pattern != it.pattern.lstrip():
            continue  # space-in-list says it better
        yield Hit(*where_item(ctx, k), f"{q(it.pattern)} matches no tensor of {model}: {why(ctx, it.pattern)}")
