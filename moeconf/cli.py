"""The `moeconf` command: argument parsing only. Each subcommand imports what it needs when it
runs, so `moeconf --help` and a pre-commit hook start in milliseconds."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from moeconf.errors import MoeconfError
from moeconf.textsafe import safe
from moeconf.units import GIB, MIB

if TYPE_CHECKING:
    from moeconf.engines import Engine
    from moeconf.engines.cmdline import Invocation
    from moeconf.engines.settings import MemorySettings
    from moeconf.explanation import Explanation
    from moeconf.fit import Budget, FitResult
    from moeconf.model.inventory import Inventory
    from moeconf.optimize import Optimized

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

BUG_HINT = "this is a bug in moeconf: please report it with the command line and the input files"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moeconf",
        description="Declarative, checked tensor placement for MoE models on llama.cpp and ik_llama.cpp.",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ins = sub.add_parser(
        "inspect",
        help="show a model's tensor inventory (GGUF, any shard, or a manifest)",
        description="Read a model's GGUF header (every shard of a split model) or a moeconf "
        "manifest and show its layers and tensor groups.",
    )
    ins.add_argument("model", help="a .gguf file (first or any shard) or a manifest .json")
    fmt = ins.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the full inventory as JSON")
    fmt.add_argument(
        "--manifest", action="store_true",
        help="write a manifest (a small JSON snapshot other commands accept in place of the GGUF)",
    )
    ins.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    ins.add_argument("--tensors", action="store_true", help="also list every tensor in the text summary")

    targets = ("llama.cpp", "ik_llama.cpp", "argv", "env", "docker", "compose", "llama-swap", "json", "ot")
    comp = sub.add_parser(
        "compile",
        help="compile a plan into verified -ot rules and the engine's command line",
        description="Resolve PLAN against its model, synthesize the shortest -ot rules that reproduce the "
        "placement (re-simulated before printing), and print them in the form a deployment needs.",
    )
    comp.add_argument("plan", help="plan.toml")
    comp.add_argument("--target", "-T", choices=targets, default=None,
                      help="output form (default: a command line for the plan's engine)")
    comp.add_argument("--model", metavar="PATH", help="use this GGUF or manifest instead of the plan's model")
    comp.add_argument("--json", action="store_true", help="same as --target json")
    comp.add_argument("--write", metavar="FILE", help="write the output to FILE (atomically)")
    comp.add_argument("-q", "--quiet", action="store_true", help="no summary on standard error")

    ini = sub.add_parser(
        "init",
        help="write a commented starter plan for a model",
        description="Write a starter plan: always-active tensors on the GPU, routed experts in system RAM.",
    )
    ini.add_argument("model", help="a .gguf file or a manifest .json")
    ini.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: standard output)")
    ini.add_argument("--engine", choices=["llama.cpp", "ik_llama.cpp"], default="llama.cpp",
                     help="the engine the plan is for (default: llama.cpp)")
    ini.add_argument("--force", action="store_true", help="overwrite an existing FILE")

    sub.add_parser("schema", help="print the plan JSON Schema", description="Print the plan file's JSON Schema.")

    lin = sub.add_parser(
        "lint",
        help="check plans and launch files for every known placement mistake",
        description="Lint plan files and the engine invocations in shell scripts, docker compose files, "
        "llama-swap configs, .env files and systemd units. Directories are searched.",
    )
    lin.add_argument("paths", nargs="+", metavar="PATH", help="plan, launch file or directory (searched)")
    lin.add_argument("--format", "-f", choices=["text", "json", "sarif"], default="text",
                     help="report format (default: text; sarif for code scanning)")
    lin.add_argument("--config", metavar="FILE", help="use this .moeconf.toml instead of searching upwards")
    lin.add_argument("--engine", choices=["llama.cpp", "ik_llama.cpp"], help="default engine (else the config's)")
    lin.add_argument("--fail-on", choices=["error", "warning", "info"], help="lowest severity that fails (exit 1)")
    lin.add_argument("--select", action="append", default=[], metavar="RULE", help="only these rules (code or name)")
    lin.add_argument("--ignore", action="append", default=[], metavar="RULE", help="skip these rules")
    lin.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE")
    _add_llama_config_options(lin)

    exp = sub.add_parser(
        "explain",
        allow_abbrev=False,
        usage="moeconf explain MODEL [options] [-- ENGINE ARGS...]",
        help="show where an engine command line puts every tensor of a model",
        description="Simulate the engine on MODEL with the given command line (after --) or -ot value, and "
        "show a layer x group map, GiB per device, which item matched what, and items that matched nothing.",
    )
    exp.add_argument("model", nargs="?", help="a .gguf file, a manifest .json or a remote model (docs/hub.md); "
                     "left out: the command line's own -m, or -hf [--hf-file] resolved as llama.cpp does")
    exp.add_argument("--ot", action="append", default=[], metavar="VALUE", help="an -ot value (repeatable)")
    exp.add_argument("--engine", choices=["llama.cpp", "ik_llama.cpp"], default="llama.cpp",
                     help="the engine to simulate (default: llama.cpp)")
    exp.add_argument("--engine-version", metavar="V",
                     help="llama.cpp: a build (b7600); ik_llama.cpp: a package version (0.1.5), the build its "
                     "log prints (b3871) or the commit date (2026-08-15) (default: newest known)")
    exp.add_argument("--gpus", metavar="LIST",
                     help="comma-separated buffer-type names of the machine's local GPUs (default: CUDA0 and every "
                     "well-formed GPU name the command line uses; --gpus= for none). Devices of --rpc servers in "
                     "the command line are added by the engine itself: a name given here too counts once")
    exp.add_argument("--env", action="append", default=[], metavar="K=V", help="environment variables the engine sees")
    exp.add_argument("--json", action="store_true", help="print placement, items and unmatched as JSON")
    exp.add_argument("--tensors", action="store_true", help="also list every tensor, its device and what decided it")
    exp.add_argument("--plan", metavar="FILE", help="write the equivalent plan (decompile) to FILE")
    exp.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                     help="colour the map by device (default: auto, on a terminal unless NO_COLOR is set)")
    exp.add_argument("--reserve", metavar="SIZE",
                     help="memory kept free per GPU for what no engine reports (default 1GiB; a card whose every part "
                     "was measured, named by --gpu-model or detected: the sum of its parts, docs/memory.md)")
    exp.add_argument("--host-cpu", choices=["auto", "amx", "plain"], default="auto",
                     help="the CPU the engine runs on: amx (llama.cpp packs CPU layers' matrices in a larger AMX "
                     "buffer) or plain; auto (default) detects this machine's")
    exp.add_argument("--budget", action="append", default=[], metavar="[NAME=]SIZE",
                     help="a GPU's memory, to show its budget and free memory and exit 1 when the command line "
                     "needs more: 24GiB (CUDA0, then CUDA1, ...), CUDA1=16GiB, 'RPC0[host:port]=18GiB'; "
                     "cpu=128GiB for system RAM (repeatable)")
    exp.add_argument("--traffic", action="store_true",
                     help="also show the bytes each device reads per generated token and the bytes copied between "
                     "devices per token and per prompt ubatch (docs/speed.md)")
    exp.add_argument("--depth", type=int, metavar="N",
                     help="the context depth of --traffic's generated token (default: the context, -c); implies "
                     "--traffic")
    exp.add_argument("--speed", action="store_true",
                     help="also predict prompt and generation tokens/s from the traffic and the machine, with their "
                     "expected error and assumptions (docs/speed.md); implies --traffic; any machine flag implies it")
    _add_llama_config_options(exp)
    _add_machine_options(exp)

    fit = sub.add_parser(
        "fit",
        # engine flags pass through after fit's own options: no abbreviations (--host is not --host-cpu)
        allow_abbrev=False,
        usage="moeconf fit MODEL --gpu [NAME=]SIZE [--gpu ...] [options] [ENGINE FLAGS...]",
        help="put as many routed-expert layers on the GPUs as their memory allows, and print the command",
        description="Solve the placement for GPU memory budgets: always-active tensors and the KV cache on the "
        "GPUs, routed experts on the GPUs layer by layer while each device's predicted memory (weights, KV, "
        "compute, reserve) fits, the rest in system RAM. Prints the command line and the memory table. Engine "
        "flags (-c, -b, -ub, -ctk, -ctv, -fa, -nkvo, -np, --swa-full, --rpc, ...) follow, as the engine takes "
        "them (a -- before them is allowed); the context, batch and cache types are never changed.",
    )
    fit.add_argument("model", help="a .gguf file, a manifest .json or a remote model (docs/hub.md: OWNER/REPO:TAG, "
                     "hf://OWNER/REPO/PATH.gguf, or OWNER/REPO for a table of its quants)")
    fit.add_argument("--gpu", action="append", default=[], metavar="[NAME=]SIZE", required=True,
                     help="a GPU's memory: 24GiB (CUDA0, then CUDA1, ...), CUDA1=16GiB, "
                     "'RPC0[host:port]=18GiB' (with --rpc host:port among the engine flags)")
    fit.add_argument("--engine", choices=["llama.cpp", "ik_llama.cpp"], default="llama.cpp",
                     help="the engine the command line is for (default: llama.cpp)")
    fit.add_argument("--engine-version", metavar="V", help="b7600, 0.1.5, ... (default: newest known)")
    fit.add_argument("--reserve", metavar="SIZE",
                     help="kept free per GPU for what no engine reports (default 1GiB; a card whose every part was "
                     "measured, named by --gpu-model or detected: the sum of its parts, docs/memory.md)")
    fit.add_argument("--ram", metavar="SIZE",
                     help="system RAM for what the GPUs leave (routed experts, host compute): checked after the fill, "
                     "less --ram-headroom")
    fit.add_argument("--ram-headroom", default="4GiB", metavar="SIZE",
                     help="of --ram, kept for the operating system, its services and page cache (default 4GiB)")
    fit.add_argument("--serve-path", metavar="PATH",
                     help="the model path in the printed command (as the server sees it; -m PATH among the engine "
                     "flags does the same); default: the GGUF given, or the file a manifest was made from")
    fit.add_argument("--target", "-T", choices=targets, default=None,
                     help="output form, as for compile (default: a command line for --engine)")
    fit.add_argument("--docker-volume", action="append", default=[], metavar="HOST:CONTAINER",
                     help="a volume for --target docker/compose (repeatable)")
    fit.add_argument("--host-cpu", choices=["auto", "amx", "plain"], default="auto",
                     help="the CPU the engine runs on, for host memory: amx (llama.cpp packs CPU layers' matrices "
                     "in a larger AMX buffer) or plain; auto (default) detects this machine's")
    fit.add_argument("--policy", choices=["first", "last"], default="first",
                     help="which expert layers go to the GPU first: the lowest blocks (default) or the highest")
    fit.add_argument("--no-split", action="store_true",
                     help="move whole layers only (default: one more layer per GPU may be split by kind)")
    fit.add_argument("-o", "--output", metavar="PLAN", help="write the solved plan (editable) to PLAN")
    fit.add_argument("-q", "--quiet", action="store_true",
                     help="no report on standard error: the command line or target alone, on standard output")
    fit.add_argument("--json", action="store_true",
                     help='print {"argv": [...], "ot": "...", "memory": {...}, "assumptions": {...}, ...}')
    fit.add_argument("--optimize", choices=["generation", "prompt", "balanced"],
                     help="fit every -ub of 512-4096 (and each --cache-types), print the trade-off table and the "
                     "setting best for the goal (docs/fit.md#the-trade-off-fit---optimize)")
    fit.add_argument("--cache-types", metavar="T[,T...]",
                     help="with --optimize: the KV cache types to try, K and V alike (default: the command's own)")
    _add_llama_config_options(fit)
    fit.add_argument("--speed", action="store_true",
                     help="also predict the fitted command's prompt and generation tokens/s on the machine, with their "
                     "expected error and assumptions (docs/speed.md); any machine flag implies it")
    _add_machine_options(fit)

    mac = sub.add_parser(
        "machine",
        help="show the machine a speed prediction assumes: GPUs, PCIe links, RAM bandwidth, cores, and their sources",
        description="Show what this machine reports (nvidia-smi, /proc, lscpu; dmidecode as root), what the flags and "
        "a plan's [machine] give, the card table's figures, and what is missing with the flag that gives it "
        "(docs/speed.md \"The machine\").",
    )
    mac.add_argument("--gpus", metavar="LIST",
                     help="the GPUs' buffer names, CUDA0,CUDA1,... (default: those nvidia-smi reports, or one per "
                     "--gpu-model name)")
    mac.add_argument("--plan", metavar="FILE", help="read the plan's [machine] table too (flags override it)")
    mac.add_argument("--json", action="store_true", help="print the description as JSON, each figure with its source")
    mac.add_argument("--probe", action="store_true", dest="probe_ram",
                     help="measure the host's memory bandwidth (same as --probe-ram)")
    mac.add_argument("--cards", action="store_true", help="print the card table and exit")
    _add_machine_options(mac)

    rul = sub.add_parser(
        "rule",
        help="print a lint rule's page: what it catches, why, a failing and a passing example",
        description="Print the page of the lint rule CODE (MOE008) or NAME (prefix-collision); "
        "without one, list every rule.",
    )
    rul.add_argument("rule", nargs="?", metavar="CODE", help="a rule's code or name")

    chk = sub.add_parser(
        "check",
        help="check that files written by `moeconf compile --write` are up to date",
        description="Find files generated by `moeconf compile --write` under PATHs (default: .), compile "
        "their plans again and fail with a diff when a file is stale.",
    )
    chk.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                     help="generated file or directory to search (default: .)")
    return p


def _add_machine_options(sub: argparse.ArgumentParser) -> None:
    from moeconf.machine_args import add_machine_arguments

    add_machine_arguments(sub)


def _add_llama_config_options(sub: argparse.ArgumentParser) -> None:
    g = sub.add_mutually_exclusive_group()
    g.add_argument("--llama-config", action="append", default=None, metavar="PATH",
                   help="a llama.cpp config.ini the engine reads (repeatable, in order), in place of the ones "
                   "llama.cpp finds itself (/etc/llama.cpp/config.ini, ${XDG_CONFIG_HOME:-~/.config}/llama.cpp/"
                   "config.ini; MOECONF_LLAMA_CONFIG=PATH[:PATH] does the same)")
    g.add_argument("--no-llama-config", action="store_true",
                   help="read no llama.cpp config file (as if none existed)")


def _llama_config(args: argparse.Namespace) -> Any:
    """llama.cpp's config files for a command run on this machine (engines/llamaconfig.py)."""
    from moeconf.engines.llamaconfig import load

    return load(args.llama_config, off=args.no_llama_config)


