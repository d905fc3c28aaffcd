r"""llama-config-placement: a llama.cpp config file changes where this launch puts tensors.

Why: llama.cpp (b10398+) reads /etc/llama.cpp/config.ini and ~/.config/llama.cpp/config.ini
(or $XDG_CONFIG_HOME's) before its environment and its command line. A value option there
(`n-gpu-layers`, `split-mode`, `tensor-split`, `device`, `fit`) counts when the line leaves it
out; a list option (`override-tensor`, `cpu-moe`, `n-cpu-moe`) is never replaced: the line's
`-ot` adds its items AFTER the config's, and the loader takes the first item that matches, so
the config's rule wins for every tensor both match. Reported only where the simulation with the
config differs from the line's own. Launches in containers and under llama-swap read their own
machine's files, which moeconf cannot see: they are not checked. Lint reads this machine's
files (`--llama-config PATH`, `--no-llama-config` to choose).

FAIL (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -ot "blk\.(0|1|2|3)\.ffn_.*_exps=CUDA0,exps=CPU"
    --- llama.cpp config.ini ---
    [*]
    cpu-moe = on

FAIL (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ot "exps=CPU"
    --- llama.cpp config.ini ---
    n-gpu-layers = 20

PASS (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"
    --- llama.cpp config.ini ---
    n-gpu-layers = 20
    ctx-size = 32768

PASS (engine=ik_llama.cpp, model=qwen3-30b-a3b):
    llama-server -m m.gguf -ngl 999 -ot "blk\.(0|1|2|3)\.ffn_.*_exps=CUDA0,exps=CPU"
    --- llama.cpp config.ini ---
    cpu-moe = on
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.units import gib

CODE = "MOE043"
NAME = "llama-config-placement"
SEVERITY = "warning"
NEEDS_MODEL = True


def check(ctx: Context) -> Iterator[Hit]:
    from moeconf.engines.cmdline import parse_invocation
    from moeconf.engines.llamaconfig import PLACEMENT, overridden_by
    from moeconf.explanation import explain_invocation

    inv = ctx.invocation
    applied = inv.config
    if applied is None or ctx.explanation is None or ctx.inventory is None:
        return
    env = {k: v.text for k, v in inv.env.items()}
    live = [s for s in applied.settings
            if s.option.first in PLACEMENT and overridden_by(s, inv.reading, env, ctx.engine) is None]
    if not live:
        return
    # the line alone: the same words and environment, no config file
    alone = explain_invocation(ctx.inventory, parse_invocation(inv.args, ctx.engine, inv.env), ctx.gpus)
    with_cfg = ctx.explanation
    moved = [t for t in ctx.inventory.tensors
             if with_cfg.placement.devices[t.name] != alone.placement.devices[t.name]]
    if not moved:
        return
    pairs = Counter((alone.placement.devices[t.name] or "not loaded", with_cfg.placement.devices[t.name]
                     or "not loaded") for t in moved)
    how = "; ".join(f"{a} -> {b}: {n}" for (a, b), n in pairs.most_common(3))
    if len(pairs) > 3:
        how += f"; and {len(pairs) - 3} more"
    said = ", ".join(f"{s.entry.key} = {s.entry.value} ({s.where})" for s in live)
    # the line's own rules that a config rule, tested first, beats
    lost: Counter[str] = Counter()
    for t in moved:
        k0 = alone.matched_by.get(t.name)
        k1 = with_cfg.matched_by.get(t.name)
        if k0 is None or k1 is None:
            continue
        before, after = alone.items[k0], with_cfg.items[k1]
        if "(config " in after.origin and "(config " not in before.origin:
            lost[f"'{before.pattern}={before.device}'"] += 1
    wins = ""
    if lost:
        first = ", ".join(f"{item} loses {n}" for item, n in lost.most_common(2))
        wins = (f"; the config's rules are tested before the line's (its -ot adds after them, never replaces "
                f"them) and win: {first}")
    yield Hit(ctx.line, ctx.column,
              f"llama.cpp's config file sets {said}: {len(moved)} tensor(s), {gib(sum(t.nbytes for t in moved))} "
              f"GiB, go elsewhere than this line alone says ({how}){wins}; move the setting onto the line, or out "
              "of the config file (`moeconf explain` shows both)")
