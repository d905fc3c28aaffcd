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
from moeconf.linting.rules._memory import fit_command, line_estimate, line_settings, over_devices

CODE = "MOE040"
NAME = "memory-over-device"
SEVERITY = "error"
NEEDS_MODEL = True
READS_SETTINGS = True  # skipped on a line the engine cannot read (flag-value-refused)

MiB = 1024 * 1024
_ROUGH = 128 * MiB  # more than the phase model is ever off from the replays (72 MiB at most measured)


def check(ctx: Context) -> Iterator[Hit]:
    if not ctx.gpu_memory or ctx.explanation is None or ctx.inventory is None:
        return
    from dataclasses import replace

    from moeconf.memory import estimate
    from moeconf.memory.settings import settings_argv

    settings = line_settings(ctx)
    est = line_estimate(ctx)
    # (none over where layers are split by free memory: which GPU holds what is not known, so
    # neither the total nor a fix can be stated; give -ts, or pin the GPUs in the config)
    over = over_devices(ctx)
    placement = ctx.explanation.placement
    for dev in over:
        size = ctx.gpu_memory[dev]
        m = est.devices[dev]
        short = m.total - size
        # routed-expert layers on this device, highest block first, moved to the CPU one at a time
        # and measured again (the compute buffer changes too), until the device fits
        experts: dict[int, list[str]] = {}
        for t in ctx.inventory.tensors:
            if t.group == "experts" and t.layer is not None and placement.devices.get(t.name) == dev:
                experts.setdefault(t.layer, []).append(t.name)
        devices = dict(placement.devices)
        moved: list[int] = []
        fits = False
        for il in sorted(experts, reverse=True):
            for n in experts[il]:
                devices[n] = "CPU"
            moved.append(il)
            # the phase model while searching (it is within tens of MiB of the allocator replays),
            # the replays to confirm
            rough = estimate(replace(placement, devices=devices), settings, replay=False).devices[dev].total
            if rough > size + _ROUGH:
                continue
            after = estimate(replace(placement, devices=devices), settings).devices[dev]
            if after.total <= size:
                fits = True
                break
        if fits:
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
