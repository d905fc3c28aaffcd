"""The one place that walks input and calls rules: files -> launches (or plans) -> contexts ->
findings, filtered by config and inline `# moeconf: ignore[...]` comments."""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from moeconf.engines import Engine, engine, version_error
from moeconf.engines.argvread import Arg, read_argv
from moeconf.engines.cmdline import Invocation, parse_invocation
from moeconf.engines.llamaconfig import LlamaConfig
from moeconf.engines.options import row
from moeconf.errors import MoeconfError
from moeconf.linting.model import Config, Context, Finding, Severity, find_config
from moeconf.linting.rules import ALL
from moeconf.linting.rules._base import Hit
from moeconf.linting.sources import Launch, Note, SourceFile, file_directive, kind_of, not_regular, read_source, walk
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

PLAN_INVALID: tuple[str, str, Severity] = ("MOE032", "plan-invalid", "error")
# findings about the input itself rather than a rule (codes are part of the interface)
INPUT_INVALID: tuple[str, str, Severity] = ("MOE090", "input-invalid", "error")  # exit 2: the file is broken
INPUT_SKIPPED: tuple[str, str, Severity] = ("MOE091", "input-skipped", "info")
CANNOT_CHECK: tuple[str, str, Severity] = ("MOE092", "cannot-check", "info")
FINDINGS_CAPPED: tuple[str, str, Severity] = ("MOE093", "findings-capped", "info")
TOO_MANY_OVERRIDES: tuple[str, str, Severity] = ("MOE094", "too-many-overrides", "error")
META = (INPUT_INVALID, INPUT_SKIPPED, CANNOT_CHECK, FINDINGS_CAPPED, TOO_MANY_OVERRIDES)
_NOTE_KIND = {"invalid": INPUT_INVALID, "skipped": INPUT_SKIPPED, "cannot-check": CANNOT_CHECK,
              "capped": FINDINGS_CAPPED}
MAX_ITEMS = 4095  # -ot items checked per value (mainline's own limit)
MAX_ITEM_CHARS = 8192  # longest -ot item checked (a real one is under a few hundred characters)
MAX_PER_RULE = 20  # -ot values (or places outside one) one rule reports on per engine invocation
MAX_PER_FILE = 200  # findings per file
_IK_HINT = re.compile(r"ik[-_]llama", re.I)


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    launches: int = 0

    @property
    def broken(self) -> bool:
        """Some input could not be read as its kind (exit 2, whatever else was found)."""
        return any(f.code == INPUT_INVALID[0] for f in self.findings)


class _Models:
    """Inventories loaded once per path."""

    def __init__(self, roots: Sequence[str] = ()) -> None:
        self.cache: dict[str, Inventory | MoeconfError] = {}
        self.roots = [os.path.realpath(r) for r in roots]

    def inside(self, path: str) -> bool:
        """Whether `path` lies in the tree being linted (messages may quote only those files)."""
        real = os.path.realpath(path)
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in self.roots)

    def load_remote(self, spec: str, *, offline: bool = False, ref: object = None) -> Inventory | MoeconfError:
        """A remote model (moeconf.hub), resolved as the engine resolves -hf; loaded once."""
        key = f"remote:{offline}:{ref or spec}"
        if key not in self.cache:
            from moeconf.hub import load_model
            from moeconf.hub.ref import RemoteRef

            try:
                if isinstance(ref, RemoteRef):
                    from moeconf.hub.remote import load

                    self.cache[key] = load(ref, offline=offline)
                else:
                    self.cache[key] = load_model(spec, offline=offline)
            except MoeconfError as err:
                self.cache[key] = err
        return self.cache[key]

    def load(self, path: str) -> Inventory | MoeconfError:
        from moeconf.hub import is_remote

        if is_remote(path) and not os.path.exists(path):
            return self.load_remote(path)
        key = os.path.abspath(path)
        if key not in self.cache:
            what = not_regular(key)
            if what is not None:
                self.cache[key] = MoeconfError(f"not read: {what}, not a regular file", path=key)
                return self.cache[key]
            try:
                self.cache[key] = load_inventory(key)
            except MoeconfError as err:
                # never quote a file outside the linted tree (its bytes may be anything)
                kind = "a moeconf manifest" if key.endswith(".json") else "a GGUF file"
                self.cache[key] = err if self.inside(key) else MoeconfError(f"not {kind} moeconf can read", path=key)
            except (OSError, ValueError, RecursionError, MemoryError) as e:
                self.cache[key] = MoeconfError(f"cannot read: {type(e).__name__}", path=key)
        return self.cache[key]


