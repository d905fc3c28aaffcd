"""Findings, configuration and the context a rule sees. Plain data: rules yield `Finding`s."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Literal

from moeconf.engines import Engine, version_error
from moeconf.engines.argvread import Arg
from moeconf.engines.cmdline import Invocation, RawItem
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
    where: Any = field(default=None, compare=False, repr=False)  # key positions in the config file
    gpu_memory: dict[str, int] = field(default_factory=dict)  # buffer type -> bytes (`[gpu_memory]`)
    reserve: int | None = None  # bytes kept free per GPU (default 1 GiB)

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


_KEYS = {"engine", "engine_version", "gpus", "models", "select", "ignore", "severity", "fail_on", "gpu_memory",
         "reserve"}


class _Where:
    """Positions of keys in the config's TOML text, for errors that say file:line:col."""

    def __init__(self, path: str, text: str, prefix: tuple[str, ...]) -> None:
        from moeconf.plan.positions import scan

        self.path, self.prefix = path, prefix
        try:
            self.positions = scan(text)
        except (ValueError, IndexError, RecursionError):
            self.positions = {}

    def at(self, *key: str | int) -> tuple[int, int] | None:
        from moeconf.plan.positions import locate

        pos = locate(self.positions, (*self.prefix, *key))
        return (pos.line, pos.column) if pos else None

    def error(self, message: str, *key: str | int, hint: str | None = None) -> MoeconfError:
        at = self.at(*key)
        return MoeconfError(message, path=self.path, line=at[0] if at else None, column=at[1] if at else None,
                            hint=hint)


def _type_name(v: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(v), type(v).__name__)


def _str_list(data: dict[str, Any], key: str, where: _Where) -> list[str]:
    v = data.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        bad = v if not isinstance(v, list) else next(x for x in v if not isinstance(x, str))
        got = _type_name(v) if bad is v else "a list holding " + _type_name(bad)
        raise where.error(f"{key} must be a list of strings, not {got}", key,
                          hint=f'write {key} = ["CUDA0", "CUDA1"]' if key == "gpus" else
                          f'write {key} = ["MOE010", "unescaped-dot"]')
    return list(v)


def _from_table(data: dict[str, Any], path: str, text: str = "", prefix: tuple[str, ...] = ()) -> Config:
    import difflib

    where = _Where(path, text, prefix)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(_KEYS), n=1)
        raise where.error(f"unknown key {unknown[0]!r} in the moeconf config (known: {', '.join(sorted(_KEYS))})",
                          unknown[0], hint=f"did you mean {close[0]!r}?" if close else None)
    folder = os.path.dirname(os.path.abspath(path))
    models = {}
    table = data.get("models", {})
    if not isinstance(table, dict):
        raise where.error(f"[models] must be a table of model name -> GGUF or manifest path, not {_type_name(table)}",
                          "models")
    for k, v in table.items():
        if not isinstance(v, str):
            raise where.error(f"[models] {k!r} must map to a path (a string), not {_type_name(v)}", "models", k)
        from moeconf.hub.ref import looks_remote

        # a remote model (moeconf.hub) in a form no path takes (a bare OWNER/NAME stays a path: a typo is caught)
        if (v.startswith(("hf://", "https://", "http://")) or ":" in v) and looks_remote(v) and not os.path.exists(
                os.path.join(folder, v)):
            models[k] = v
            continue
        full = v if os.path.isabs(v) else os.path.normpath(os.path.join(folder, v))
        problem = _not_a_model_file(full)
        if problem:
            raise where.error(f"[models] {k!r} points at {v!r}, which is {problem}", "models", k,
                              hint="fix the path (relative paths are relative to the config file) or remove the entry")
        models[k] = full
    fail_on = data.get("fail_on", "warning")
    if fail_on not in SEVERITIES:
        raise where.error(f"fail_on must be one of {', '.join(SEVERITIES)}, not {fail_on!r}", "fail_on")
    engine = data.get("engine")
    if engine is not None and engine not in ("llama.cpp", "ik_llama.cpp"):
        raise where.error(f"engine must be llama.cpp or ik_llama.cpp, not {engine!r}", "engine")
    version = data.get("engine_version")
    if version is not None and not isinstance(version, str):
        raise where.error(f"engine_version must be a string such as \"b7600\", not {_type_name(version)}",
                          "engine_version")
    bad = version_error(engine, version) if engine is not None and version is not None else None
    if bad:  # (without `engine`, the version is for whichever engine each file names)
        raise where.error(f"engine_version: {bad}", "engine_version")
    gpus = _str_list(data, "gpus", where) if "gpus" in data else None
    if gpus is not None and not all(g.strip() for g in gpus):
        raise where.error("gpus must not hold an empty name", "gpus")
    severity = data.get("severity", {})
    if not isinstance(severity, dict):
        raise where.error(f"[severity] must be a table of rule -> severity, not {_type_name(severity)}", "severity")
    for k, v in severity.items():
        if v not in SEVERITIES:
            raise where.error(f"[severity] {k}: severity must be one of {', '.join(SEVERITIES)}, not {v!r}",
                              "severity", k)
    from moeconf.engines.settings import parse_size

    gpu_memory: dict[str, int] = {}
    table = data.get("gpu_memory") or {}
    if not isinstance(table, dict):
        raise where.error('gpu_memory must be a table: [gpu_memory] CUDA0 = "24GiB"', "gpu_memory")
    for dev, size in table.items():
        if not isinstance(size, str | int):
            raise where.error(f"gpu_memory {dev!r} must be a size like \"24GiB\"", "gpu_memory", dev)
        try:
            gpu_memory[dev] = parse_size(str(size), f"gpu_memory {dev}")
        except MoeconfError as e:
            raise where.error(e.message, "gpu_memory", dev) from None
    reserve = data.get("reserve")
    try:
        reserve_bytes = parse_size(str(reserve), "reserve") if reserve is not None else None
    except MoeconfError as e:
        raise where.error(e.message, "reserve") from None
    config = Config(
        gpu_memory=gpu_memory, reserve=reserve_bytes,
        path=path, engine=engine, engine_version=version, gpus=gpus, models=models,
        select=_str_list(data, "select", where), ignore=_str_list(data, "ignore", where),
        severity=dict(severity), fail_on=fail_on,
    )
    config.where = where
    return config