def _write_output(text: str, output: str | None) -> None:
    """Standard output, or FILE: atomically, regular files only (see moeconf.atomic)."""
    if output is None:
        sys.stdout.write(text)
        return
    from moeconf.atomic import write_output

    write_output(output, text)


def _load_model(spec: str) -> Inventory:
    """A MODEL argument: a GGUF, a manifest, or a remote model (moeconf.hub, with a progress line
    on standard error while headers are fetched)."""
    from moeconf.hub import is_remote, load_model

    if not is_remote(spec):
        return load_model(spec)
    from moeconf.hub.remote import stderr_progress

    progress = stderr_progress(f"moeconf: {safe(spec)}")
    try:
        return load_model(spec, progress=progress)
    finally:
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K")


def _remote(spec: str | None) -> bool:
    from moeconf.hub import is_remote

    return spec is not None and is_remote(spec) and not os.path.exists(spec)


def _cmd_inspect(args: argparse.Namespace) -> int:
    inv = _load_model(args.model)
    if args.manifest:
        from moeconf.model.manifest import dumps_manifest

        _write_output(dumps_manifest(inv), args.output)
    elif args.json:
        import json

        from moeconf.report.inventory import inventory_json

        _write_output(json.dumps(inventory_json(inv), indent=1) + "\n", args.output)
    else:
        from moeconf.report.inventory import render_summary

        _write_output(render_summary(inv, list_tensors=args.tensors), args.output)
    for w in inv.warnings:
        print(safe(f"moeconf: warning: {inv.source}: {w}"), file=sys.stderr)
    return EXIT_OK