def _engine_for(src: SourceFile, launch: Launch, config: Config) -> tuple[Engine, str]:
    name = file_directive(src, "engine", launch)
    version = file_directive(src, "version", launch) or file_directive(src, "engine_version", launch)

    def configured(engine_name: str) -> str | None:
        # the config's version belongs to the config's engine only
        same = config.engine is not None and _canonical(config.engine) == _canonical(engine_name)
        return version or (config.engine_version if same else None)

    if name:
        return _engine(name, configured(name), directive=version is not None), "directive"
    if launch.image:
        tag = re.search(r":[^:]*-b(\d+)$", launch.image) if len(launch.image) < 1024 else None
        if _IK_HINT.search(launch.image):
            return _engine("ik_llama.cpp", version, directive=version is not None), "image"
        return _engine("llama.cpp", f"b{tag.group(1)}" if tag else version,
                       directive=version is not None and not tag), "image"
    binary = launch.args[0].text if launch.args and launch.has_binary else ""
    if binary and _IK_HINT.search(binary):
        return _engine("ik_llama.cpp", configured("ik_llama.cpp"), directive=version is not None), "binary"
    if config.engine:
        return _engine(config.engine, configured(config.engine), directive=version is not None), "config"
    return _engine("llama.cpp", version, directive=version is not None), "default"


def _canonical(name: str) -> str:
    return "ik_llama.cpp" if name in ("ik_llama.cpp", "ik_llamacpp", "ik") else name


def _model_for(src: SourceFile, launch: Launch, inv: Invocation, config: Config, models: _Models,
               ) -> Inventory | MoeconfError | None:
    folder = os.path.dirname(os.path.abspath(src.path))
    directive = file_directive(src, "model", launch)
    if directive:
        return models.load(directive if os.path.isabs(directive) else os.path.join(folder, directive))
    if inv.hf_repo is not None:
        return _hf_model(inv, config, models)
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


def _hf_model(inv: Invocation, config: Config, models: _Models) -> Inventory | MoeconfError | None:
    """The model of a `-hf REPO[:TAG]` (`--hf-file FILE`) line: mapped in [models] (by the -hf
    value), else resolved as the engine resolves it (moeconf.hub: the Hub, or the caches when
    offline). ik_llama.cpp 0.1.5 has no tag resolution: `-hfr REPO` needs `-hff FILE` or `-m FILE`
    (`gpt_params_handle_model_default` in its common/common.cpp)."""
    from moeconf.hub.names import split_repo_tag
    from moeconf.hub.ref import RemoteRef

    assert inv.hf_repo is not None
    repo_text = inv.hf_repo.text
    for arg in (inv.hf_repo, inv.hf_file):
        depends = getattr(arg, "depends", "") if arg is not None else ""
        if depends:
            return MoeconfError(f"the -hf model depends on {depends}")
    mapped = config.model_for(repo_text)
    if mapped:
        return models.load(mapped)
    file = inv.hf_file.text if inv.hf_file is not None else None
    if inv.engine.name == "ik_llama.cpp":
        file = file or (inv.model.text if inv.model is not None else None)
        if not file:
            return MoeconfError(f"{inv.engine.name} needs --hf-file (or -m) with --hf-repo {repo_text}: it has no "
                                "tag resolution and refuses to start")
        return models.load_remote(repo_text, offline=inv.offline, ref=RemoteRef(repo=repo_text, file=file))
    try:
        repo, tag = split_repo_tag(repo_text)
    except ValueError as e:
        return MoeconfError(str(e))
    ref = RemoteRef(repo=repo, file=file) if file else RemoteRef(repo=repo, tag=tag or None)
    return models.load_remote(repo_text, offline=inv.offline, ref=ref)


