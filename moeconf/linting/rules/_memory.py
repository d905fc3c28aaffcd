"""Memory helpers shared by the memory rules (`memory-over-device`, `fit-conflict`): the line's
memory settings, the `moeconf fit` command for its GPUs, and what fit would place instead."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Any

from moeconf.linting.model import Context
from moeconf.model.inventory import format_ranges
from moeconf.units import GIB as GiB
from moeconf.units import MIB as MiB

if TYPE_CHECKING:
    from moeconf.memory import MemorySettings




def _size(n: int) -> str:
    return f"{n // GiB}GiB" if n % GiB == 0 else f"{n // MiB}MiB" if n % MiB == 0 else f"{n}B"  # fit needs a unit


def fit_command(ctx: Context, flags: list[str]) -> tuple[list[str], str]:
    """(fit's engine flags with the line's --rpc servers, the `moeconf fit` command for the
    line's devices and GPU sizes)."""
    ex, model, inv = ctx.explanation, ctx.inventory, ctx.invocation
    devices = [d for d in (ex.accelerators if ex is not None else ()) if d in ctx.gpu_memory]
    servers = [d[d.index("[") + 1:-1] for d in devices if d.startswith("RPC")]
    flags = [*flags, "--rpc", ",".join(servers)] if servers else list(flags)
    model_word = (model.source if model is not None and model.source else
                  inv.model.text if inv.model is not None else "MODEL")
    gpu_args = " ".join(f"--gpu {d}={_size(ctx.gpu_memory[d])}" if not d.startswith("RPC")
                        else f"--gpu '{d}={_size(ctx.gpu_memory[d])}'" for d in devices)
    engine_args = f" --engine {ctx.engine.name}" if ctx.engine.name != "llama.cpp" else ""
    if ctx.engine.version:
        engine_args += f" --engine-version {ctx.engine.version}"
    if ctx.reserve is not None:
        engine_args += f" --reserve {_size(ctx.reserve)}"
    return flags, f"moeconf fit {shlex.quote(model_word)} {gpu_args}{engine_args} {shlex.join(flags)}".rstrip()


def line_settings(ctx: Context) -> MemorySettings:
    """The line's memory settings (its flags and environment), read once per line and shared by
    every rule that reads them (`MemorySettings` is frozen)."""
    if "settings" not in ctx.cache:
        from moeconf.engines.llamaconfig import memory_env
        from moeconf.memory import DEFAULT_RESERVE, read_settings

        inv = ctx.invocation
        # llama.cpp's config files come before the environment (engines/llamaconfig.py)
        env = memory_env(inv.config, {k: v.text for k, v in inv.env.items()})
        reserve = ctx.reserve if ctx.reserve is not None else DEFAULT_RESERVE
        ctx.cache["settings"] = read_settings([a.text for a in inv.args], ctx.engine, env, reserve=reserve,
                                              binary=ctx.image_binary)
    settings: MemorySettings = ctx.cache["settings"]
    return settings


def line_estimate(ctx: Context) -> Any:
    """The line's memory per device (moeconf.memory.MemoryEstimate), computed once per line and
    shared by the memory rules; None when the model is unknown."""
    if "estimate" not in ctx.cache:
        from moeconf.sizing import estimate_explained

        ctx.cache["estimate"] = (estimate_explained(ctx.explanation, line_settings(ctx))
                                 if ctx.explanation is not None and ctx.inventory is not None else None)
    return ctx.cache["estimate"]


def over_devices(ctx: Context) -> list[str]:
    """The GPUs of [gpu_memory] whose predicted total is over their size on this line (what
    memory-over-device reports; [] when it cannot be stated)."""
    from moeconf.engines import AUTO_GPU

    if not ctx.gpu_memory or ctx.explanation is None or ctx.inventory is None:
        return []
    est = line_estimate(ctx)
    if est is None or not est.complete or AUTO_GPU in est.devices:
        return []
    return [d for d, size in ctx.gpu_memory.items() if d in est.devices and est.devices[d].total > size]


def fit_instead(ctx: Context) -> str:
    """What `moeconf fit` places for the GPU sizes of `[gpu_memory]` at the line's own memory
    settings, as a sentence for the finding; "" when a GPU's size or the model is unknown, or the
    line's settings cannot be given to fit as they are."""
    ex, model = ctx.explanation, ctx.inventory
    if not ctx.gpu_memory or ex is None or model is None or not ex.accelerators:
        return ""
    if any(d not in ctx.gpu_memory for d in ex.accelerators):
        return ""
    inv = ctx.invocation
    if inv.split_mode is not None and inv.split_mode.text != "layer":
        return ""
    from moeconf.engines.settings import settings_argv
    from moeconf.errors import MoeconfError
    from moeconf.fit import Budget, FitError, fit
    from moeconf.memory import read_settings

    settings = line_settings(ctx)
    reserve = settings.reserve
    flags = settings_argv(settings, ctx.engine)
    if settings.problems or read_settings(flags, ctx.engine, reserve=reserve) != settings:
        return ""
    from moeconf.emitting.argv import DEFAULT_BINARY

    # fit writes a llama-server line, which reserves fewer output rows than other binaries
    # (engines/settings.py server_outputs): its placement holds only for a line that reserves as many
    if read_settings(flags, ctx.engine, reserve=reserve, binary=DEFAULT_BINARY).n_outputs != settings.n_outputs:
        return ""
    budgets = [Budget(d, ctx.gpu_memory[d]) for d in ex.accelerators]
    model_word = inv.model.text if inv.model is not None else "MODEL"
    flags, command = fit_command(ctx, flags)
    try:
        res = fit(model, ctx.engine, budgets, flags, model_path=model.source or model_word,
                  plan_dir=os.path.dirname(os.path.abspath(ctx.path)), reserve=reserve,
                  serve_path=model_word)
    except FitError as e:
        return f". Instead, moeconf fit finds no placement for these GPU sizes: {e.message} ({command})"
    except MoeconfError:
        return ""
    # with several GPUs the -ot holds only with fit's own layer split: both are the advice
    from moeconf.engines.argvread import read_argv

    given_ts = read_argv(res.argv, ctx.engine).last("-ts")
    ts = f"-ts {given_ts.value.text} " if given_ts is not None and given_ts.value is not None else ""
    parts = []
    for d in ex.accelerators:
        layers = res.gpu_expert_layers.get(d, [])
        split = [f"{', '.join(k.removeprefix('ffn_').removesuffix('_exps') for k in kinds)} of block {il}"
                 for il, dev, kinds in res.split_layers if dev == d]
        held = (f"the routed experts of blocks {format_ranges(layers)}" if layers else "no whole expert layer")
        if split:
            held += " and the " + "; ".join(split)
        m = res.memory.devices[d]
        parts.append(f"{d} {held} (predicted {m.total / MiB:,.0f} of {ctx.gpu_memory[d] / MiB:,.0f} MiB)")
    return (f". Instead, for the GPU sizes in [gpu_memory], moeconf fit keeps every attention, shared-expert "
            f"and dense tensor on the GPU and gives {'; '.join(parts)}, the other routed experts in RAM: "
            f"{ts}-ot '{res.ot}' ({command})")