def _cmd_compile(args: argparse.Namespace) -> int:
    from moeconf.compile import compile_plan, with_engine
    from moeconf.emitting.targets import emit
    from moeconf.plan import load_plan

    plan = load_plan(args.plan)
    target = "json" if args.json else (args.target or plan.config.engine.name)
    if target in ("llama.cpp", "ik_llama.cpp"):
        plan = with_engine(plan, target)
    # the bare -ot value needs no -m, so a manifest without serve_path is fine for it
    compiled = compile_plan(plan, model=args.model, need_model=target != "ot")
    text = emit(compiled, target)
    from moeconf.emitting.targets import container_warnings

    for w in container_warnings(compiled, target):
        print(f"moeconf: warning: {w}", file=sys.stderr)
    if args.write:
        from moeconf.report.compile import header_for, with_generated_by

        # paths relative to the folder the file really lands in (a link is followed by the write)
        folder = os.path.dirname(os.path.realpath(args.write))
        plan_rel = os.path.relpath(os.path.realpath(args.plan), folder)
        model_rel = (args.model if _remote(args.model) else os.path.relpath(os.path.realpath(args.model), folder)
                     ) if args.model else None
        text = with_generated_by(target, text, header_for(target, plan_rel, model_rel))
    _write_output(text, args.write)
    if not args.quiet:
        from moeconf.report.compile import summary

        print(summary(compiled), file=sys.stderr)
    return EXIT_OK


def _cmd_init(args: argparse.Namespace) -> int:
    from moeconf.plan.starter import starter_plan

    if args.output and os.path.lexists(args.output) and not args.force:
        raise MoeconfError("already exists (use --force to overwrite)", path=args.output)
    inv = _load_model(args.model)
    out_dir = os.path.dirname(os.path.abspath(args.output)) if args.output else os.getcwd()
    _write_output(starter_plan(inv, args.model, out_dir, args.engine, remote=_remote(args.model)), args.output)
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    import json

    from moeconf.plan.schema import plan_schema

    sys.stdout.write(json.dumps(plan_schema(), indent=2) + "\n")
    return EXIT_OK


