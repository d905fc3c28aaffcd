"""The compiler: plan -> inventory -> Placement -> verified `-ot` items -> engine argv."""

from __future__ import annotations

import os
from dataclasses import replace

from moeconf.compiled import Compiled
from moeconf.engines import HOST, Engine, engine, version_error
from moeconf.errors import PlanError
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.plan import Plan, load_plan
from moeconf.plan.positions import locate
from moeconf.planengine import gpu_devices, rpc_devices
from moeconf.resolve import Diagnostic, resolve
from moeconf.synth.rules import check, synthesize


def with_engine(plan: Plan, name: str) -> Plan:
    """The plan retargeted at another engine (for `--target ik_llama.cpp` on a mainline plan)."""
    if plan.config.engine.name == name:
        return plan
    eng_cfg = plan.config.engine.model_copy(update={"name": name, "version": None})
    return replace(plan, config=plan.config.model_copy(update={"engine": eng_cfg}))


def compile_plan(plan: Plan | str | os.PathLike[str], *, model: str | None = None,
                 inventory: Inventory | None = None, need_model: bool = True) -> Compiled:
    """Compile a plan (a `Plan` or a path). `model` overrides the plan's model path;
    `inventory` skips reading the model; `need_model=False` lets a manifest without
    `serve_path` compile with no `-m` in the argv (for the bare `-ot` output). Raises
    `MoeconfError` subclasses on bad input and `SynthesisError` (an internal error) if the rules
    would not reproduce the placement."""
    from moeconf.emitting.argv import build_argv
    from moeconf.emitting.readback import verify_argv

    p = plan if isinstance(plan, Plan) else load_plan(plan)
    bad_version = version_error(p.config.engine.name, p.config.engine.version)
    if bad_version:
        raise p.error_at_key(("engine", "version"), bad_version)
    if inventory is not None:
        inv = inventory
    else:
        from moeconf.hub import is_remote, load_model

        spec = model or p.config.model.path
        remote = is_remote(spec) and not os.path.exists(p.resolve_path(spec))
        if not remote and model is None and not os.path.lexists(p.model_path):
            raw = p.config.model.path
            where = ("" if os.path.isabs(raw) else
                     f"; [model] path is relative to the plan's folder, {p.folder or '.'}, not to where moeconf runs")
            raise p.error_at_key(("model", "path"), f"[model] path {raw!r}: no such file: {p.model_path}{where}",
                                 hint="fix the path, or give the model with --model PATH")
        inv = load_model(spec) if remote else load_inventory(model or p.model_path)
    eng = engine(p.config.engine.name, p.config.engine.version)
    _check_flags(p, eng)
    extra_warnings = _check_extra(p, eng)
    res = resolve(p, inv)
    if res.tensor_split is not None:  # the -ts moeconf chose is the plan's from here on (argv, env, targets)
        flags = p.config.flags.model_copy(update={"tensor_split": [float(x) for x in res.tensor_split]})
        p = replace(p, config=p.config.model_copy(update={"flags": flags}))
    syn = synthesize(res.placement)
    check(res.placement, syn)
    argv = build_argv(p, eng, inv, syn, model_path=model, need_model=need_model)
    compiled = Compiled(p, eng, inv, res.placement, syn, tuple(argv), (*res.warnings, *extra_warnings),
                        measured=res.measured)
    # the whole command line, read as `explain` reads it: that reading is the compiled one's
    compiled = replace(compiled, explanation=verify_argv(compiled))
    _check_refused(compiled)
    _check_budgets(compiled)
    return compiled


def _check_refused(c: Compiled) -> None:
    """The settings `explain` would report the engine refuses (different K and V cache types on
    an MLA model, a quantized V cache with flash attention off, bad values): an error at the
    plan, never a printed command."""
    from moeconf.fill import plan_settings
    from moeconf.memory.estimate import refused_settings

    problems = refused_settings(c.inventory, c.engine, plan_settings(c.plan, c.engine))
    if problems:
        f = c.plan.config.flags
        key: tuple[str, ...] = ("flags",)
        if "flash attention off" in problems[0] and f.flash_attn is not None:
            key = ("flags", "flash_attn")
        elif "cache type" in problems[0]:
            key = ("flags", "cache_type_v" if f.cache_type_v is not None else "cache_type_k")
        raise c.plan.error_at_key(key, f"{c.engine.label} would refuse the compiled command: {problems[0]}",
                                  hint="; ".join(problems[1:]) or None)


def _check_budgets(c: Compiled) -> None:
    """A plan's `[budget]` holds whether or not a fill rule uses it: a device over its budget (by
    the memory model) is an error naming it, the shortfall and what would help."""
    if c.plan.config.budget is None:
        return
    sizes = c.budgets()
    if not sizes:
        return
    from moeconf.fill import DoesNotFit, shortfall_message

    mem = c.memory
    over = {d: mem.devices[d].total - b for d, b in sizes.items() if d in mem.devices and mem.devices[d].total > b}
    if over and mem.complete:
        raise DoesNotFit(shortfall_message(mem, over, sizes, when="with the plan's placement",
                                                  margin_kept=False), path=c.plan.path)