def _not_a_model_file(path: str) -> str | None:
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    return None if stat.S_ISREG(st.st_mode) else "not a regular file"


def _read_config(path: str) -> tuple[dict[str, Any], str]:
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise MoeconfError("not a regular file; a config must be a TOML file", path=path)
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise MoeconfError(f"cannot read: {e.strerror or e}", path=path) from None
    text = raw.decode("utf-8", errors="replace")
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as e:
        import re

        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        line, col = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        if m is None and "end of document" in str(e):  # where the text ends
            line, col = text.count("\n") + 1, len(text.rsplit("\n", 1)[-1]) + 1
        raise MoeconfError(f"TOML syntax: {re.sub(r' *[(]at (line|end).*[)]', '', str(e))}", path=path,
                           line=line, column=col) from None
    except RecursionError:
        raise MoeconfError("TOML nested too deeply to read", path=path) from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise MoeconfError(f"TOML value cannot be read: {str(e).split(':')[0]}", path=path) from None


def load_config_file(path: str) -> Config:
    """A config from an explicit file: `.moeconf.toml`, or `pyproject.toml` with `[tool.moeconf]`."""
    data, text = _read_config(path)
    if os.path.basename(path) == "pyproject.toml":
        table = _tool_moeconf(data, path, text)
        return _from_table(table or {}, path, text, ("tool", "moeconf"))
    return _from_table(data, path, text)


def _tool_moeconf(data: dict[str, Any], path: str, text: str) -> dict[str, Any] | None:
    """pyproject.toml's `[tool.moeconf]` table (None when absent); `tool = 5` or `[tool] moeconf = 5`
    is an error at its line, as it is for every other key of the config."""
    tool = data.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise _Where(path, text, ()).error(f"tool must be a table ([tool.moeconf] holds moeconf's config), not "
                                           f"{_type_name(tool)}", "tool")
    table = tool.get("moeconf")
    if table is not None and not isinstance(table, dict):
        raise _Where(path, text, ()).error(f"[tool.moeconf] must be a table, not {_type_name(table)}", "tool",
                                           "moeconf")
    return table


def find_config(start: str) -> Config:
    """The nearest `.moeconf.toml` (or `pyproject.toml` with `[tool.moeconf]`) from `start` upwards."""
    folder = os.path.abspath(start if os.path.isdir(start) else os.path.dirname(os.path.abspath(start)))
    while True:
        for name in (".moeconf.toml", "pyproject.toml"):
            p = os.path.join(folder, name)
            if os.path.isfile(p):
                data, text = _read_config(p)
                if name == "pyproject.toml":
                    table = _tool_moeconf(data, p, text)
                    if table is None:
                        continue
                    return _from_table(table, p, text, ("tool", "moeconf"))
                return _from_table(data, p, text)
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
    gpu_memory: dict[str, int] = field(default_factory=dict)  # from the config: buffer type -> bytes
    reserve: int | None = None
    enabled: frozenset[str] = frozenset()  # names of the rules that run on this invocation
    # analyses computed once per invocation and shared by the rules that state them
    cache: dict[str, Any] = field(default_factory=dict)
    # the binary a container image runs when the launch names none (its argv starts with options):
    # the server images run llama-server (it defaults the sequence count, 4 slots)
    image_binary: str | None = None

    def at_arg(self, arg: Arg | None, offset: int = 0) -> tuple[int, int]:
        if arg is None or not arg.line:
            return self.line, self.column
        return arg.at(offset)

    def at_item(self, item: RawItem, within: int = 0) -> tuple[int, int]:
        line, col = item.position(within)
        return (line, col) if line else (self.line, self.column)
