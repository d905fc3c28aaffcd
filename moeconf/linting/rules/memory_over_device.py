"""memory-over-device: the launch needs more memory on a GPU than the GPU has.

Why: the engine loads, then runs out of memory at the first long prompt (or does not start).
moeconf predicts each device's memory from the command line as the engine computes it
(weights, KV cache, compute buffers, plus a reserve for the CUDA context, 1 GiB unless
`reserve` says otherwise) and compares it with the GPU sizes in `.moeconf.toml`
(`[gpu_memory]`, e.g. `CUDA0 = "24GiB"`). The finding says by how much, and how many more
routed-expert layers on the CPU would make it fit; `moeconf fit` writes the exact command.
Where it cannot state a total it says so (info) instead of passing in silence: memory moeconf
does not model, a GPU with no size, or layers llama.cpp splits over several GPUs by free memory
(no `-ts`); there what `-ot` pins to a GPU is still checked, as a lower bound.

FAIL (engine=llama.cpp, model=qwen3-30b-a3b, gpu_memory=CUDA0:16GiB):
    llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ctk q8_0 -ctv q8_0

PASS (engine=llama.cpp, model=qwen3-30b-a3b, gpu_memory=CUDA0:16GiB):
    llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ctk q8_0 -ctv q8_0 -ot "blk\\.(1?\\d)\\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from moeconf.engines import HOST
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.linting.rules._memory import fit_command, line_estimate, line_settings, over_devices
from moeconf.units import MIB as MiB

CODE = "MOE040"
NAME = "memory-over-device"
SEVERITY = "error"
NEEDS_MODEL = True
READS_SETTINGS = True  # skipped on a line the engine cannot read (flag-value-refused)



def check(ctx: Context) -> Iterator[Hit]:
    if not ctx.gpu_memory or ctx.explanation is None or ctx.inventory is None:
        return
    from moeconf.engines.settings import settings_argv

    settings = line_settings(ctx)
    est = line_estimate(ctx)
    yield from _unchecked(ctx, est, settings)
    over = over_devices(ctx)
    for dev in over:
        size = ctx.gpu_memory[dev]
        m = est.devices[dev]
        short = m.total - size
        found = _fewest_moved(ctx, settings, dev, size, short)
        if found is not None:
            moved, after = found
            advice = (f"moving the routed experts of {len(moved)} more layer(s) to the CPU (blocks "
                      f"{min(moved)}-{max(moved)}) brings it to {after.total / MiB:,.0f} MiB")
        else:
            # a quantized V cache needs flash attention (grok forces it off)
            kvq = "-ctk/-ctv q8_0" if est.flash_attn else "-ctk q8_0"
            advice = f"even with every routed expert on the CPU it does not fit: a smaller -c, {kvq} or -ub"
        _, command = fit_command(ctx, settings_argv(settings, ctx.engine))
        yield Hit(ctx.line, ctx.column,
                  f"{dev}: predicted {m.total / MiB:,.0f} MiB (weights {m.weights / MiB:,.0f}, KV {m.kv / MiB:,.0f}, "
                  f"compute {m.compute / MiB:,.0f}, reserve {m.reserve / MiB:,.0f}) is {short / MiB:,.0f} MiB over "
                  f"its {size / MiB:,.0f} MiB; {advice}; `{command}` writes the command")


def _fewest_moved(ctx: Context, settings: Any, dev: str, size: int, short: int) -> tuple[list[int], Any] | None:
    """The routed-expert layers on `dev`, highest block first, the fewest of which, moved to the CPU
    and measured again through the engine's graph (the compute buffer changes too), bring the device
    within `size`, with its memory then; None where even all of them do not. `short`: how far over the
    device is as it is. The first count measured is the fewest layers whose weights alone cover that;
    from there one layer at a time down while it still fits, else doubling steps up and halving back:
    every figure said is one the graph measured, at a count one fewer than which was measured over."""
    from dataclasses import replace

    from moeconf.memory import estimate
    from moeconf.memory.estimate import alloc_size

    assert ctx.explanation is not None and ctx.inventory is not None
    placement = ctx.explanation.placement
    experts: dict[int, list[str]] = {}
    for t in ctx.inventory.tensors:
        if t.group == "experts" and t.layer is not None and placement.devices.get(t.name) == dev:
            experts.setdefault(t.layer, []).append(t.name)
    order = sorted(experts, reverse=True)
    if not order:
        return None
    measured: dict[int, Any] = {}

    def moving(n: int) -> Any:
        """The device's memory with the routed experts of the first n layers of `order` on the CPU."""
        if n not in measured:
            devices = dict(placement.devices)
            devices.update((name, HOST) for il in order[:n] for name in experts[il])
            measured[n] = estimate(replace(placement, devices=devices), settings).devices[dev]
        return measured[n]

    def fits(n: int) -> bool:
        return n > 0 and moving(n).total <= size

    freed, n = 0, 0
    while n < len(order) and freed < short:
        freed += sum(alloc_size(ctx.inventory.by_name[name], dev) for name in experts[order[n]])
        n += 1
    if fits(n):
        while fits(n - 1):
            n -= 1
        return order[:n], moving(n)
    over_at, step = n, 1  # over_at: a count measured over
    while not fits(n):
        if n == len(order):
            return None
        over_at, n = n, min(n + step, len(order))
        step *= 2
    while n - over_at > 1:  # n fits
        mid = (over_at + n) // 2
        if fits(mid):
            n = mid
        else:
            over_at = mid
    return order[:n], moving(n)