def _cmd_lint(args: argparse.Namespace) -> int:
    from moeconf.linting.linter import lint
    from moeconf.linting.model import at_least, find_config, load_config_file
    from moeconf.report.lint import render

    config = None
    if args.config:
        config = find_config(args.config) if os.path.isdir(args.config) else load_config_file(args.config)
    result = lint(args.paths, config, overrides=_lint_overrides(args), llama_config=_llama_config(args))
    _write_output(render(result, args.format), args.output)
    if result.broken:
        # a file that cannot be read as its kind is a user error, not a finding (CI can tell them apart)
        print("moeconf: error: some input is broken (MOE090 input-invalid above); fix it and run again",
              file=sys.stderr)
        return EXIT_USAGE
    fail_on = args.fail_on or (config.fail_on if config else None)
    failing = [f for f in result.findings if at_least(f.severity, fail_on or "warning")]
    return EXIT_FINDINGS if failing else EXIT_OK


def _lint_overrides(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {}
    if args.engine:
        out["engine"] = args.engine
    if args.select:
        out["select"] = [x for s in args.select for x in s.split(",")]
    if args.ignore:
        out["ignore"] = [x for s in args.ignore for x in s.split(",")]
    return out


def _engine(args: argparse.Namespace) -> Engine:
    """The --engine at its checked --engine-version."""
    from moeconf.engines import engine, version_error

    bad_version = version_error(args.engine, args.engine_version)
    if bad_version:
        raise MoeconfError(f"--engine-version: {bad_version}")
    return engine(args.engine, args.engine_version)


def _model_and_engine(args: argparse.Namespace) -> tuple[Inventory, Engine]:
    """The MODEL argument's inventory and the --engine at its checked --engine-version."""
    eng = _engine(args)
    return _load_model(args.model), eng


def _line_model(inv: Invocation) -> str:
    """The MODEL a command line names itself: -hf REPO[:TAG] (with --hf-file: that file), else -m,
    each the last given, as the engine reads the line as the caller read it (linter.read_line: the
    config files and the environment under the words); a llama-bench line's from its test
    (linter.bench_test: llama-bench's own parser, a list of models is refused after: one test each)."""
    if inv.hf_repo is not None:
        repo = inv.hf_repo.text.split(":")[0]
        return f"hf://{repo}/{inv.hf_file.text}" if inv.hf_file is not None else inv.hf_repo.text
    if inv.model is not None:
        return inv.model.text
    raise MoeconfError("give MODEL, or a command line with -m or -hf")


def _cmd_explain(args: argparse.Namespace) -> int:
    import json

    from moeconf.engines.argvread import is_bench
    from moeconf.linting.linter import bench_test, lint_command, read_line
    from moeconf.report.explain import render

    eng = _engine(args)
    argv = list(args.engine_args)
    for v in args.ot:
        argv += ["-ot", v]
    env = {}
    for kv in args.env:
        k, eq, v = kv.partition("=")
        if not eq:
            raise MoeconfError(f"--env needs KEY=VALUE, not {kv!r}")
        env[k] = v
    llama_config = _llama_config(args)
    # the line is read once: a llama-bench line as llama-bench reads it (its test), any other as the
    # engine does; that reading names the model where MODEL is not given, and is what the memory and the
    # rules read
    bench = bench_test(argv, eng) if is_bench(argv) else None
    line_read = read_line(argv, eng, env, llama_config) if bench is None and args.model is None else None
    if args.model is None:
        read = bench if bench is not None else line_read
        assert read is not None
        args.model = _line_model(read)
    inv = _load_model(args.model)
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus is not None else None
    for g in gpus or ():
        why = eng.device_name_error(g)
        if why:
            raise MoeconfError(f"--gpus: {why}")
    bench_note, memory_argv = _bench_test(bench, argv, eng, env)
    # the simulation, and what `moeconf lint` says about the line (the same rules)
    ex, findings = lint_command(inv, eng, argv, env=env, gpus=gpus, llama_config=llama_config, bench=bench,
                                line=line_read)
    from dataclasses import replace

    from moeconf.engines import AUTO_GPU, HOST
    from moeconf.engines.llamaconfig import memory_env, report, report_lines
    from moeconf.memory import read_settings
    from moeconf.memory.amx import resolve_host_cpu
    from moeconf.report.memory import render_memory
    from moeconf.sizing import estimate_explained

    # llama.cpp's config files come before the environment (engines/llamaconfig.py)
    settings = read_settings(memory_argv, eng, memory_env(ex.invocation.config, env))
    # the machine a speed prediction reads (moeconf/machine.py): built where a machine flag is given
    # (which asks for the speed) or --traffic/--speed asks for the bytes a speed comes from
    args.machine = _command_machine(args, tuple(ex.accelerators),
                                    asked=bool(args.traffic or args.speed or args.depth is not None))
    reserve, reserve_note = _reserve(args, inv, settings)
    settings = replace(settings, reserve=reserve)
    est = estimate_explained(ex, replace(settings, host_cpu=resolve_host_cpu(args.host_cpu)))
    budgets = _budgets(args.budget, "--budget", allow_cpu=True)
    over = {d: est.devices[d].total - b for d, b in budgets.items()
            if d in est.devices and est.devices[d].total > b}
    unknown = [d for d in budgets if d not in est.devices and d not in ex.accelerators]
    if unknown:
        hint = ("; explain simulates CUDA0 and the GPUs the command line names or splits over (-ts): give the "
                "machine's with --gpus CUDA0,CUDA1,..." if gpus is None else "")
        raise MoeconfError(f"--budget {unknown[0]}: not a device of this command line (devices: "
                           f"{', '.join([HOST, *ex.accelerators])}){hint}")
    # a device of the line that holds nothing known: nothing at all, or layers split by free memory
    unchecked = [d for d in budgets if d not in est.devices and AUTO_GPU in est.devices]
    traffic, traffic_text = _explain_traffic(args, ex, settings)
    if args.plan:
        from moeconf.decompile import decompile
        from moeconf.explanation import assumed_gpus, local_gpus

        _write_output(decompile(ex, args.plan, args.model, local_gpus(
            ex.invocation, gpus if gpus is not None else assumed_gpus(ex.invocation))), args.plan)
    if args.json:
        out = ex.json()
        out["findings"] = [{k: v for k, v in f.json().items() if k not in ("path", "line")} for f in findings]
        out["memory"] = est.json()
        out["llama_config"] = report(ex.invocation)
        if not est.complete:  # KV and compute not computed: null, never a silent 0
            for dev in out["memory"].values():
                dev["compute"] = None
                if not est.kv_known:  # ik_llama.cpp on the newer architectures: KV computed, compute not
                    dev["kv"] = None
        out["memory_complete"] = est.complete
        out["memory_kv_complete"] = est.complete or est.kv_known
        out["memory_notes"] = list(est.notes) + ([reserve_note] if reserve_note else [])
        # per device, the terms that are estimated, not modelled exactly (ik_llama.cpp's compute, CUDA-only terms)
        out["memory_estimated"] = {d: list(m.estimated) for d, m in est.devices.items() if m.estimated}
        out["memory_problems"] = list(est.problems)
        out["server_caches"] = est.server.json() if est.server is not None else None
        if bench_note is not None:
            out["llama_bench"] = bench_note
        if traffic is not None:
            if "speed" in traffic:
                out["speed"] = traffic.pop("speed")
            out["traffic"] = traffic
        if args.machine is not None and not args.machine.empty():
            out["machine"] = args.machine.json()
        if budgets:
            out["budgets"] = budgets
            out["over_budget"] = over
            out["unchecked_budgets"] = unchecked
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty()
                                           and not os.environ.get("NO_COLOR"))
        sys.stdout.write(render(ex, color=color, tensors=args.tensors, findings=findings))
        for line in report_lines(report(ex.invocation)):
            sys.stdout.write(safe(line) + "\n")
        sys.stdout.write(render_memory(est, budgets, said=ex.all_refusals))
        if bench_note is not None:
            sys.stdout.write(f"  {bench_note['note']}\n")
        if reserve_note:
            sys.stdout.write(f"  {reserve_note}\n")
        if ex.invocation.binary is None and est.complete:
            # the binary decides the sequences and the output rows the compute buffer holds
            sys.stdout.write("  assumed: no binary named (llama-server, llama-cli, ...): one sequence and the whole "
                             "ubatch's output rows, as every binary but llama-server reserves; name the binary "
                             "first for llama-server's figures\n")
        if traffic_text:
            sys.stdout.write(traffic_text)
        for d, short in over.items():
            fix = ("more routed experts on the GPUs, or a smaller quant" if d == HOST
                   else "`moeconf fit` finds the placement that fits")
            sys.stdout.write(f"error: {d} needs {short / MIB:,.0f} MiB more than its {budgets[d] / MIB:,.0f} "
                             f"MiB budget: {fix}\n")
        for d in unchecked:
            sys.stdout.write(f"note: {d}'s budget cannot be checked: the engine splits layers over the GPUs by "
                             "free memory; give -ts to pin them\n")
    for w in inv.warnings:
        if "manifest version 1" in w:
            print(f"moeconf: warning: {inv.source}: {w}", file=sys.stderr)
    # an engine that would refuse (or stall on) the command line, or run out of memory, is a finding
    return EXIT_FINDINGS if ex.all_refusals or est.problems or over else EXIT_OK


