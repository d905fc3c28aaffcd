"""What a plan's `[engine]` and `[flags]` tell the engine before any rule is read: the engine
itself, its accelerators (RPC servers, then GPUs), `-ngl`, and ik_llama.cpp's layer split. Both
`moeconf.resolve` (rules -> devices) and `moeconf.fill` (budgets -> devices) read these, so they
sit below both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from moeconf.engines import Engine, engine, engine_device_order
from moeconf.model.inventory import Inventory
from moeconf.plan import Plan

if TYPE_CHECKING:
    from moeconf.iksplit import IkSplitSettings
    from moeconf.plan.model import Flags


def plan_engine(plan: Plan) -> Engine:
    cfg = plan.config.engine
    return engine(cfg.name, cfg.version)


def n_gpu_layers(plan: Plan) -> int:
    v = plan.config.flags.n_gpu_layers
    return -1 if v == "all" else int(v)


def rpc_devices(plan: Plan, eng: Engine) -> list[str]:
    fmt = "RPC0[{}]" if eng.rpc_indexed else "RPC[{}]"
    return [fmt.format(s) for s in plan.config.flags.rpc]


def gpu_devices(plan: Plan, eng: Engine) -> list[str]:
    """Every accelerator device the engine will have: RPC servers first (as llama.cpp adds them
    to the front of its device list), then local GPUs in the engine's order (CUDA0 before CUDA1,
    however `engine.gpus` lists them: `-ts` and `-mg` count in this order)."""
    return [*rpc_devices(plan, eng), *engine_device_order(plan.config.engine.gpus)]


def plan_memory_words(flags: Flags) -> list[str]:
    """The engine words for the memory settings a plan's `[flags]` fields set (`-c 32768 -fa on`),
    in the option table's order (engines/options.py); `[flags] extra` not included."""
    from moeconf.engines.options import options

    out: list[str] = []
    for o in options():
        if o.field is not None and o.setting is not None and o.section == "flags":
            v = getattr(flags, o.field)
            if v is not None:
                out += [o.flag, str(v)]
    return out


def plan_ik_settings(plan: Plan) -> IkSplitSettings | str:
    """What ik_llama.cpp's layer split depends on, from the plan's own context, batch, cache and
    `extra` flags (moeconf/iksplit.py); a str says why it cannot be predicted."""
    from moeconf.iksplit import read_ik_split_settings

    f = plan.config.flags
    words = ["--fit"] if f.fit else []
    return read_ik_split_settings([*words, *plan_memory_words(f), *f.extra])


def plan_ik_split(plan: Plan, inv: Inventory, eng: Engine, n_devices: int,
                  tensor_split: Sequence[float] | None = None) -> list[int] | None:
    """ik_llama.cpp's layer split over 2+ devices when the plan sets `tensor_split` (or the
    `tensor_split` given, for a split moeconf is choosing) in -sm layer; None when ik splits by
    free memory or the split cannot be predicted (the layers stay GPU(auto))."""
    f = plan.config.flags
    ts = tensor_split if tensor_split is not None else f.tensor_split
    if eng.name != "ik_llama.cpp" or n_devices < 2 or not ts or (f.split_mode or "layer") != "layer":
        return None
    from moeconf.iksplit import ik_layer_split

    settings = plan_ik_settings(plan)
    if isinstance(settings, str):
        return None
    split = ik_layer_split(inv, eng, settings, n_gpu_layers(plan), ts, n_devices)
    return None if isinstance(split, str) else split