def _suppressed(src: SourceFile | None, f: Finding) -> bool:
    if src is None or f.code == INPUT_INVALID[0]:
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


def meta_finding(kind: tuple[str, str, Severity], config: Config, path: str, line: int, column: int,
                 message: str) -> Finding | None:
    """A finding about the input itself; None if the config ignores it (a broken input never is)."""
    code, name, sev = kind
    if kind is not INPUT_INVALID and (code in config.ignore or name in config.ignore):
        return None
    if kind is not INPUT_INVALID:
        sev = config.severity_of(code, name, sev)
    return Finding(code, name, sev, path, line, column, message)


def _run_rules(ctx: Context, config: Config, rules: Sequence[ModuleType], plan: bool) -> list[Finding]:
    from moeconf.linting.rules import flag_value_refused

    out: list[Finding] = []
    values = _Values(ctx)
    runs = [rule for rule in rules
            if not (getattr(rule, "PLAN_ONLY", False) and not plan) and config.enabled(rule.CODE, rule.NAME)
            and not (rule.NEEDS_MODEL and (ctx.inventory is None or ctx.explanation is None))]
    ctx.enabled = frozenset(rule.NAME for rule in runs)
    # a line the engine cannot read as written is not judged by what its settings would cost:
    # the finding that says why it cannot be read is the one to fix first
    misread = flag_value_refused.misread(ctx)
    for rule in runs:
        if misread and getattr(rule, "READS_SETTINGS", False):
            continue
        hit: Hit
        values_seen: set[object] = set()
        more = 0
        first_more: tuple[int, int] | None = None
        for hit in rule.check(ctx):
            default: Severity = hit.severity or rule.SEVERITY
            sev = config.severity_of(rule.CODE, rule.NAME, default)
            f = Finding(rule.CODE, rule.NAME, sev, ctx.path, hit.line or ctx.line, hit.column or ctx.column,
                        hit.message)
            # every instance is a finding (JSON and SARIF list each location); the cap counts the
            # -ot values (or the places outside one) a rule reports on
            value = values.of(f)
            key = f if value is None else value
            if key not in values_seen and len(values_seen) >= MAX_PER_RULE:
                more += 1  # past the cap: only counted
                first_more = first_more or (f.line, f.column)
                continue
            values_seen.add(key)
            out.append(f)
        if first_more is not None:
            capped = meta_finding(FINDINGS_CAPPED, config, ctx.path, *first_more,
                                  f"{more} more {rule.CODE} {rule.NAME} finding(s) for this engine invocation "
                                  f"not shown (at most {MAX_PER_RULE} a rule)")
            if capped is not None:
                out.append(capped)
    return out


