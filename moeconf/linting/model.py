"""Findings, configuration and the context a rule sees. Plain data: rules yield `Finding`s."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Literal

from moeconf.engines import Engine, version_error
from moeconf.engines.cmdline import Arg, Invocation, RawItem
from moeconf.errors import MoeconfError
from moeconf.model.inventory import Inventory

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
_RANK = {"info": 0, "warning": 1, "error": 2}


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    path: str
    line: int
    column: int
    message: str

    def json(self) -> dict[str, Any]:
        return {"code": self.code, "name": self.name, "severity": self.severity, "path": self.path,
                "line": self.line, "column": self.column, "message": self.message}

    def text(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.code} {self.name} [{self.severity}] {self.message}"


def at_least(sev: str, level: str) -> bool:
    return _RANK[sev] >= _RANK[level]


@dataclass
class Config:
    """`.moeconf.toml` or `[tool.moeconf]`: engine, models, rule selection and severities."""

    path: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    gpus: list[str] | None = None  # the machine's GPUs; None: not configured (CUDA0 is assumed)
    models: dict[str, str] = field(default_factory=dict)  # key (path or basename) -> GGUF/manifest
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    severity: dict[str, str] = field(default_factory=dict)
    fail_on: str = "warning"

    def enabled(self, code: str, name: str) -> bool:
        if self.select and code not in self.select and name not in self.select:
            return False
        return code not in self.ignore and name not in self.ignore

    def severity_of(self, code: str, name: str, default: Severity) -> Severity:
        v = self.severity.get(name) or self.severity.get(code)
        for sev in SEVERITIES:
            if v == sev:
                return sev
        return default

    def model_for(self, key: str) -> str | None:
        if key in self.models:
            return self.models[key]
        base = os.path.basename(key)
        return self.models.get(base)


_KEYS = {"engine", "engine_version", "gpus", "models", "select", "ignore", "severity", "fail_on"}


def _from_table(data: dict[str, Any], path: str) -> Config:
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise MoeconfError(f"unknown key {unknown[0]!r} in the moeconf config (known: {', '.join(sorted(_KEYS))})",
                           path=path)
    folder = os.path.dirname(os.path.abspath(path))
    models = {}
    for k, v in (data.get("models") or {}).items():
        if not isinstance(v, str):
            raise MoeconfError(f"[models] {k!r} must map to a path", path=path)
        models[k] = v if os.path.isabs(v) else os.path.normpath(os.path.join(folder, v))
    fail_on = data.get("fail_on", "warning")
    if fail_on not in SEVERITIES:
        raise MoeconfError(f"fail_on must be one of {', '.join(SEVERITIES)}", path=path)
    engine = data.get("engine")
    if engine is not None and engine not in ("llama.cpp", "ik_llama.cpp"):
        raise MoeconfError(f"engine must be llama.cpp or ik_llama.cpp, not {engine!r}", path=path)
    version = data.get("engine_version")
    bad = version_error(engine, str(version)) if engine is not None and version is not None else None
    if bad:  # (without `engine`, the version is for whichever engine each file names)
        raise MoeconfError(f"engine_version: {bad}", path=path)
    return Config(
        path=path, engine=engine, engine_version=data.get("engine_version"),
        gpus=list(data["gpus"]) if "gpus" in data else None, models=models,
        select=list(data.get("select", [])), ignore=list(data.get("ignore", [])),
        severity=dict(data.get("severity", {})), fail_on=fail_on,
    )


def load_config_file(path: str) -> Config:
    """A config from an explicit file: `.moeconf.toml`, or `pyproject.toml` with `[tool.moeconf]`."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise MoeconfError(f"cannot read: {e.strerror or e}", path=path) from None
    except tomllib.TOMLDecodeError as e:
        raise MoeconfError(f"TOML syntax: {e}", path=path) from None
    if os.path.basename(path) == "pyproject.toml":
        data = data.get("tool", {}).get("moeconf", {})
    return _from_table(data, path)


def find_config(start: str) -> Config:
    """The nearest `.moeconf.toml` (or `pyproject.toml` with `[tool.moeconf]`) from `start` upwards."""
    folder = os.path.abspath(start if os.path.isdir(start) else os.path.dirname(os.path.abspath(start)))
    while True:
        for name in (".moeconf.toml", "pyproject.toml"):
            p = os.path.join(folder, name)
            if os.path.isfile(p):
                try:
                    with open(p, "rb") as f:
                        data = tomllib.load(f)
                except tomllib.TOMLDecodeError as e:
                    raise MoeconfError(f"TOML syntax: {e}", path=p) from None
                if name == "pyproject.toml":
                    table = data.get("tool", {}).get("moeconf")
                    if table is None:
                        continue
                    return _from_table(table, p)
                return _from_table(data, p)
        parent = os.path.dirname(folder)
        if parent == folder:
            return Config()
        folder = parent


@dataclass
class Context:
    """What a rule sees: one engine invocation, its engine, its model (if known) and the
    simulated explanation (if the model is known)."""

    path: str
    line: int
    column: int
    engine: Engine
    invocation: Invocation
    inventory: Inventory | None
    explanation: Any  # moeconf.explanation.Explanation | None
    gpus: list[str]
    kind: str = "shell"
    gpus_known: bool = False  # gpus come from the config or a directive, not assumed
    engine_source: str = "default"  # directive, image, binary, config or default
    plan: Any = None  # moeconf.plan.Plan when linting a plan
    plan_diagnostics: list[Any] = field(default_factory=list)  # moeconf.resolve.Diagnostic

    def at_arg(self, arg: Arg | None, offset: int = 0) -> tuple[int, int]:
        if arg is None or not arg.line:
            return self.line, self.column
        return arg.at(offset)

    def at_item(self, item: RawItem, within: int = 0) -> tuple[int, int]:
        line, col = item.position(within)
        return (line, col) if line else (self.line, self.column)