def _bench_test(bench: Invocation | None, argv: list[str], eng: Engine,
                env: dict[str, str]) -> tuple[dict[str, Any] | None, list[str]]:
    """A llama-bench line (`bench`: its test as read, engines/benchline.py): (what explain says of its
    test, the test written as the common parser's line, which the memory settings read); any other
    line: (None, the line). A line of several tests, or one moeconf does not model, is refused, naming
    what to change."""
    if bench is None:
        return None, argv
    line = bench.bench
    assert line is not None  # a test of a llama-bench line carries the line (cmdline.bench_invocations)
    why = line.explain_refusal()
    if why is not None:
        raise MoeconfError(why)
    if env:
        raise MoeconfError("--env: llama-bench reads no LLAMA_ARG_* variable; give its own options")
    test = line.tests(limit=1)[0]
    words = [a.text for a in test.words()]
    names = [n for n, _ in line.contexts()]
    shown = ", ".join(f"{n} at context {c:,}" for n, c in line.contexts())
    note = (f"llama-bench: memory of the test with the largest context, {test.name} (context {test.context:,}; "
            f"llama-bench sets it to the test's -p + -n{' + -d' if eng.name == 'llama.cpp' else ''}); the line "
            + (f"runs {len(names)} tests ({shown}), each on the same placement" if len(names) != 1 else
               "runs this one test"))
    return ({"note": note, "test": test.name, "context": test.context, "tests": names,
             "command": words}, list(words))


def _explain_traffic(args: argparse.Namespace, ex: Explanation,
                     settings: MemorySettings) -> tuple[dict[str, object] | None, str]:
    """explain's traffic (moeconf/traffic.py) as JSON and text, where --traffic, --depth or --speed asks for
    it; with --speed, the predicted speeds (moeconf/speed.py) as the JSON's "speed" and lines after it."""
    speed = _speed_asked(args)
    if not args.traffic and args.depth is None and not speed:
        return None, ""
    from moeconf.report.traffic import render_traffic
    from moeconf.traffic import TrafficUnmodelled, traffic

    try:
        tr = traffic(ex.placement, settings, args.depth)
    except ValueError as e:
        raise MoeconfError(f"--depth: {e}") from None
    except TrafficUnmodelled as e:
        out: dict[str, object] = {"unmodelled": str(e)}
        if speed:
            out["speed"] = None
        return out, f"traffic: not given: {e}\n" + ("speed: not predicted: no traffic\n" if speed else "")
    js: dict[str, object] = tr.json()
    text = render_traffic(tr)
    if speed:
        from moeconf.report.speed import speed_report
        from moeconf.speed import predict

        tool = "llama-bench" if settings.binary is not None and "bench" in settings.binary else "llama-server"
        sj, st = speed_report(predict(tr, args.machine, tool=tool), args.machine)
        js["speed"] = sj
        text += st
    return js, text


