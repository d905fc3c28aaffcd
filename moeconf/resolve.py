"""Resolve a plan against a model: every tensor -> device, and the rule that put it there.

Rules apply in order and later rules refine earlier ones; tensors no rule selects keep the
engine's default for the plan's `-ngl`. Names and devices are checked here, against the model
and the engine, with "did you mean" suggestions from the model's own names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moeconf.engines import AUTO_GPU, HOST, Engine
from moeconf.engines.simulate import default_devices, layer_gpus
from moeconf.model.inventory import Inventory, Tensor, format_ranges
from moeconf.model.taxonomy import GROUPS, _base_names
from moeconf.placement import Placement
from moeconf.plan import Plan
from moeconf.plan.rules import Rule, Span
from moeconf.planengine import gpu_devices, n_gpu_layers, plan_engine, plan_ik_split, rpc_devices

if TYPE_CHECKING:
    from moeconf.fill import FillMeasure

TARGET_WORDS = ("layer", "all")


@dataclass(frozen=True)
class Diagnostic:
    """A warning about a plan, with where it points."""

    message: str
    path: str
    line: int | None
    column: int | None
    rule: int | None = None
    # what it is about: "selects-nothing" (no tensor, or layers beyond the model), "overridden"
    # (a later rule re-places everything), "not-loaded", "engine" (engine-level notes)
    kind: str = "engine"

    def __str__(self) -> str:
        loc = self.path
        if self.line is not None:
            loc += f":{self.line}"
            if self.column is not None:
                loc += f":{self.column}"
        return f"{loc}: {self.message}"


def resolve_device(plan: Plan, eng: Engine, rule: Rule, word: str | None = None, span: Span | None = None) -> str:
    """The buffer type a rule's device word names (its last device, or `word` at `span`); a GPU
    the engine will not run (llama.cpp `-sm none` keeps only the main GPU) is refused there."""
    dev = _resolve_device(plan, eng, rule, word, span)
    flags = plan.config.flags
    gpus = gpu_devices(plan, eng)
    spread, _ = layer_gpus(eng, gpus, flags.split_mode, flags.main_gpu)
    if dev in gpus and dev not in spread:
        raise plan.error_at_rule(
            rule, rule.device_span if word is None or span is None else span,
            f"{dev} is not used with split_mode = \"none\": {eng.label} runs only "
            f"{spread[0] if spread else 'the CPU'} (main_gpu) and aborts at start when a tensor is on another "
            "device (\"pre-allocated tensor in a buffer that cannot run the operation\")",
            hint="drop split_mode = \"none\" to use several GPUs, or place these tensors on main_gpu's GPU")
    return dev


def _resolve_device(plan: Plan, eng: Engine, rule: Rule, word: str | None, span: Span | None) -> str:
    span = rule.device_span if word is None or span is None else span
    word = rule.device if word is None else word
    # gpu, gpu1, ...: the GPUs of engine.gpus in order, then the RPC servers of flags.rpc
    gpus = [*plan.config.engine.gpus, *rpc_devices(plan, eng)]
    low = word.lower()
    if low == "cpu":
        return HOST
    m = re.fullmatch(r"gpu(\d*)", low)
    if m:
        idx = int(m.group(1) or 0)
        if idx >= len(gpus):
            have = ", ".join(f"gpu{i} = {g}" for i, g in enumerate(gpus)) or "none"
            raise plan.error_at_rule(
                rule, span,
                f"{word} names accelerator #{idx}, but engine.gpus and flags.rpc give {len(gpus)} ({have})",
                hint="list your GPUs' buffer-type names in [engine] gpus = [\"CUDA0\", \"CUDA1\"]",
            )
        return str(gpus[idx])
    why = eng.device_name_error(word)
    if why:
        raise plan.error_at_rule(rule, span, f"unknown device: {why}",
                                 hint="devices are cpu, gpu, gpu1, ... or an exact buffer-type name")
    known = [HOST, *gpu_devices(plan, eng)]
    if word not in known:
        if word.startswith("RPC"):
            hint = "add the server to [flags] rpc = [\"host:port\"]"
        else:
            hint = f"add it to [engine] gpus (now {plan.config.engine.gpus})"
        raise plan.error_at_rule(
            rule, span,
            f"device {word!r} is not one this machine will have (known: {', '.join(known)})", hint=hint,
        )
    return word


def _group_is(group: str) -> Callable[[Tensor], bool]:
    return lambda t: t.group == group


def _base_is(base: str) -> Callable[[Tensor], bool]:
    return lambda t: t.base == base


def _suffixed(t: Tensor) -> str:
    return t.base + "." + t.name.rsplit(".", 1)[-1]


def _suffixed_is(word: str) -> Callable[[Tensor], bool]:
    return lambda t: _suffixed(t) == word


def _selector(plan: Plan, inv: Inventory, rule: Rule, warnings: list[Diagnostic]) -> Callable[[Tensor], bool]:
    bases = {t.base for t in inv.tensors}
    suffixed = {_suffixed(t) for t in inv.tensors}
    preds: list[Callable[[Tensor], bool]] = []
    for word, span in zip(rule.targets, rule.target_spans, strict=True):
        if word in GROUPS:
            preds.append(_group_is(word))
        elif word == "layer":
            preds.append(lambda t: t.layer is not None)
        elif word == "all":
            preds.append(lambda t: True)
        elif word in bases:
            preds.append(_base_is(word))
        elif word in suffixed:  # a kind with its suffix: ffn_up_exps.bias
            preds.append(_suffixed_is(word))
        else:
            block, top = _base_names()
            if word in block or word in top:
                warnings.append(_warn(plan, rule, span.start,
                                      f"tensor kind {word!r} does not occur in this model: the rule selects nothing"))
                preds.append(lambda t: False)
                continue
            import difflib  # here: only a wrong word needs it

            choices = [*GROUPS, *TARGET_WORDS, *sorted(bases)]
            close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]!r}?" if close
                    else f"groups: {', '.join(GROUPS)}; or a tensor kind such as ffn_up_exps")
            raise plan.error_at_rule(rule, span, f"unknown group or tensor kind {word!r}", hint=hint)
    if not preds:
        return lambda t: t.layer is not None
    return lambda t: any(p(t) for p in preds)


def _warn(plan: Plan, rule: Rule, offset: int, message: str, kind: str = "selects-nothing") -> Diagnostic:
    pos = plan.rule_positions[rule.index]
    return Diagnostic(message, plan.path, pos.line if pos else None,
                      (pos.column + 1 + offset) if pos else None, rule.index, kind)


def select(plan: Plan, inv: Inventory, rule: Rule, warnings: list[Diagnostic]) -> list[Tensor]:
    """The tensors a rule selects."""
    pred = _selector(plan, inv, rule, warnings)
    chosen = [t for t in inv.tensors if pred(t)]
    ls = rule.layers
    if ls is None:
        return chosen
    last_block = inv.block_count - 1
    if ls.form == "list":
        wanted: set[int] = set()
        for lo, hi in ls.spans:
            lo_i = 0 if lo is None else lo
            hi_i = last_block if hi is None else hi
            if lo_i > last_block or (hi is not None and hi > last_block):
                warnings.append(_warn(plan, rule, ls.span.start,
                                      f"the model's blocks are 0..{last_block}: layers beyond are ignored"))
            wanted.update(range(lo_i, min(hi_i, last_block) + 1))
        return [t for t in chosen if t.layer in wanted]
    if ls.form == "kind":
        assert ls.kind is not None
        of_kind = set(inv.layers_of_kind(ls.kind))  # recurrent: by mixer; moe/dense/nextn: by FFN
        return [t for t in chosen if t.layer is not None and t.layer in of_kind]
    with_group = sorted({t.layer for t in chosen if t.layer is not None})
    if len(with_group) < ls.count:
        warnings.append(_warn(plan, rule, ls.span.start,
                              f"only {len(with_group)} layers have what this rule selects; '{ls.form} {ls.count}' "
                              "takes them all"))
    picked = set(with_group[: ls.count] if ls.form == "first" else with_group[-ls.count :])
    return [t for t in chosen if t.layer in picked]


@dataclass(frozen=True)
class Resolution:
    placement: Placement
    warnings: tuple[Diagnostic, ...]
    selected: tuple[tuple[str, ...], ...]  # per rule: the tensors it selects
    decisive: tuple[tuple[str, ...], ...]  # per rule: the tensors whose device it decides
    # the -ts moeconf chose for a fill over several GPUs (layer counts per device), None: the plan's
    tensor_split: tuple[int, ...] | None = None
    # a fill's last measure of the placement it chose (the compiled command line's memory, where that
    # reads back to the same placement and settings: `Compiled.memory`)
    measured: FillMeasure | None = None


def locate_engine(plan: Plan) -> tuple[int | None, int | None]:
    from moeconf.plan.positions import locate

    pos = locate(plan.positions, ("engine", "gpus")) or locate(plan.positions, ("engine",))
    return (pos.line, pos.column) if pos else (None, None)


def _refuse_dropped_rules(plan: Plan, eng: Engine, devices: dict[str, str | None],
                          defaults: dict[str, str | None], decided_by: dict[str, int]) -> None:
    """The engine ignores every -ot with -ngl 0 or no GPU: a rule that would move a tensor cannot
    be honoured, so the plan is refused rather than compiled to rules that do nothing."""
    moved = [n for n, i in decided_by.items() if devices[n] != defaults[n]]
    if not moved:
        return
    rule = plan.rules[min(decided_by[n] for n in moved)]
    why = "-ngl is 0" if plan.config.engine.gpus or plan.config.flags.rpc else "there is no GPU"
    raise plan.error_at_rule(
        rule, Span(0, len(rule.text)),
        f"{eng.label} ignores every -ot rule when {why}: this rule would move tensors, but they would stay "
        "where -ngl puts them",
        hint="set [flags] n_gpu_layers (e.g. \"all\") and place what stays on the CPU with rules",
    )


def resolve(plan: Plan, inv: Inventory) -> Resolution:
    eng = plan_engine(plan)
    flags = plan.config.flags
    warnings: list[Diagnostic] = []
    devices_all = gpu_devices(plan, eng)
    spread, refused = layer_gpus(eng, devices_all, flags.split_mode, flags.main_gpu)
    if refused:
        raise plan.error_at_key(("flags", "main_gpu"), refused)
    defaults = default_devices(inv, eng, n_gpu_layers(plan), spread, flags.tensor_split, flags.split_mode,
                               plan_ik_split(plan, inv, eng, len(spread)))
    devices: dict[str, str | None] = dict(defaults)
    reasons: dict[str, str] = {n: "default" for n in devices}
    decided_by: dict[str, int] = {}
    selected: list[tuple[str, ...]] = []
    tensor_split: tuple[int, ...] | None = None
    measured: FillMeasure | None = None
    for rule in plan.rules:
        dev = resolve_device(plan, eng, rule)
        tensors = select(plan, inv, rule, warnings)
        selected.append(tuple(t.name for t in tensors))
        if not tensors:
            warnings.append(_warn(plan, rule, 0, "this rule selects no tensor of the model"))
            continue
        live = [t for t in tensors if defaults[t.name] is not None]
        if not live:
            warnings.append(_warn(plan, rule, 0, kind="not-loaded", message=
                                  f"{eng.name} does not load any tensor this rule selects "
                                  f"(nextn blocks {format_ranges(inv.layers_of_kind('nextn'))})"))
        for t in live:
            devices[t.name] = dev
            reasons[t.name] = f"rule {rule.index + 1}: {rule.text}"
            decided_by[t.name] = rule.index
    fills = [r for r in plan.rules if r.fill]
    if fills:
        from moeconf.fill import FillRequest, fill

        requests = [FillRequest(r, (*(resolve_device(plan, eng, r, w, sp) for w, sp in zip(r.fill, r.fill_spans,
                                                                                             strict=True)),
                                    resolve_device(plan, eng, r)),
                                tuple(n for n, k in decided_by.items() if k == r.index)) for r in fills]
        live_requests = [q for q in requests if q.tensors]
        if live_requests:
            overlay = {n: devices[n] for n in decided_by}
            sol = fill(plan, inv, eng, overlay, live_requests,
                       lambda w: resolve_device(plan, eng, fills[0], w, fills[0].device_span))
            measured = sol.measured
            if sol.tensor_split is not None:  # moeconf chose -ts: the defaults follow it
                tensor_split = sol.tensor_split
                defaults = sol.defaults
                devices = {**defaults, **overlay}
            for n, d in sol.devices.items():
                devices[n] = d
                reasons[n] = reasons[n] + f" (filled: {d})"
    decisive = [tuple(n for n, r in decided_by.items() if r == i) for i in range(len(plan.rules))]
    for rule, sel, dec in zip(plan.rules, selected, decisive, strict=True):
        if sel and not dec and any(defaults[n] is not None for n in sel):
            warnings.append(_warn(plan, rule, 0, "every tensor this rule selects is re-placed by a later rule",
                                  "overridden"))
    if any(d == AUTO_GPU for d in devices.values()):
        pos = locate_engine(plan)
        warnings.append(Diagnostic(
            f"tensors no rule places are spread over {', '.join(devices_all)} by the engine (by free memory): "
            "moeconf cannot predict which device each gets; set [flags] tensor_split to pin the split",
            plan.path, pos[0], pos[1]))
    if eng.ot_needs_gpu and (not devices_all or n_gpu_layers(plan) == 0) and plan.rules:
        _refuse_dropped_rules(plan, eng, devices, defaults, decided_by)
        pos = locate_engine(plan)
        warnings.append(Diagnostic(
            f"{eng.label} drops every -ot rule when -ngl is 0 or there is no GPU", plan.path, pos[0], pos[1]))
    placement = Placement(inv, eng, devices, defaults, reasons)
    return Resolution(placement, tuple(warnings), tuple(selected), tuple(decisive), tensor_split, measured)
