"""moeconf: declarative, checked tensor placement for MoE models on llama.cpp and ik_llama.cpp.

The public API is small and typed; heavy modules (pydantic, lark) load on first use, so
`import moeconf` stays cheap for tools that only read inventories.

    inv = moeconf.load_inventory("model.gguf")          # or a manifest .json
    plan = moeconf.load_plan("plan.toml")
    compiled = moeconf.compile_plan(plan)               # Compiled: .ot, .argv, .placement
    print(moeconf.emit(compiled, "compose"))

Every call that involves an engine takes `engine="llama.cpp"` (or "ik_llama.cpp", with
`version=`) or an `Engine` (`moeconf.engines.engine(name, version)`); so does
`moeconf.fit.fit(model, engine, budgets, flags)`. (`fit` is not a name in this package because
`moeconf.fit` is the module: importing it would replace such a function.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moeconf.errors import GGUFError, ManifestError, MoeconfError, PlanError

if TYPE_CHECKING:
    from moeconf.compiled import Compiled
    from moeconf.engines import Engine
    from moeconf.explanation import Explanation
    from moeconf.linting.linter import LintResult
    from moeconf.linting.model import Finding
    from moeconf.model.inventory import Inventory, Layer, ModelMetadata, Tensor
    from moeconf.placement import Placement
    from moeconf.plan import Plan

__version__ = "0.1.0"

__all__ = [
    "Compiled",
    "Explanation",
    "Finding",
    "GGUFError",
    "Inventory",
    "Layer",
    "LintResult",
    "ManifestError",
    "ModelMetadata",
    "MoeconfError",
    "Placement",
    "Plan",
    "PlanError",
    "Tensor",
    "__version__",
    "compile_plan",
    "emit",
    "explain",
    "lint",
    "lint_line",
    "load_inventory",
    "load_plan",
    "write_manifest",
]


def load_inventory(path: str) -> Inventory:
    """Read a model's tensor inventory from a GGUF (any shard of a split model), a manifest, or a
    remote model: `hf://OWNER/REPO/PATH.gguf`, `OWNER/REPO[:TAG]` (as llama.cpp's -hf), an
    https:// URL of a GGUF (headers only, by range requests; see docs/hub.md)."""
    from moeconf.hub import load_model

    return load_model(path)


def write_manifest(inventory: Inventory, path: str) -> None:
    """Write `inventory` as a manifest JSON (atomically)."""
    from moeconf.model.manifest import write_manifest as _write

    _write(inventory, path)


def load_plan(path: str) -> Plan:
    """Load and validate a plan file; `PlanError` (with file:line:col) on bad input."""
    from moeconf.plan import load_plan as _load

    return _load(path)


def _engine_of(engine: str | Engine, version: str | None) -> Engine:
    """"llama.cpp" / "ik_llama.cpp" (at `version`, default the newest known) or an Engine as it is."""
    from moeconf.engines import Engine as _Engine
    from moeconf.engines import engine as _engine
    from moeconf.engines import version_error

    if isinstance(engine, _Engine):
        return engine
    bad = version_error(engine, version)
    if bad:
        raise MoeconfError(f"engine version: {bad}")
    if engine not in ("llama.cpp", "ik_llama.cpp"):
        raise MoeconfError(f"engine {engine!r}: moeconf knows llama.cpp and ik_llama.cpp")
    return _engine(engine, version)


def compile_plan(plan: Plan | str, *, model: str | None = None, inventory: Inventory | None = None,
                 engine: str | Engine | None = None, version: str | None = None) -> Compiled:
    """Compile a plan (or a plan path) into verified `-ot` items, placement and argv. `engine`
    ("llama.cpp", "ik_llama.cpp" or an Engine) compiles it for that engine instead of the plan's
    (as `moeconf compile --target ik_llama.cpp` does)."""
    from moeconf.compile import compile_plan as _compile
    from moeconf.compile import with_engine

    if engine is not None:
        eng = _engine_of(engine, version)
        p = load_plan(plan) if isinstance(plan, str) else plan
        plan = with_engine(p, eng.name)
        if eng.version:
            cfg = plan.config.engine.model_copy(update={"version": eng.version})
            import dataclasses

            plan = dataclasses.replace(plan, config=plan.config.model_copy(update={"engine": cfg}))
    return _compile(plan, model=model, inventory=inventory)


def emit(compiled: Compiled, target: str) -> str:
    """Render a compiled plan for a target: llama.cpp, ik_llama.cpp, argv, env, docker, compose,
    llama-swap, json or ot."""
    from moeconf.emitting.targets import emit as _emit

    return _emit(compiled, target)


def lint(paths: list[str] | str, *, engine: str | Engine | None = None, select: list[str] | None = None,
         ignore: list[str] | None = None, version: str | None = None) -> LintResult:
    """Lint plan files and launch files (directories are searched). Returns a `LintResult` whose
    `findings` are plain `Finding`s (code, name, severity, path, line, column, message). The
    nearest `.moeconf.toml` applies; the keyword arguments override it (`engine`: "llama.cpp",
    "ik_llama.cpp" or an Engine, whose version then applies too)."""
    from moeconf.linting.linter import lint as _lint

    overrides: dict[str, object] = {}
    if engine:
        eng = _engine_of(engine, version)
        overrides["engine"] = eng.name
        if eng.version:
            overrides["engine_version"] = eng.version
    if select:
        overrides["select"] = select
    if ignore:
        overrides["ignore"] = ignore
    return _lint([paths] if isinstance(paths, str) else list(paths), overrides=overrides)


def lint_line(line: str, *, model: Inventory | str | None = None, engine: str | Engine = "llama.cpp",
              version: str | None = None, gpus: list[str] | None = None,
              gpu_memory: dict[str, str] | None = None) -> list[Finding]:
    """Lint one launch line given as text, its words as a shell splits them (`shlex`): what `moeconf
    lint` says about it in a script, at line 1 and the column of each word in the joined line. The
    model-aware rules run where `model` (an Inventory or a path) is given; `gpu_memory` ({"CUDA0":
    "24GiB"}) sizes the GPUs for the memory rules, as `[gpu_memory]` in `.moeconf.toml` does."""
    import shlex

    from moeconf.errors import MoeconfError
    from moeconf.linting.linter import lint_command
    from moeconf.linting.model import Config
    from moeconf.memory import parse_size

    if not isinstance(line, str):
        raise TypeError("lint_line takes the launch line as text; for a file, moeconf.lint(path)")
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise MoeconfError(f"the line cannot be split into words as a shell would: {e}") from None
    inv = load_inventory(model) if isinstance(model, str) else model
    config = Config(gpu_memory={d: parse_size(v, f"gpu_memory {d}") for d, v in (gpu_memory or {}).items()})
    _, findings = lint_command(inv, _engine_of(engine, version), words, gpus=gpus, config=config)
    return findings


def explain(model: Inventory | str, argv: list[str], *, engine: str | Engine = "llama.cpp", version: str | None = None,
            env: dict[str, str] | None = None, gpus: list[str] | None = None) -> Explanation:
    """Simulate an engine command line on a model: `.placement.devices` says where every tensor
    goes, `.items` what each override matched, `.unmatched` the items that matched nothing,
    `.refusals` why the engine would not start this command line, `.load_refusals` why it would not
    load the file (a tensor its loader requires missing), `.findings` what `moeconf lint` says about the
    line (as `explain --json`). Without `gpus`, CUDA0, every well-formed GPU name the command line
    uses and the devices its -ts splits over are simulated (as `moeconf lint` does without `gpus`
    configured)."""
    if isinstance(argv, str):
        raise TypeError("argv is the command line's words, a list: moeconf.explain(model, "
                        f"shlex.split({argv[:40]!r}{'...' if len(argv) > 40 else ''}))")
    from dataclasses import replace

    from moeconf.linting.linter import lint_command

    inv = load_inventory(model) if isinstance(model, str) else model
    simulated, findings = lint_command(inv, _engine_of(engine, version), list(argv), env=env, gpus=gpus)
    out: Explanation = replace(simulated, findings=tuple(findings))
    return out


_INVENTORY_NAMES = ("Inventory", "Layer", "ModelMetadata", "Tensor")


def __getattr__(name: str) -> Any:
    if name in _INVENTORY_NAMES:
        import moeconf.model.inventory as inventory

        return getattr(inventory, name)
    if name == "Compiled":
        from moeconf.compiled import Compiled

        return Compiled
    if name == "Explanation":
        from moeconf.explanation import Explanation

        return Explanation
    if name == "Finding":
        from moeconf.linting.model import Finding

        return Finding
    if name == "LintResult":
        from moeconf.linting.linter import LintResult

        return LintResult
    if name == "Placement":
        from moeconf.placement import Placement

        return Placement
    if name == "Plan":
        from moeconf.plan import Plan

        return Plan
    raise AttributeError(f"module 'moeconf' has no attribute {name!r}")