def _reserve(args: argparse.Namespace, inv: Inventory, settings: MemorySettings) -> tuple[int, str | None]:
    """The reserve per GPU (memory/reserve.py): --reserve; else the largest over the machine's GPUs (a
    card named by --gpu-model or detection; none: unknown) of the reserve for that card: the sum of its
    parts where every part was measured on it (the H200), else the default margin, or the parts with the
    largest reported context where they come to more (a wide model's CUDA pool at a large -ub). A note
    says where the reserve is not the flat default."""
    from moeconf.memory import DEFAULT_RESERVE, parse_size

    if args.reserve is not None:
        return parse_size(args.reserve, "--reserve"), None
    from moeconf.memory.reserve import reserve_for

    names: list[str | None] = sorted({g.name for g in args.machine.gpus if g.name}) if args.machine else []
    card, r = max(((c, reserve_for(c, settings, inv)) for c in names or [None]), key=lambda cr: cr[1].size)
    parts = ", ".join(f"{p.name} {p.size / MIB:,.0f}" for p in r.parts)
    if r.basis == "parts":
        return r.size, (f"reserve: {r.size / MIB:,.0f} MiB per GPU, the parts measured on the {card} ({parts} "
                        "MiB; docs/memory.md); --reserve overrides")
    if r.size > DEFAULT_RESERVE:
        return r.size, (f"reserve: {r.size / MIB:,.0f} MiB per GPU, more than the default 1,024: its parts with "
                        f"the largest reported CUDA context come to that at -ub {settings.n_ubatch} ({parts} MiB; "
                        "docs/memory.md); --reserve overrides")
    return DEFAULT_RESERVE, None


def _speed_asked(args: argparse.Namespace) -> bool:
    """explain's and fit's speed prediction: asked by --speed or by any machine flag (a machine described
    for nothing else)."""
    from moeconf.machine_args import machine_flags_given

    return bool(getattr(args, "speed", False)) or machine_flags_given(args)


def _command_machine(args: argparse.Namespace, devices: tuple[str, ...], *, asked: bool) -> Any:
    """explain's and fit's machine (moeconf.machine.Machine) over the command's GPUs, or None where no
    machine flag is given and nothing asks for speed: nothing is read from the machine then."""
    from moeconf.machine_args import machine_flags_given

    if not asked and not machine_flags_given(args):
        return None
    from moeconf.engines import HOST
    from moeconf.machine import machine_from

    plan_values, where = _plan_machine(getattr(args, "machine_plan", None))
    return machine_from(args, tuple(d for d in devices if d != HOST), plan_values, plan_where=where)


def _plan_machine(path: str | None) -> tuple[dict[str, Any] | None, Any]:
    """A plan's [machine] table and where each key sits (None, None: no plan given); a plan without
    the table is an error, not a silent nothing."""
    if not path:
        return None, None
    from moeconf.plan import load_plan, plan_machine

    values, where = plan_machine(load_plan(path))
    if values is None:
        raise MoeconfError(f"{path}: the plan has no [machine] table (docs/speed.md \"The machine\")")
    return values, where


def _cmd_machine(args: argparse.Namespace) -> int:
    import json

    from moeconf.machine import Detected, machine_from
    from moeconf.report.machine import render_cards, render_machine

    if args.cards:
        sys.stdout.write(render_cards())
        return EXIT_OK
    plan_values, where = _plan_machine(args.plan)
    no_detect = args.no_detect or (plan_values or {}).get("detect") is False
    detected = Detected.none() if no_detect else Detected.here()
    if args.gpus is not None:
        devices = tuple(g.strip() for g in args.gpus.split(",") if g.strip())
    else:
        names = [m for m in (args.gpu_model or "").split(",") if m.strip()]
        plan_names = (plan_values or {}).get("gpu_model")
        n = max(len(names), len(detected.gpus or ()),
                len(plan_names) if isinstance(plan_names, list) else 1 if plan_names else 0)
        devices = tuple(f"CUDA{i}" for i in range(n))
    machine = machine_from(args, devices, plan_values, plan_where=where, detect=detected)
    if args.json:
        sys.stdout.write(json.dumps(machine.json(), indent=1) + "\n")
    else:
        sys.stdout.write(render_machine(machine))
    return EXIT_OK


def _budgets(values: list[str], flag: str, *, allow_cpu: bool = False) -> dict[str, int]:
    """`[NAME=]SIZE` values -> {buffer type: bytes}; unnamed ones are CUDA0, CUDA1, ... in order."""
    from moeconf.engines import HOST
    from moeconf.memory import parse_size

    out: dict[str, int] = {}
    for g in values:
        name, eq, size = g.rpartition("=")
        if not eq:
            name = f"CUDA{sum(1 for d in out if d.startswith('CUDA'))}"
        if allow_cpu and name.lower() == "cpu":
            name = HOST
        if name in out:
            raise MoeconfError(f"{flag} names {name} twice")
        out[name] = parse_size(size, f"{flag} {g}")
    return out