def _unknowable(invocation: Invocation, config: Config, path: str) -> list[Finding]:
    """Values the file does not fix (command substitutions, variables set elsewhere) are not
    checked: each gets a cannot-check note instead of findings about its literal text. An -ot
    value with more items than moeconf checks is cut, with a note."""
    out: list[Finding] = []

    def note(kind: tuple[str, str, Severity], arg: Arg, offset: int, message: str) -> None:
        line, col = arg.at(offset) if arg.line else (0, 0)
        f = meta_finding(kind, config, path, line or 1, col or 1, message)
        if f is not None:
            out.append(f)

    kept = []
    for ov in invocation.ot:
        depends = getattr(ov.value, "depends", "")
        if depends:
            note(CANNOT_CHECK, ov.value, 0, f"cannot check this -ot value: it depends on {depends}")
            continue
        text = ov.value.text
        cut = -1
        for _ in range(MAX_ITEMS):
            cut = text.find(",", cut + 1)
            if cut == -1:
                break
        if cut != -1:
            rest = text.count(",", cut)
            eng = invocation.engine
            if eng.max_overrides is not None and rest + MAX_ITEMS > eng.max_overrides:
                note(TOO_MANY_OVERRIDES, ov.value, cut + 1,
                     f"{eng.name} accepts at most {eng.max_overrides} -ot items and refuses to start; this value "
                     f"has {MAX_ITEMS + rest}: merge items (moeconf compile writes the shortest rules); "
                     f"items after the {MAX_ITEMS}th were not checked")
            else:
                note(CANNOT_CHECK, ov.value, cut + 1, f"{rest} -ot item(s) after the first {MAX_ITEMS} of this "
                                                      f"value were not checked")
            ov = replace(ov, value=replace(ov.value, text=text[:cut]))
        start, longest, at = 0, 0, 0
        value = ov.value.text
        while True:
            k = value.find(",", start)
            end = len(value) if k == -1 else k
            if end - start > longest:
                longest, at = end - start, start
            if k == -1:
                break
            start = k + 1
        if longest > MAX_ITEM_CHARS:
            note(CANNOT_CHECK, ov.value, at, f"cannot check this -ot value: an item of {longest:,} characters "
                                             f"(moeconf checks items up to {MAX_ITEM_CHARS:,})")
            continue
        kept.append(ov)
    invocation.ot = kept
    problems = []
    for arg, message in invocation.problems:
        depends = getattr(arg, "depends", "")
        if depends:
            note(CANNOT_CHECK, arg, 0, f"cannot check {arg.text[:60]!r}: it depends on {depends}")
        else:
            problems.append((arg, message))
    invocation.problems = problems
    return out


class _Values:
    """Which -ot value (index) a finding points into, if any: findings of one rule on one value
    are shown as one, with a count. Indexed once per invocation (a line may hold many values)."""

    def __init__(self, ctx: Context) -> None:
        self.by_line: dict[int, list[tuple[int, int, int]]] = {}
        for n, ov in enumerate(ctx.invocation.ot):
            line, start = ov.value.at(0)
            end_line, end = ov.value.at(len(ov.value.text))
            if line and line == end_line:
                self.by_line.setdefault(line, []).append((start, end, n))
        for spans in self.by_line.values():
            spans.sort()

    def of(self, f: Finding) -> int | None:
        spans = self.by_line.get(f.line)
        if not spans:
            return None
        k = bisect.bisect_right(spans, (f.column, 1 << 62, 1 << 62)) - 1
        while k >= 0:
            start, end, n = spans[k]
            if start <= f.column <= end:
                return n
            if k == 0 or spans[k - 1][1] < f.column:
                return None  # spans do not overlap: nothing earlier can hold the column
            k -= 1
        return None


def image_binary(image: str | None) -> str | None:
    """The binary an engine's container image runs: its server images (`...:server`, `:server-cuda`,
    ik's `cu12-server`) llama-server, the `light` images llama-cli; None when unknown (`full` takes
    the tool as an argument)."""
    if not image:
        return None
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    if "server" in tag:
        return "llama-server"
    if tag.startswith("light"):
        return "llama-cli"
    return None


# launches whose config files are not this machine's: a container's (compose, docker run), or a
# proxy's (llama-swap) whose machine the file does not say
_ELSEWHERE_KINDS = frozenset({"compose", "llama-swap"})


def launch_llama_config(launch: Launch, llama_config: LlamaConfig | None) -> LlamaConfig | None:
    """The llama.cpp config files a launch reads: this machine's (`llama_config`) for a command
    run here, unknown (`known` False) for one in a container or under llama-swap."""
    if llama_config is None:
        return None
    if launch.kind in _ELSEWHERE_KINDS or launch.image:
        return LlamaConfig(looked=list(llama_config.looked), how=llama_config.how, known=False)
    return llama_config


