"""The one place that walks input and calls rules: files -> launches (or plans) -> contexts ->
findings, filtered by config and inline `# moeconf: ignore[...]` comments."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType

from moeconf.engines import Engine, engine
from moeconf.engines.cmdline import Arg, Invocation, parse_invocation
from moeconf.errors import MoeconfError
from moeconf.linting.model import Config, Context, Finding, Severity, find_config
from moeconf.linting.rules import ALL
from moeconf.linting.rules._base import Hit
from moeconf.linting.sources import Launch, SourceFile, file_directive, read_source, walk
from moeconf.model.inventory import Inventory, load_inventory

PLAN_INVALID: tuple[str, str, Severity] = ("MOE032", "plan-invalid", "error")
_IK_HINT = re.compile(r"ik[-_]llama", re.I)


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    launches: int = 0


class _Models:
    """Inventories loaded once per path."""

    def __init__(self) -> None:
        self.cache: dict[str, Inventory | MoeconfError] = {}

    def load(self, path: str) -> Inventory | MoeconfError:
        key = os.path.abspath(path)
        if key not in self.cache:
            try:
                self.cache[key] = load_inventory(key)
            except MoeconfError as e:
                self.cache[key] = e
        return self.cache[key]


def _engine_for(src: SourceFile, launch: Launch, config: Config) -> tuple[Engine, str]:
    name = file_directive(src, "engine", launch)
    version = file_directive(src, "version", launch) or file_directive(src, "engine_version", launch)
    if name:
        return engine(name, version or config.engine_version), "directive"
    if launch.image:
        tag = re.search(r":[^:]*-b(\d+)$", launch.image)
        if _IK_HINT.search(launch.image):
            return engine("ik_llama.cpp", version), "image"
        return engine("llama.cpp", f"b{tag.group(1)}" if tag else version), "image"
    binary = launch.args[0].text if launch.args and launch.has_binary else ""
    if binary and _IK_HINT.search(binary):
        return engine("ik_llama.cpp", version or config.engine_version), "binary"
    if config.engine:
        return engine(config.engine, config.engine_version), "config"
    return engine("llama.cpp", version), "default"


def _model_for(src: SourceFile, launch: Launch, inv: Invocation, config: Config, models: _Models,
               ) -> Inventory | MoeconfError | None:
    folder = os.path.dirname(os.path.abspath(src.path))
    directive = file_directive(src, "model", launch)
    if directive:
        return models.load(directive if os.path.isabs(directive) else os.path.join(folder, directive))
    m = inv.model
    if m is None:
        return None
    candidate = m.text if os.path.isabs(m.text) else os.path.join(folder, m.text)
    if os.path.isfile(candidate):
        return models.load(candidate)
    mapped = config.model_for(m.text)
    if mapped:
        return models.load(mapped)
    return None


def _suppressed(src: SourceFile | None, f: Finding) -> bool:
    if src is None:
        return False
    for line in (f.line, f.line - 1):
        d = src.directives.get(line)
        if not d or "ignore" not in d:
            continue
        if line == f.line - 1 and not src.lines[line - 1].lstrip().startswith("#"):
            continue
        names = {x.strip() for x in d["ignore"].split(",")}
        if f.name in names or f.code in names or "all" in names:
            return True
    return False


def _run_rules(ctx: Context, config: Config, rules: Sequence[ModuleType], plan: bool) -> list[Finding]:
    out: list[Finding] = []
    for rule in rules:
        if getattr(rule, "PLAN_ONLY", False) and not plan:
            continue
        if not config.enabled(rule.CODE, rule.NAME):
            continue
        if rule.NEEDS_MODEL and (ctx.inventory is None or ctx.explanation is None):
            continue
        hit: Hit
        groups: dict[object, list[Finding]] = {}
        for hit in rule.check(ctx):
            default: Severity = hit.severity or rule.SEVERITY
            sev = config.severity_of(rule.CODE, rule.NAME, default)
            f = Finding(rule.CODE, rule.NAME, sev, ctx.path, hit.line or ctx.line, hit.column or ctx.column,
                        hit.message)
            value = _value_of(ctx, f)
            groups.setdefault(f if value is None else (value, sev), []).append(f)
        for group in groups.values():
            out.append(_grouped(group))
    return out


def _value_of(ctx: Context, f: Finding) -> int | None:
    """Which -ot value (index) a finding points into, if any: findings of one rule on one value
    are shown as one, with a count."""
    for n, ov in enumerate(ctx.invocation.ot):
        line, start = ov.value.at(0)
        end_line, end = ov.value.at(len(ov.value.text))
        if line and line == end_line == f.line and start <= f.column <= end:
            return n
    return None


def _grouped(group: list[Finding]) -> Finding:
    """One finding for a rule's findings of one severity on one -ot value, with a count."""
    first = group[0]
    if len(group) == 1:
        return first
    return replace(first, message=f"{first.message} [and {len(group) - 1} more {first.name} finding"
                   f"{'s' if len(group) > 2 else ''} in this -ot value]")


