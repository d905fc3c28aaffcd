"""Fill rules (`experts -> gpu, gpu1, cpu`): the selected tensors go, layer by layer in the
plan's `[budget] policy` order, to the first device of the list whose predicted memory still
fits its `[budget]`; the last device takes the rest. A device that refuses a layer takes no
later one (each keeps a contiguous run of layers); with `split = true` it may first take part of
that layer by tensor kind (down, gate, up: each that still fits). Memory is the memory model's
(weights, KV cache, compute, reserve) for the plan's own flags, and the result is measured again
as a whole: where a device is still over, its last layer goes back."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from moeconf.engines import Engine
from moeconf.errors import PlanError
from moeconf.memory import MemoryEstimate, MemorySettings, estimate, parse_size, pipeline_parallel, read_settings
from moeconf.memory.estimate import alloc_size
from moeconf.model.inventory import Inventory, Tensor
from moeconf.placement import Placement
from moeconf.plan import Plan
from moeconf.plan.rules import Rule

MiB = 1024 * 1024
SPLIT_KINDS = ("ffn_down_exps", "ffn_gate_exps", "ffn_up_exps")


@dataclass(frozen=True)
class FillRequest:
    rule: Rule
    devices: tuple[str, ...]  # resolved, in preference order; the last takes the rest
    tensors: tuple[str, ...]  # what the rule still decides after later rules


def plan_settings(plan: Plan, eng: Engine) -> MemorySettings:
    """The memory settings of the command line the plan compiles to."""
    f = plan.config.flags
    argv: list[str] = []
    for flag, v in (("-c", f.ctx_size), ("-b", f.batch), ("-ub", f.ubatch), ("-ctk", f.cache_type_k),
                    ("-ctv", f.cache_type_v), ("-fa", f.flash_attn)):
        if v is not None:
            argv += [flag, str(v)]
    argv += list(f.extra)
    budget = plan.config.budget
    reserve = _size(plan, "reserve", budget.reserve) if budget is not None else 1024 * MiB
    return read_settings(argv, eng, reserve=reserve)


def _size(plan: Plan, key: str, text: str) -> int:
    try:
        return parse_size(text, key)
    except Exception as e:
        raise plan.error_at_key(("budget", key), str(e).split(": ", 1)[-1]) from None


def budgets(plan: Plan, device_of: Callable[[str], str]) -> dict[str, int]:
    """`[budget]` device keys resolved to buffer types -> bytes."""
    b = plan.config.budget
    if b is None:
        return {}
    out: dict[str, int] = {}
    for key, value in (b.model_extra or {}).items():
        if not isinstance(value, str):
            raise plan.error_at_key(("budget", key), "expected a size like \"24 GiB\"")
        try:
            dev = device_of(key)
        except PlanError as e:
            raise plan.error_at_key(("budget", key), e.message) from None
        out[dev] = _size(plan, key, value)
    return out


def fill(plan: Plan, inv: Inventory, eng: Engine, placement: Placement, requests: list[FillRequest],
         device_of: Callable[[str], str]) -> dict[str, str]:
    """Where each tensor of the fill rules goes: {tensor: device}."""
    budget = plan.config.budget
    sizes = budgets(plan, device_of)
    if budget is None:
        raise plan.error_at_rule(requests[0].rule, requests[0].rule.fill_spans[0],
                                 "a rule with several devices fills them up to their memory: add a [budget] table",
                                 hint='for example: [budget] gpu = "24 GiB"')
    for req in requests:
        for dev, span in zip(req.devices[:-1], req.rule.fill_spans, strict=True):
            if dev not in sizes:
                raise plan.error_at_rule(req.rule, span, f"no [budget] for {dev}: how much memory may it fill?",
                                         hint=f'for example: [budget] {req.rule.text[span.start:span.end]} = "24 GiB"')
    settings = plan_settings(plan, eng)
    if settings.problems:
        raise PlanError("; ".join(settings.problems), path=plan.path)
    devices = dict(placement.devices)
    accel = len({d for d in placement.defaults.values() if d not in (None, "CPU")})

    def measure(devs: Mapping[str, str | None]) -> MemoryEstimate:
        pl = Placement(inv, eng, dict(devs), placement.defaults, placement.reasons)
        overrides = any(devs[n] != d for n, d in placement.defaults.items())
        ngl = plan.config.flags.n_gpu_layers
        pipe = pipeline_parallel(pl, accel, -1 if ngl == "all" else ngl, plan.config.flags.split_mode, settings,
                                 overrides)
        return estimate(pl, settings, pipeline=pipe)

    def over(mem: MemoryEstimate) -> dict[str, int]:
        return {d: mem.devices[d].total - s for d, s in sizes.items()
                if d in mem.devices and mem.devices[d].total > s}

    base = measure(devices)
    if not base.complete:
        raise PlanError("fill rules need the model's memory, which cannot be computed: " + "; ".join(base.notes),
                        path=plan.path)
    short = over(base)
    if short:
        raise PlanError(shortfall_message(base, short, sizes), path=plan.path)
    free = {d: s - base.devices[d].total if d in base.devices else s for d, s in sizes.items()}
    placed: dict[str, list[list[str]]] = defaultdict(list)  # device -> units (tensor names), in order
    for req in requests:
        units = _units(inv, req.tensors, budget.policy)
        closed: set[str] = set()
        for unit in units:
            rest = list(unit)
            for dev in req.devices[:-1]:
                if dev in closed or not rest:
                    continue
                need = sum(alloc_size(inv.by_name[n], dev) for n in rest)
                if need <= free[dev]:
                    placed[dev].append(rest)
                    free[dev] -= need
                    for n in rest:
                        devices[n] = dev
                    rest = []
                    continue
                closed.add(dev)
                if budget.split:
                    part = _split(inv, rest, dev, free[dev])
                    if part:
                        placed[dev].append(part)
                        free[dev] -= sum(alloc_size(inv.by_name[n], dev) for n in part)
                        for n in part:
                            devices[n] = dev
                        rest = [n for n in rest if n not in part]
    # the whole model again: where a device is still over, its last unit goes to the rule's last device
    last_device = {n: req.devices[-1] for req in requests for n in req.tensors}
    while True:
        mem = measure(devices)
        bad = over(mem)
        if not bad:
            break
        for d in bad:
            if not placed[d]:
                raise PlanError(shortfall_message(mem, bad, sizes), path=plan.path)
            for n in placed[d].pop():
                devices[n] = last_device[n]
    return {n: devices[n] for req in requests for n in req.tensors if devices[n] is not None}  # type: ignore[misc]


def _units(inv: Inventory, names: tuple[str, ...], policy: str) -> list[list[str]]:
    by_layer: dict[int, list[str]] = defaultdict(list)
    glob: list[str] = []
    for n in names:
        t = inv.by_name[n]
        (by_layer[t.layer].append(n) if t.layer is not None else glob.append(n))
    order = sorted(by_layer, reverse=policy == "last")
    return ([glob] if glob else []) + [by_layer[il] for il in order]


def _split(inv: Inventory, names: list[str], dev: str, room: int) -> list[str]:
    tensors: list[Tensor] = [inv.by_name[n] for n in names]
    out: list[str] = []
    for kind in SPLIT_KINDS:
        for t in tensors:
            if t.base == kind:
                need = alloc_size(t, dev)
                if need <= room:
                    out.append(t.name)
                    room -= need
    return out


def shortfall_message(mem: MemoryEstimate, over: Mapping[str, int], budgets: Mapping[str, int]) -> str:
    """Which device is short, by how much, and what would make it fit."""
    parts = []
    for d, short in over.items():
        m = mem.devices[d]
        parts.append(f"{d} needs {m.total / MiB:,.0f} MiB (weights {m.weights / MiB:,.0f}, KV {m.kv / MiB:,.0f}, "
                     f"compute {m.compute / MiB:,.0f}, reserve {m.reserve / MiB:,.0f}) before any fill: "
                     f"{short / MiB:,.0f} MiB over its {budgets[d] / MiB:,.0f} MiB budget")
    s = mem.settings
    hints = []
    kv = sum(mem.devices[d].kv for d in over)
    if kv:
        hints.append(f"a smaller -c (the KV cache takes {kv / MiB:,.0f} MiB there; half the context, half of it)")
        if s.cache_type_k == "f16" or s.cache_type_v == "f16":
            hints.append("-ctk q8_0 -ctv q8_0 (about half the KV cache)")
    if s.n_ubatch > 128:
        hints.append(f"a smaller -ub (compute grows with it; -ub {s.n_ubatch // 2} roughly halves it)")
    hints.append("fewer layers on the GPU, or a smaller reserve if you know your driver's overhead")
    return "does not fit: " + "; ".join(parts) + ". What would help: " + "; ".join(hints)