def lint_launch(src: SourceFile, launch: Launch, config: Config, models: _Models,
                rules: Sequence[ModuleType] = ALL, llama_config: LlamaConfig | None = None) -> list[Finding]:
    eng, how = _engine_for(src, launch, config)
    from moeconf.engines.argvread import is_bench

    if is_bench(launch.args):
        # llama-bench: its own parser; each test that places or allocates differently, by the rules
        # that hold for it (rules.BENCH_SKIPS), each finding once
        from moeconf.engines.cmdline import bench_invocations

        line, invocations = bench_invocations(launch.args, eng)
        kept = _bench_rules(rules)
        seen: set[tuple[str, int, int, str]] = set()
        out: list[Finding] = []
        if line.placements() > len(invocations):
            note = meta_finding(CANNOT_CHECK, config, src.path, launch.line, launch.column,
                                f"llama-bench runs {line.placements():,} combinations of -ot sets, -ngl, -ub, ...: "
                                f"the first {len(invocations)} were checked")
            if note is not None:
                out.append(note)
        for invocation in invocations:
            for f in _lint_invocation(src, launch, config, models, kept, eng, how, invocation):
                key = (f.code, f.line, f.column, f.message)
                if key not in seen:
                    seen.add(key)
                    out.append(f)
        return out
    invocation = parse_invocation(launch.args, eng, launch.env, launch_llama_config(launch, llama_config))
    return _lint_invocation(src, launch, config, models, rules, eng, how, invocation)


def _bench_rules(rules: Sequence[ModuleType]) -> list[ModuleType]:
    """The rules that hold for a llama-bench line."""
    from moeconf.linting.rules import BENCH_SKIPS

    return [r for r in rules if r.NAME not in BENCH_SKIPS]


def _lint_invocation(src: SourceFile, launch: Launch, config: Config, models: _Models, rules: Sequence[ModuleType],
                     eng: Engine, how: str, invocation: Invocation) -> list[Finding]:
    notes = _unknowable(invocation, config, src.path)
    model = _model_for(src, launch, invocation, config, models)
    inventory = model if isinstance(model, Inventory) else None
    explanation = None
    gpus_directive = file_directive(src, "gpus", launch)
    from moeconf.explanation import assumed_gpus, assumed_gpus_sorted

    if gpus_directive:
        gpus = [g for g in gpus_directive.split("+") if g]
    elif config.gpus is not None:
        gpus = list(config.gpus)
    else:
        gpus = assumed_gpus(invocation)  # what `explain` simulates without --gpus: they agree
        # the GPUs [gpu_memory] sizes are on the machine too: a line without -ts splits its layers over them
        sized = [d for d in config.gpu_memory if not d.startswith("RPC") and d not in gpus
                 and invocation.engine.device_name_error(d) is None]
        gpus = assumed_gpus_sorted([*gpus, *sized]) if sized else gpus
    gpus_known = bool(gpus_directive) or config.gpus is not None
    if inventory is not None:
        from moeconf.explanation import explain_invocation

        explanation = explain_invocation(inventory, invocation, gpus)
    ctx = Context(src.path, launch.line, launch.column, eng, invocation, inventory, explanation, gpus,
                  kind=launch.kind, engine_source=how, gpus_known=gpus_known, gpu_memory=config.gpu_memory,
                  reserve=config.reserve, image_binary=image_binary(launch.image))
    findings = notes + _run_rules(ctx, config, rules, plan=False)
    if isinstance(model, MoeconfError):
        findings = [f for f in findings if f.name != "model-unknown"]
        findings.append(Finding("MOE000", "model-unknown", "info", src.path, launch.line, launch.column,
                                f"model could not be read ({model}); model-aware rules were skipped"))
    return findings