def _cmd_fit(args: argparse.Namespace) -> int:
    import json
    import shlex

    from moeconf.fit import Budget, fit, fit_plan_path, unlocated
    from moeconf.memory import parse_size
    from moeconf.memory.amx import resolve_host_cpu

    if _remote(args.model) and ":" not in args.model and not args.model.startswith(("hf://", "http")):
        return _cmd_fit_quants(args)  # OWNER/REPO with no tag: every quant of the repo
    inv, eng = _model_and_engine(args)
    sizes = _budgets(args.gpu, "--gpu")
    args.machine = _command_machine(args, tuple(sizes), asked=_speed_asked(args) or bool(args.optimize))
    given = {name: g.rpartition("=")[2] for name, g in zip(sizes, args.gpu, strict=True)}
    budgets = [Budget(d, size, given[d]) for d, size in sizes.items()]
    out_dir = os.path.dirname(os.path.abspath(args.output)) if args.output else os.getcwd()
    model_path = args.model if _remote(args.model) else os.path.relpath(os.path.abspath(args.model), out_dir)
    ram = parse_size(args.ram, "--ram") if args.ram else None
    headroom = parse_size(args.ram_headroom, "--ram-headroom")
    from moeconf.engines.llamaconfig import fit_flags

    # llama.cpp's config files (engines/llamaconfig.py): what they set, written into the command
    config_words, config_notes = fit_flags(_llama_config(args), eng, list(args.engine_args))
    for note in config_notes:
        print(safe(f"moeconf: note: {note}"), file=sys.stderr)
    from moeconf.memory import read_settings

    reserve, reserve_note = _reserve(args, inv, read_settings([*config_words, *args.engine_args], eng))
    if reserve_note:
        print(safe(f"moeconf: note: {reserve_note}"), file=sys.stderr)
    # the plan is a file only where -o writes it; otherwise errors in it are reported without a place
    plan_path = os.path.abspath(args.output) if args.output else fit_plan_path(out_dir, args.serve_path, args.model)
    fit_args = dict(model_path=model_path, plan_dir=out_dir, reserve=reserve,
                    policy=args.policy, split=not args.no_split, ram=ram, ram_headroom=headroom,
                    serve_path=args.serve_path, host_cpu=resolve_host_cpu(args.host_cpu),
                    plan_path=plan_path, docker_volumes=args.docker_volume)
    if args.cache_types and not args.optimize:
        raise MoeconfError("--cache-types is for --optimize: give the cache types to try with --optimize GOAL")
    opt = _fit_optimized(args, inv, eng, budgets, [*config_words, *args.engine_args], fit_args)
    result = opt.result if opt else fit(inv, eng, budgets, [*config_words, *args.engine_args], **fit_args)
    for note in result.notes:
        print(safe(f"moeconf: note: {note}"), file=sys.stderr)
    plan_text = result.plan_text
    target = args.target
    compiled = result.compiled
    # the plan (with its [targets]) was compiled once, by fit: the command line for another engine is refused
    if target in ("llama.cpp", "ik_llama.cpp") and target != eng.name:
        raise MoeconfError(f"--target {target}: fit solved for {eng.name}; use --engine {target}")
    if args.output:
        _write_output(plan_text, args.output)
    speed = _fit_speed(args, result)
    if args.json:
        out = result.json() | ({"optimize": opt.json()} if opt else {})
        if args.machine is not None and not args.machine.empty():
            out["machine"] = args.machine.json()
        if speed is not None:
            out["speed"] = speed[0]
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
        return EXIT_OK
    # the artifact alone on standard output (a command line, or the target's file); the report on
    # standard error (-q: none), so that `fit ... > file` writes exactly the artifact
    if target is not None and target not in ("llama.cpp", "ik_llama.cpp"):
        from moeconf.emitting.targets import container_warnings, emit

        try:
            text = emit(compiled, target)
        except MoeconfError as e:
            raise unlocated(e, plan_path) if not args.output else e from None
        sys.stdout.write(text)
        for w in container_warnings(compiled, target):
            print(safe(f"moeconf: warning: {w}"), file=sys.stderr)
    else:
        sys.stdout.write(shlex.join(result.argv) + "\n")
    sys.stdout.flush()
    if not args.quiet:
        if opt:
            from moeconf.report.optimize import render_optimized

            sys.stderr.write("\n" + render_optimized(opt))
        sys.stderr.write(_fit_report(args, result, inv, eng, budgets, ram, headroom))
        if speed is not None:
            sys.stderr.write(speed[1])
    return EXIT_OK


def _fit_speed(args: argparse.Namespace, result: FitResult) -> tuple[dict[str, Any] | None, str] | None:
    """The fitted command's predicted speeds (moeconf/speed.py) as JSON and text, where --speed or a
    machine flag asks; None otherwise."""
    if not _speed_asked(args):
        return None
    from moeconf.report.speed import speed_report
    from moeconf.speed import for_placement

    pred = for_placement(result.compiled.placement, result.memory.settings, args.machine)
    return speed_report(pred, args.machine)


def _fit_optimized(args: argparse.Namespace, inv: Inventory, eng: Engine, budgets: list[Budget],
                   user_argv: list[str], fit_args: dict[str, Any]) -> Optimized | None:
    """`fit --optimize GOAL` (moeconf/optimize.py): every setting solved, the table on standard error
    where no setting is chosen; None without --optimize."""
    if not args.optimize:
        return None
    from moeconf.optimize import cache_type_list, optimize
    from moeconf.report.optimize import render_optimized

    types = cache_type_list(args.cache_types, eng) if args.cache_types else None
    from moeconf.optimize import machine_predictor, no_predictor

    predictor = no_predictor if args.machine is None else machine_predictor(args.machine)
    opt = optimize(inv, eng, budgets, user_argv, args.optimize, cache_types=types, predictor=predictor, **fit_args)
    if opt.chosen is None:
        if not args.quiet and not args.json:
            sys.stderr.write(render_optimized(opt))
        raise MoeconfError(opt.why or "no setting chosen")
    return opt


def _fit_report(args: argparse.Namespace, result: FitResult, inv: Inventory, eng: Engine, budgets: list[Budget],
                ram: int | None, headroom: int) -> str:
    """What fit found, for a reader: each GPU's expert layers, the assumptions, the memory table."""
    from moeconf.engines import HOST
    from moeconf.fit import assumed_version
    from moeconf.model.inventory import format_ranges
    from moeconf.report.memory import render_memory

    lines = [""]
    for dev, layers in result.gpu_expert_layers.items():
        lines.append(f"{dev}: routed experts of {len(layers)} layer(s) ({format_ranges(layers)})")
    for il, dev, kinds in result.split_layers:
        lines.append(f"{dev}: also {', '.join(kinds)} of layer {il}")
    total_experts = sum(t.nbytes for t in inv.tensors if t.group == "experts")
    on_gpu = sum(t.nbytes for t in inv.tensors if t.group == "experts"
                 and result.compiled.placement.devices[t.name] not in (None, HOST))
    lines.append(f"routed experts on the GPUs: {on_gpu / GIB:.2f} of {total_experts / GIB:.2f} GiB")
    lines.append("")
    mib = MIB
    given_text = ", ".join(f"{b.device} {b.given} = {b.size / mib:,.0f} MiB" for b in budgets)
    version = assumed_version(eng) + ("" if eng.version else " (the newest moeconf knows; --engine-version to change)")
    lines += [f"assumed: {eng.name} {version}", f"assumed: GPU budgets {given_text}"]
    if isinstance(result.assumptions.get("model_path"), str):
        lines.append(f"assumed: {result.assumptions['model_path']}")
    if ram is not None:
        lines.append(f"assumed: RAM {args.ram} = {ram / mib:,.0f} MiB, less {headroom / mib:,.0f} MiB kept for the "
                     f"system (--ram-headroom): {(ram - headroom) / mib:,.0f} MiB for the model")
    # the assumptions head the table they were computed with
    cpu_budget = {HOST: ram - headroom} if ram is not None else {}
    return "\n".join(safe(line) for line in lines) + "\n" + render_memory(
        result.memory, {b.device: b.size for b in budgets} | cpu_budget)


def _cmd_rule(args: argparse.Namespace) -> int:
    from moeconf.report.lint import rule_index, rule_page

    if args.rule is None:
        sys.stdout.write(rule_index())
    else:
        sys.stdout.write(rule_page(args.rule))
    return EXIT_OK