def _check_devices(plan: Plan, eng: Engine) -> None:
    """Every buffer-type name the compiled command line can carry, checked by the engine facts
    before anything is printed: a name the engine refuses is a plan error at its own line."""
    gpus = plan.config.engine.gpus
    for i, name in enumerate(gpus):
        why = eng.device_name_error(name)
        if why:
            raise plan.error_at_key(("engine", "gpus", i), f"engine.gpus: {why}",
                                    hint="write the buffer-type names the engine prints, e.g. "
                                    "gpus = [\"CUDA0\", \"CUDA1\"]")
        if name == HOST:
            raise plan.error_at_key(("engine", "gpus", i), "engine.gpus lists the CPU: it names accelerators only",
                                    hint="a CPU-only machine is gpus = []")
        if name in gpus[:i]:
            raise plan.error_at_key(("engine", "gpus", i), f"engine.gpus names {name!r} twice")
    for name in rpc_devices(plan, eng):
        why = eng.device_name_error(name)
        if why:
            raise plan.error_at_key(("flags", "rpc"), f"flags.rpc: {why}")
    if set(gpus) & set(rpc_devices(plan, eng)):
        raise plan.error_at_key(("engine", "gpus"), "engine.gpus names an RPC device that flags.rpc already adds",
                                hint="list only local GPUs in gpus; RPC servers go in [flags] rpc")


def _check_flags(plan: Plan, eng: Engine) -> None:
    _check_devices(plan, eng)
    f = plan.config.flags
    if f.merge_qkv and not eng.has_merge_qkv:
        raise plan.error_at_key(("flags", "merge_qkv"), f"{eng.name} has no --merge-qkv (an ik_llama.cpp flag)")
    if f.merge_up_gate and not eng.has_merge_up_gate:
        raise plan.error_at_key(("flags", "merge_up_gate"),
                                f"{eng.name} has no --merge-up-gate-experts (an ik_llama.cpp flag)")
    if f.split_mode and f.split_mode not in eng.split_modes:
        raise plan.error_at_key(("flags", "split_mode"),
                                f"{eng.label} has no -sm {f.split_mode} (it has {', '.join(eng.split_modes)})")
    if f.fit and plan.rules and eng.fit_with_overrides == "error":
        raise plan.error_at_key(("flags", "fit"), f"{eng.name} refuses --fit together with -ot "
                                "(\"Manual tensor overrides cannot be used with --fit\")",
                                hint="remove fit = true: the plan places tensors itself")
    if f.fit is not None and not eng.has_fit:
        raise plan.error_at_key(("flags", "fit"), f"{eng.label} has no --fit (mainline b7416+)")
    if f.tensor_split and len(f.tensor_split) > len(gpu_devices(plan, eng)):
        raise plan.error_at_key(("flags", "tensor_split"),
                                f"{len(f.tensor_split)} proportions for {len(gpu_devices(plan, eng))} devices")
    if not isinstance(plan.config.flags.n_gpu_layers, str) and plan.config.flags.n_gpu_layers < 0:
        raise PlanError("n_gpu_layers must be >= 0 or \"all\"", path=plan.path)


# Options a plan key owns that `[flags] extra` may still carry as written while that key is unset:
# they decide neither placement nor memory (moeconf fit passes a user's own flags through this way)
def _passable() -> dict[str, str]:
    from moeconf.engines.options import options, spellings

    keys = {n: str(o.field) for o in options() if o.field in ("threads", "host", "port") for n in o.names}
    load = [n for f in ("--no-mmap", "--mlock", "-lm") for n in spellings(f)]
    return {**keys, **dict.fromkeys((*load, "--mmap"), "load")}


_PASSABLE: dict[str, str] = _passable()


def _passable_key_set(plan: Plan, key: str) -> bool:
    f, t = plan.config.flags, plan.config.targets
    is_set: dict[str, bool] = {"threads": f.threads is not None, "host": t.host is not None,
                               "port": t.port is not None, "load": bool(f.no_mmap or f.mlock)}
    return is_set[key]


def _check_extra(plan: Plan, eng: Engine) -> list[Diagnostic]:
    """`[flags] extra`: options a plan key owns are refused (they would be a second, unsimulated
    copy the engine reads last), except the few that decide neither placement nor memory while
    their key is unset; options the engine does not know are refused as the engine refuses them
    (with the flag that was probably meant)."""
    from moeconf.engines.argvread import COMMON_ARG_BINARIES, closest_flag, scan_extra, unknown_flag_message
    from moeconf.engines.flags import PLAN_KEYS

    words = list(plan.config.flags.extra)
    owned, unknown = scan_extra(words, eng)
    for i, name in owned:
        if name in _PASSABLE and not _passable_key_set(plan, _PASSABLE[name]) and "=" not in words[i]:
            continue
        line, col = _extra_at(plan, i)
        raise PlanError(f"[flags] extra may not hold {words[i]!r}: moeconf writes that option from the plan's "
                        "own keys, and checks what it does", path=plan.path, line=line, column=col,
                        hint=f"use {PLAN_KEYS[name]}")
    binary = (plan.config.targets.binary or "llama-server").rsplit("/", 1)[-1].removesuffix(".exe")
    out = []
    for i, word in unknown:
        line, col = _extra_at(plan, i)
        if binary in COMMON_ARG_BINARIES:
            # the engine stops at an argument it does not know: never printed
            raise PlanError(f"[flags] extra: {unknown_flag_message(eng, word, closest_flag(eng, word))}",
                            path=plan.path, line=line, column=col)
        what = "an option" if word.startswith("-") else "an argument"
        out.append(Diagnostic(f"[flags] extra: {word!r} is not {what} {eng.name} is known to accept; passed through "
                              "unchecked", plan.path, line, col, kind="extra"))
    return out


def _extra_at(plan: Plan, i: int) -> tuple[int | None, int | None]:
    """Line and column of the first character of `[flags] extra`'s item i (or of the key)."""
    exact = plan.positions.get(("flags", "extra", i))
    if exact is not None:
        return exact.line, exact.column + 1  # the opening quote is at exact.column
    pos = locate(plan.positions, ("flags", "extra"))
    return (pos.line, pos.column) if pos else (None, None)