COMMAND_LINE = "<command line>"  # the path of findings on a command line given to `explain`


def command_words(argv: Sequence[str]) -> list[Arg]:
    """The words of a command line, placed as if written on one line separated by single spaces
    (line 1, 1-based columns), so a finding's column names the word and the place in it."""
    out, column = [], 1
    for w in argv:
        out.append(Arg(w, COMMAND_LINE, 1, column))
        column += len(w) + 1
    return out


def bench_test(argv: Sequence[str], eng: Engine) -> Invocation:
    """The test `explain` takes of a llama-bench line (its first placement), the line read once as
    llama-bench reads it (`invocation.bench`), its words placed by `command_words`."""
    from moeconf.engines.cmdline import bench_invocations

    return bench_invocations(command_words(argv), eng, limit=1)[1][0]


def lint_command(inventory: Inventory | None, eng: Engine, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 gpus: Sequence[str] | None = None, config: Config | None = None,
                 rules: Sequence[ModuleType] = ALL, llama_config: LlamaConfig | None = None,
                 bench: Invocation | None = None) -> tuple[Any, list[Finding]]:
    """`explain`'s simulation of a command line and what `moeconf lint` says about it, by the same
    rules: (the Explanation, the findings, at line 1 and the column of `command_words`). The
    memory rules state nothing without `config.gpu_memory`; explain prints the memory itself.
    `bench`: a llama-bench line's test as the caller read it already (`bench_test(argv, eng)`)."""
    from moeconf.explanation import assumed_gpus, explain_invocation

    config = config or Config()
    from moeconf.engines.argvread import is_bench

    if is_bench(argv):
        # llama-bench: the one test explain takes (the caller refuses a line of several:
        # BenchLine.explain_refusal), read as llama-bench reads it, by the rules that hold for it
        invocation = bench if bench is not None else bench_test(argv, eng)
        rules = _bench_rules(rules)
    else:
        if bench is not None:
            raise ValueError("lint_command: `bench` given for a line that is not llama-bench's")
        invocation = parse_invocation(command_words(argv), eng, {k: Arg(v) for k, v in (env or {}).items()},
                                      llama_config)
    simulated = explain_invocation(inventory, invocation, gpus) if inventory is not None else None
    known = list(gpus) if gpus is not None else assumed_gpus(invocation)
    ctx = Context(COMMAND_LINE, 1, 1, eng, invocation, inventory, simulated, known, kind="explain",
                  engine_source="explain", gpus_known=gpus is not None, gpu_memory=config.gpu_memory,
                  reserve=config.reserve)
    findings = sorted(_run_rules(ctx, config, rules, plan=False), key=lambda f: (f.line, f.column, f.code))
    return simulated, findings


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
        # an error in another file (the model the plan names) says which file (issue 18)
        other = f"{e.path}: " if e.path and os.path.abspath(e.path) != os.path.abspath(path) else ""
        return [Finding(code, name, sev, path, e.line or 1, e.column or 1, other + e.message + hint)]
    pos = locate(plan.positions, ("rules",)) or locate(plan.positions, ("model",))
    line, col = (pos.line, pos.column) if pos else (1, 1)
    # a finding about one of these flags is placed at the plan key that writes it (engines/options.py)
    keyed: dict[str, tuple[str, ...]] = {"-ot": ("rules",)}
    for flag in ("-ngl", "-fit", "-mqkv", "-muge", "-sm", "--rpc"):
        o = row(flag)
        keyed[flag] = (o.section, str(o.field))
    args = [Arg(a, path) for a in compiled.argv]
    for given in read_argv(args, compiled.engine).options:
        where = keyed.get(given.canonical)
        p = locate(plan.positions, where) if where is not None else None
        if p:
            args[given.index] = Arg(given.word.text, path, p.line, p.column)
    invocation = parse_invocation(args, compiled.engine)
    gpus = list(plan.config.engine.gpus)
    explanation = explain_invocation(compiled.inventory, invocation, gpus)
    ctx = Context(path, line, col, compiled.engine, invocation, compiled.inventory, explanation, gpus,
                  kind="plan", engine_source="config", plan=plan, plan_diagnostics=list(compiled.warnings),
                  gpus_known=True, gpu_memory=config.gpu_memory, reserve=config.reserve)
    return _run_rules(ctx, config, rules, plan=True)