def _cmd_fit_quants(args: argparse.Namespace) -> int:
    """`fit OWNER/REPO` with no tag: every quant of the repo solved for the same budgets, one table."""
    import json

    from moeconf.engines import engine, version_error
    from moeconf.fitquants import fit_quants, render_table
    from moeconf.hub.remote import stderr_progress
    from moeconf.memory import parse_size

    if args.output:
        raise MoeconfError("-o writes one plan: give the quant (OWNER/REPO:TAG) to write its plan")
    if args.optimize or args.cache_types:
        raise MoeconfError("--optimize solves one model: give the quant (OWNER/REPO:TAG)")
    bad_version = version_error(args.engine, args.engine_version)
    if bad_version:
        raise MoeconfError(f"--engine-version: {bad_version}")
    eng = engine(args.engine, args.engine_version)
    budgets = list(_budgets(args.gpu, "--gpu").items())
    machine = _command_machine(args, tuple(d for d, _ in budgets), asked=_speed_asked(args))
    ram = parse_size(args.ram, "--ram") if args.ram else None
    progress = stderr_progress(f"moeconf: {safe(args.model)}")
    try:
        table = fit_quants(args.model, eng, budgets, args.engine_args, plan_dir=os.getcwd(),
                           reserve=parse_size(args.reserve or "1GiB", "--reserve"), policy=args.policy,
                           split=not args.no_split, ram=ram, progress=progress,
                           machine=machine if _speed_asked(args) else None)
    finally:
        if sys.stderr.isatty():
            sys.stderr.write("\r\x1b[K")
    if args.json:
        sys.stdout.write(json.dumps(table.json(), indent=1) + "\n")
    else:
        sys.stdout.write(render_table(table))
    return EXIT_OK if table.largest_fitting is not None else EXIT_FINDINGS


def _cmd_check(args: argparse.Namespace) -> int:
    from moeconf.check import check_paths

    stale = check_paths(args.paths, sys.stdout)
    return EXIT_FINDINGS if stale else EXIT_OK


def _engine_flags_apart(parser: argparse.ArgumentParser, words: list[str]) -> tuple[list[str], list[str]]:
    """explain's and fit's words as (moeconf's, the engine's): a word that is exactly a flag of the
    engines' tables (moeconf/engines/flagtable.py) and not one of the command's own options goes to the
    engine with the values the table gives it. argparse alone read `-ot` as `-o t` and `-hf` as `-h f`
    (a short option with its value attached). Where a word is both (fit's `-o`, explain's `--color`),
    the command's own option takes it, as its help says."""
    import argparse as ap

    i = next((k for k, w in enumerate(words) if w in ("explain", "fit")), None)
    if i is None:
        return words, []
    from moeconf.engines.argvread import either_engine_values

    sub = next(a for a in parser._actions if isinstance(a, ap._SubParsersAction)).choices[words[i]]
    own = {o: a for a in sub._actions for o in a.option_strings}
    mine, theirs = words[: i + 1], []
    k = i + 1
    while k < len(words):
        w = words[k]
        if w in own:
            n = own[w].nargs
            take = 0 if own[w].nargs == 0 else 1 if n is None else n if isinstance(n, int) else 0
            mine += words[k: k + 1 + take]
            k += 1 + take
        elif (n_values := either_engine_values(words, k)) is not None:
            theirs += words[k: k + 1 + n_values]
            k += 1 + n_values
        else:
            mine.append(w)
            k += 1
    return mine, theirs


def run() -> NoReturn:
    """The `moeconf` process (the console script, `python -m moeconf`): `main`, then the exit. The
    interpreter's exit collects garbage over every object the command made (some 10^5 after a fit:
    the exit took 35-55 ms of CPU, 8 with them frozen): frozen first, they are left to the teardown."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    # a command makes some 10^5 objects and keeps most to the end: the cyclic collector's default
    # threshold (700 allocations) collected 78 times in a one-GPU fit and 333 in a two-GPU one (12 and
    # 70 ms of CPU). Collected every 100,000 instead, for this command only
    threshold = gc.get_threshold()
    gc.set_threshold(100_000, *threshold[1:])
    try:
        return _main(argv)
    finally:
        gc.set_threshold(*threshold)


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    words = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in words and ({"explain", "fit"} & set(words[: words.index("--")])):
        cut = words.index("--")
        words, tail = words[:cut], words[cut + 1:]
    # explain and fit take engine flags as they are (`-c 32768 -ctk q8_0 --rpc HOST:PORT`), with or
    # without a `--` before them: what moeconf's own options do not claim is the engine's
    words, engine_words = _engine_flags_apart(parser, words)
    tail = [*engine_words, *tail]
    args, extra = parser.parse_known_args(words)
    if extra and args.command not in ("explain", "fit"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.engine_args = [*extra, *tail]
    if args.version:
        from moeconf import __version__

        print(f"moeconf {__version__}")
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handlers = {"inspect": _cmd_inspect, "compile": _cmd_compile, "init": _cmd_init, "schema": _cmd_schema,
                "lint": _cmd_lint, "explain": _cmd_explain, "check": _cmd_check, "fit": _cmd_fit,
                "rule": _cmd_rule, "machine": _cmd_machine}
    try:
        return handlers[args.command](args)
    except MoeconfError as e:
        print(f"moeconf: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("moeconf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error. Silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # the guard: a bug is exit 3 with one line, never a traceback
        # (RecursionError and MemoryError included; SynthesisError and other invariants arrive here
        # as AssertionError.) MOECONF_DEBUG=1 re-raises for a traceback.
        if os.environ.get("MOECONF_DEBUG", "") not in ("", "0"):
            raise
        if isinstance(e, OSError) and e.filename is not None and not isinstance(e, BrokenPipeError):
            # the environment, not moeconf: a file that vanished or cannot be read
            name = os.fsdecode(e.filename) if isinstance(e.filename, (str, bytes)) else str(e.filename)
            print(f"moeconf: error: {safe(name)}: {safe(e.strerror or str(e))}", file=sys.stderr)
            return EXIT_USAGE
        print(f"moeconf: internal error: {type(e).__name__}: {safe(_short(e))}\n  {BUG_HINT} "
              "(MOECONF_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _short(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:  # a broken __str__ must not escape the guard
        text = "(no message)"
    return text if len(text) <= 500 else text[:500] + "..."


if __name__ == "__main__":
    sys.exit(main())