def lint_launch(src: SourceFile, launch: Launch, config: Config, models: _Models,
                rules: Sequence[ModuleType] = ALL) -> list[Finding]:
    eng, how = _engine_for(src, launch, config)
    invocation = parse_invocation(launch.args, eng, launch.env)
    model = _model_for(src, launch, invocation, config, models)
    inventory = model if isinstance(model, Inventory) else None
    explanation = None
    gpus_directive = file_directive(src, "gpus", launch)
    from moeconf.explanation import assumed_gpus

    if gpus_directive:
        gpus = [g for g in gpus_directive.split("+") if g]
    elif config.gpus is not None:
        gpus = list(config.gpus)
    else:
        gpus = assumed_gpus(invocation)  # what `explain` simulates without --gpus: they agree
    gpus_known = bool(gpus_directive) or config.gpus is not None
    if inventory is not None:
        from moeconf.explanation import explain_invocation

        explanation = explain_invocation(inventory, invocation, gpus)
    ctx = Context(src.path, launch.line, launch.column, eng, invocation, inventory, explanation, gpus,
                  kind=launch.kind, engine_source=how, gpus_known=gpus_known)
    findings = _run_rules(ctx, config, rules, plan=False)
    if isinstance(model, MoeconfError):
        findings = [f for f in findings if f.name != "model-unknown"]
        findings.append(Finding("MOE000", "model-unknown", "info", src.path, launch.line, launch.column,
                                f"model could not be read ({model}); model-aware rules were skipped"))
    return findings


def lint_plan(path: str, config: Config, rules: Sequence[ModuleType] = ALL) -> list[Finding]:
    from moeconf.compile import compile_plan
    from moeconf.explanation import explain_invocation
    from moeconf.plan import load_plan
    from moeconf.plan.positions import locate

    code, name, sev = PLAN_INVALID
    try:
        plan = load_plan(path)
        compiled = compile_plan(plan)
    except MoeconfError as e:
        hint = f" ({e.hint})" if e.hint else ""
        return [Finding(code, name, sev, path, e.line or 1, e.column or 1, e.message + hint)]
    pos = locate(plan.positions, ("rules",)) or locate(plan.positions, ("model",))
    line, col = (pos.line, pos.column) if pos else (1, 1)
    keyed = {"-ngl": ("flags", "n_gpu_layers"), "-fit": ("flags", "fit"), "--fit": ("flags", "fit"),
             "-mqkv": ("flags", "merge_qkv"), "-muge": ("flags", "merge_up_gate"), "-sm": ("flags", "split_mode"),
             "--rpc": ("flags", "rpc"), "-ot": ("rules",)}
    args: list[Arg] = []
    for a in compiled.argv:
        p = locate(plan.positions, keyed[a]) if a in keyed else None
        args.append(Arg(a, path, p.line, p.column) if p else Arg(a, path))
    invocation = parse_invocation(args, compiled.engine)
    gpus = list(plan.config.engine.gpus)
    explanation = explain_invocation(compiled.inventory, invocation, gpus)
    ctx = Context(path, line, col, compiled.engine, invocation, compiled.inventory, explanation, gpus,
                  kind="plan", engine_source="config", plan=plan, plan_diagnostics=list(compiled.warnings),
                  gpus_known=True)
    return _run_rules(ctx, config, rules, plan=True)


def lint(paths: Sequence[str], config: Config | None = None, rules: Sequence[ModuleType] = ALL,
         overrides: dict[str, object] | None = None) -> LintResult:
    """Lint plan files and launch files (directories are searched). Findings are plain data.
    `config` replaces the `.moeconf.toml` search; `overrides` (engine, select, ignore) apply on
    top of whichever config is used."""
    result = LintResult()
    models = _Models()
    for p in paths:
        if not os.path.exists(p):
            raise MoeconfError("no such file or directory", path=p)
    for path in walk(list(paths)):
        cfg = config or find_config(path)
        if overrides:
            cfg = replace(cfg, **overrides)  # type: ignore[arg-type]
        result.files.append(path)
        if path.endswith(".toml"):
            if not _looks_like_plan(path):
                continue
            for f in lint_plan(path, cfg, rules):
                result.findings.append(f)
            continue
        try:
            src = read_source(path)
        except OSError as e:
            raise MoeconfError(f"cannot read: {e}", path=path) from None
        if src is None:
            continue
        for launch in src.launches:
            result.launches += 1
            for f in lint_launch(src, launch, cfg, models, rules):
                if not _suppressed(src, f):
                    result.findings.append(f)
    result.findings = sorted(set(result.findings), key=lambda f: (f.path, f.line, f.column, f.code, f.message))
    return result


def _looks_like_plan(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(20000)
    except OSError:
        return False
    return bool(re.search(r"^\s*rules\s*=", text, re.M)) and "[model]" in text