def known_rules() -> dict[str, str]:
    """Every code -> name that select, ignore and [severity] may name."""
    out = {mod.CODE: mod.NAME for mod in ALL}
    for code, name, _ in (PLAN_INVALID, *META):
        out[code] = name
    return out


def _check_names(names: Sequence[str], where: str, config: Config | None, key: str) -> None:
    import difflib

    known = known_rules()
    words = sorted(set(known) | set(known.values()))
    for i, n in enumerate(names):
        if n in known or n in known.values():
            continue
        digits = "MOE" + n[3:].upper().replace("O", "0").replace("I", "1").replace("L", "1")
        close = ([digits] if n.upper().startswith("MOE") and digits in known else []) or difflib.get_close_matches(
            n, words, n=1, cutoff=0.5) or difflib.get_close_matches(
            n.upper(), words, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}" + (f" ({known[close[0]]})" if close[0] in known else "") + "?" \
            if close else "`moeconf rule` lists the rules"
        message = f"unknown rule {n!r} in {where}"
        if config is not None and config.where is not None:
            raise config.where.error(message, key, i if key != "severity" else n, hint=hint)
        raise MoeconfError(message, hint=hint)


def check_rule_names(names: Sequence[str], where: str) -> None:
    """Every name a known rule's code or name (else an error naming the closest)."""
    _check_names(names, where, None, "")


def check_config_rules(config: Config) -> None:
    """Rule names in a config's select, ignore and [severity] must be known (file:line:col if not)."""
    _check_names(config.select, "select", config, "select")
    _check_names(config.ignore, "ignore", config, "ignore")
    _check_names(list(config.severity), "[severity]", config, "severity")


def _engine(name: str, version: str | None, *, directive: bool = False) -> Engine:
    """The engine at `version`; a `version=` directive moeconf cannot read is refused (the
    launch gets input-invalid) rather than silently taken as the newest code read."""
    bad = version_error(name, version) if directive else None
    if bad:
        raise MoeconfError(f"the `# moeconf: version=` directive: {bad}")
    try:
        return engine(name, version)
    except ValueError as e:
        raise MoeconfError(str(e), hint="write `# moeconf: engine=llama.cpp` or `engine=ik_llama.cpp`") from None


def lint(paths: Sequence[str], config: Config | None = None, rules: Sequence[ModuleType] = ALL,
         overrides: dict[str, object] | None = None, llama_config: LlamaConfig | None = None) -> LintResult:
    """Lint plan files and launch files (directories are searched). Findings are plain data.
    `config` replaces the `.moeconf.toml` search; `overrides` (engine, select, ignore) apply on
    top of whichever config is used. `llama_config`: llama.cpp's config files on this machine,
    applied to the launches run here (None: none read). A file that cannot be read as its kind gives an
    `input-invalid` finding (`LintResult.broken`), never an exception; other files are still linted."""
    result = LintResult()
    models = _Models([p if os.path.isdir(p) else os.path.dirname(os.path.abspath(p)) for p in paths])
    for p in paths:
        if not os.path.lexists(p):
            raise MoeconfError("no such file or directory", path=p)
    for key in ("select", "ignore"):
        if overrides and key in overrides:
            _check_names(list(overrides[key]), f"--{key}", None, key)  # type: ignore[call-overload]
    if config is not None:
        check_config_rules(config)
    configs: dict[str, Config] = {}
    for path in walk(list(paths)):
        folder = os.path.dirname(os.path.abspath(path))
        if config is not None:
            cfg = config
        else:
            if folder not in configs:
                configs[folder] = find_config(folder)
                check_config_rules(configs[folder])
            cfg = configs[folder]
        if overrides:
            cfg = replace(cfg, **overrides)  # type: ignore[arg-type]
        result.files.append(path)
        result.findings += _cap(lint_file(path, cfg, models, rules, result, llama_config), cfg)
    result.findings = sorted(set(result.findings), key=lambda f: (f.path, f.line, f.column, f.code, f.message))
    return result


