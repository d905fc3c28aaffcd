"""memory-over-device: the launch needs more memory on a GPU than the GPU has.

Why: the engine loads, then runs out of memory at the first long prompt (or does not start).
moeconf predicts each device's memory from the command line as the engine computes it
(weights, KV cache, compute buffers, plus a reserve for the CUDA context, 1 GiB unless
`reserve` says otherwise) and compares it with the GPU sizes in `.moeconf.toml`
(`[gpu_memory]`, e.g. `CUDA0 = "24GiB"`). The finding says by how much, and how many more
routed-expert layers on the CPU would make it fit; `moeconf fit` writes the exact command.

FAIL (engine=llama.cpp, model=qwen3-30b-a3b, gpu_memory=CUDA0:16GiB):
    llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ctk q8_0 -ctv q8_0

PASS (engine=llama.cpp, model=qwen3-30b-a3b, gpu_memory=CUDA0:16GiB):
    llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ctk q8_0 -ctv q8_0 -ot "blk\\.(1?\\d)\\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit

CODE = "MOE040"
NAME = "memory-over-device"
SEVERITY = "error"
NEEDS_MODEL = True

MiB = 1024 * 1024


def check(ctx: Context) -> Iterator[Hit]:
    if not ctx.gpu_memory or ctx.explanation is None or ctx.inventory is None:
        return
    from moeconf.memory import DEFAULT_RESERVE, estimate_explained, read_settings

    inv = ctx.invocation
    settings = read_settings([a.text for a in inv.args], ctx.engine, {k: v.text for k, v in inv.env.items()},
                             reserve=ctx.reserve if ctx.reserve is not None else DEFAULT_RESERVE)
    est = estimate_explained(ctx.explanation, settings)
    if not est.complete:
        return
    devices = ctx.explanation.placement.devices
    for dev, size in ctx.gpu_memory.items():
        m = est.devices.get(dev)
        if m is None or m.total <= size:
            continue
        short = m.total - size
        # routed-expert layers on this device, highest block first: what moving them frees
        per_layer: dict[int, int] = {}
        for t in ctx.inventory.tensors:
            if t.group == "experts" and t.layer is not None and devices.get(t.name) == dev:
                per_layer[t.layer] = per_layer.get(t.layer, 0) + t.nbytes
        freed, moved = 0, []
        for il in sorted(per_layer, reverse=True):
            if freed >= short:
                break
            freed += per_layer[il]
            moved.append(il)
        if freed >= short:
            advice = (f"moving the routed experts of {len(moved)} more layer(s) to the CPU frees "
                      f"{freed / MiB:,.0f} MiB (e.g. blocks {min(moved)}-{max(moved)})")
        else:
            advice = "even with every routed expert on the CPU it does not fit: a smaller -c, -ctk/-ctv q8_0 or -ub"
        yield Hit(ctx.line, ctx.column,
                  f"{dev}: predicted {m.total / MiB:,.0f} MiB (weights {m.weights / MiB:,.0f}, KV {m.kv / MiB:,.0f}, "
                  f"compute {m.compute / MiB:,.0f}, reserve {m.reserve / MiB:,.0f}) is {short / MiB:,.0f} MiB over "
                  f"its {size / MiB:,.0f} MiB; {advice}; `moeconf fit MODEL --gpu {dev}={size / 2**30:g}GiB` "
                  "writes the command")