def _unchecked(ctx: Context, est: Any, settings: Any) -> Iterator[Hit]:
    """What the check cannot state on this line, said instead of skipped: memory moeconf does not
    model, GPUs whose size the config does not give, and layers llama.cpp splits over the GPUs by
    their free memory (no -ts), where only what -ot pins to a GPU is known: its weights, KV cache
    and reserve, a lower bound, reported as an error when that alone is over."""
    from moeconf.engines import AUTO_GPU
    from moeconf.engines.settings import settings_argv

    if est is None:
        return
    used = [d for d in (ctx.explanation.accelerators if ctx.explanation is not None else ()) if d != AUTO_GPU]
    if not est.complete:
        why = est.notes[0] if est.notes else "memory is not modelled for this line"
        yield Hit(ctx.line, ctx.column, f"GPU memory not checked against [gpu_memory]: {why}", "info")
        return
    unsized = [d for d in used if d not in ctx.gpu_memory and d in est.devices]
    if unsized:
        add = f'add their sizes under [gpu_memory] in .moeconf.toml ({unsized[0]} = "24GiB", say)'
        yield Hit(ctx.line, ctx.column,
                  f"{', '.join(unsized)}: no size in [gpu_memory], memory not checked there; {add}", "info")
    if AUTO_GPU not in est.devices:
        return
    for dev, size in ctx.gpu_memory.items():
        m = est.devices.get(dev)
        if m is None or dev == AUTO_GPU:
            continue
        known = m.weights + m.kv + m.reserve
        if known > size:
            yield Hit(ctx.line, ctx.column,
                      f"{dev}: what -ot pins there alone needs {known / MiB:,.0f} MiB (weights {m.weights / MiB:,.0f}, "
                      f"{f'KV {m.kv / MiB:,.0f}, ' if m.kv else ''}reserve {m.reserve / MiB:,.0f}), "
                      f"{(known - size) / MiB:,.0f} MiB over its "
                      f"{size / MiB:,.0f} MiB before any layer llama.cpp splits there by free memory or any compute "
                      f"buffer; move some of it to another device or the CPU")
    sized = [d for d in ctx.gpu_memory if not d.startswith("RPC")]
    _, command = fit_command(ctx, settings_argv(settings, ctx.engine))
    yield Hit(ctx.line, ctx.column,
              f"GPU memory of the -ngl layers not checked: without -ts llama.cpp splits them over the GPUs by each "
              f"one's free memory when it starts, which moeconf cannot know; give -ts (`{command}` writes one"
              f"{' for ' + ', '.join(sized) if sized else ''})", "info")