def lint_file(path: str, cfg: Config, models: _Models, rules: Sequence[ModuleType], result: LintResult,
              llama_config: LlamaConfig | None = None) -> list[Finding]:
    """Findings for one file (launch file or plan); special files are noted and skipped."""
    what = not_regular(path)
    if what is not None:
        if what.startswith("unreadable"):
            f = meta_finding(INPUT_INVALID, cfg, path, 1, 1, f"cannot read: {what[len('unreadable '):].strip('()')}")
        else:
            f = meta_finding(INPUT_SKIPPED, cfg, path, 1, 1, f"skipped: {what}, not a regular file "
                                                             f"(moeconf reads only regular files)")
        return [f] if f is not None else []
    if path.endswith(".toml") and kind_of(path) == "plan":
        return lint_plan(path, cfg, rules) if _looks_like_plan(path) else []
    try:
        src = read_source(path)
    except OSError as e:
        f = meta_finding(INPUT_INVALID, cfg, path, 1, 1, f"cannot read: {e.strerror or e}")
        return [f] if f is not None else []
    if src is None:
        return []
    out = [f for n in src.notes if (f := _note_finding(n, cfg, path)) is not None]
    for launch in src.launches:
        result.launches += 1
        try:
            found = lint_launch(src, launch, cfg, models, rules, llama_config)
        except MoeconfError as e:
            # a directive naming an unknown engine or version: this launch cannot be linted
            found = [f for f in [meta_finding(INPUT_INVALID, cfg, path, launch.line, launch.column,
                                              f"{e.message}{f' ({e.hint})' if e.hint else ''}")] if f]
        out += [f for f in found if not _suppressed(src, f)]
    return out


def _note_finding(n: Note, cfg: Config, path: str) -> Finding | None:
    return meta_finding(_NOTE_KIND[n.kind], cfg, path, n.line or 1, n.column or 1, n.message)


def _cap(findings: list[Finding], cfg: Config) -> list[Finding]:
    """At most MAX_PER_FILE findings a file (broken input and too many -ot items always kept), plus a count."""
    findings = sorted(set(findings), key=lambda f: (f.line, f.column, f.code, f.message))
    if len(findings) <= MAX_PER_FILE:
        return findings
    # broken input is always shown; the notes about the input (an engine limit, what was not
    # checked) come before the rules' findings in what the cap keeps
    meta = {kind[0] for kind in META}
    by_priority = sorted(findings, key=lambda f: f.code not in meta)
    kept = by_priority[:MAX_PER_FILE] + [f for f in by_priority[MAX_PER_FILE:] if f.code == INPUT_INVALID[0]]
    dropped = [f for f in by_priority[MAX_PER_FILE:] if f.code != INPUT_INVALID[0]]
    first = min(dropped, key=lambda f: (f.line, f.column, f.code, f.message))
    note = meta_finding(FINDINGS_CAPPED, cfg, first.path, first.line, first.column,
                        f"{len(dropped)} more finding(s) in this file not shown (at most {MAX_PER_FILE} a file); "
                        f"fix these and run again")
    kept = sorted(kept, key=lambda f: (f.line, f.column, f.code, f.message))
    return kept + ([note] if note is not None else [])


def _looks_like_plan(path: str) -> bool:
    from moeconf.linting.sources import read_regular

    try:
        text = read_regular(path, 20000)
    except OSError:
        return False
    return bool(re.search(r"^\s*rules\s*=", text, re.M)) and "[model]" in text
