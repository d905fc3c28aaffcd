"""Plans: `plan.toml` files, loaded, validated and with every error pointing at file:line:col."""

from __future__ import annotations

import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from typing import Any

from moeconf.errors import PlanError, read_text
from moeconf.plan.config import validate
from moeconf.plan.positions import Pos, locate, scan
from moeconf.plan.rules import Rule, RuleSyntaxError, Span, caret, parse_rule

__all__ = ["Plan", "PlanError", "Rule", "load_plan", "plan_from_text", "plan_machine"]


@dataclass(frozen=True)
class Plan:
    """A loaded plan: the validated TOML (`config`), its parsed rules and where things are."""

    path: str
    # a `moeconf.plan.config.Section` (validated against the schema generated from the pydantic
    # model), or the `moeconf.plan.model.PlanModel` itself when only pydantic could decide
    config: Any
    rules: tuple[Rule, ...]
    rule_positions: tuple[Pos | None, ...] = field(repr=False)
    positions: dict[tuple[str | int, ...], Pos] = field(repr=False, compare=False)

    @property
    def folder(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    def resolve_path(self, p: str) -> str:
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(self.folder, p))

    @property
    def model_path(self) -> str:
        return self.resolve_path(self.config.model.path)

    def error_at_rule(self, rule: Rule, span: Span, message: str, hint: str | None = None) -> PlanError:
        """An error about part of a rule: file:line:col of that part, and the rule with a caret."""
        pos = self.rule_positions[rule.index]
        line = pos.line if pos else None
        column = pos.column + 1 + span.start if pos else None
        return PlanError(message, path=self.path, line=line, column=column, hint=hint,
                         context=caret(rule.text, span))

    def error_at_key(self, key_path: tuple[str | int, ...], message: str, hint: str | None = None) -> PlanError:
        pos = locate(self.positions, key_path)
        return PlanError(message, path=self.path, line=pos.line if pos else None,
                         column=pos.column if pos else None, hint=hint)


_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")


def _friendly(err: Any, cfg: dict[str, Any]) -> str:
    loc = err["loc"]
    kind = err["type"]
    where = ".".join(str(p) for p in loc)
    if kind == "extra_forbidden":
        table = ".".join(str(p) for p in loc[:-1])
        from moeconf.plan.model import PlanModel

        model: Any = PlanModel
        for part in loc[:-1]:
            field_info = model.model_fields.get(part)
            model = getattr(field_info, "annotation", None) if field_info else None
            # an optional table (`MachineSection | None`): its model
            model = next((a for a in getattr(model, "__args__", ()) if hasattr(a, "model_fields")), model)
        known = sorted(model.model_fields) if hasattr(model, "model_fields") else []
        place = f"[{table}]" if table else "the top level"
        msg = f"unknown key {loc[-1]!r} in {place}"
        if known:
            import difflib

            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg += f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
        return msg
    if kind == "missing":
        return f"{where} is required"
    if kind == "string_pattern_mismatch" and loc and loc[0] == "machine" and len(loc) > 1:
        forms = {"gpu_bandwidth": "a bandwidth, e.g. \"1008GB/s\"", "host_bandwidth": "a bandwidth, e.g. \"90GB/s\"",
                 "pcie": "a PCIe link GEN[xLANES], e.g. \"4x16\"",
                 "ram_speed": "KIND-SPEEDxCHANNELS, e.g. \"DDR5-6000x2\""}
        if str(loc[1]) in forms:
            return f"machine.{loc[1]}: {err.get('input')!r} is not {forms[str(loc[1])]}"
    return f"{where}: {err['msg']}"


def _line_col(text: str, offset: int) -> tuple[int, int]:
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _deep_nesting(text: str, limit: int = 64) -> tuple[int | None, int | None]:
    """Where brackets outside strings first nest deeper than `limit` (an approximation of TOML's
    structure good enough to point at the spot), or (None, None)."""
    depth = 0
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
            continue
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return _line_col(text, i)
        elif ch in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None, None


def _validate_with_pydantic(data: dict[str, Any], positions: dict[tuple[str | int, ...], Pos], path: str) -> Any:
    """The pydantic model's verdict: its value, or a PlanError at file:line:col."""
    from pydantic import ValidationError

    from moeconf.plan.model import PlanModel

    try:
        return PlanModel.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0]
        pos = locate(positions, tuple(first["loc"]))
        more = [_friendly(x, data) for x in errors[1:]]
        hint = ("also: " + "; ".join(more)) if more else None
        raise PlanError(_friendly(first, data), path=path, line=pos.line if pos else None,
                        column=pos.column if pos else None, hint=hint) from None


def plan_machine(plan: Plan) -> tuple[dict[str, Any] | None, Any]:
    """The plan's `[machine]` as a dict (None: no such table) and a function naming a key's place,
    `plan.toml:12:1: [machine] gpu_model`, for moeconf.machine.machine_from's errors."""
    section = getattr(plan.config, "machine", None)
    if section is None:
        return None, None

    def where(key: str) -> str:
        pos = locate(plan.positions, ("machine", key))
        at = f"{plan.path}:{pos.line}:{pos.column}" if pos else plan.path
        return f"{at}: [machine] {key}"

    values: dict[str, Any] = {k: v for k, v in section.model_dump().items() if v is not None}
    return values, where


def plan_from_text(text: str, path: str) -> Plan:
    """Validate plan text; `path` is used for messages and to resolve relative paths."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POS.search(msg)
        line, col = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        if m is None and "(at end of document)" in msg:  # where the text ends
            line, col = text.count("\n") + 1, len(text.rsplit("\n", 1)[-1]) + 1
            msg = msg.replace("(at end of document)", "at the end of the file")
        raise PlanError(f"TOML syntax: {_TOML_POS.sub('', msg).strip()}", path=path, line=line, column=col) from None
    except RecursionError:
        line, col = _deep_nesting(text)
        raise PlanError("arrays or tables nested too deeply for the TOML parser (a plan nests 2 deep)",
                        path=path, line=line, column=col) from None
    except ValueError:  # an integer with more digits than Python converts (4300)
        m = re.search(r"\d{" + str(sys.get_int_max_str_digits() + 1) + ",}", text)
        line, col = _line_col(text, m.start()) if m else (None, None)
        raise PlanError(f"a number has more than {sys.get_int_max_str_digits()} digits",
                        path=path, line=line, column=col) from None
    positions = scan(text)
    if "rules" in data and not isinstance(data["rules"], list):
        pos = locate(positions, ("rules",))
        raise PlanError("rules must be a list of strings, e.g. rules = [\"experts -> cpu\"]", path=path,
                        line=pos.line if pos else None, column=pos.column if pos else None)
    for table in ("model", "engine", "flags", "targets", "machine"):
        if isinstance(data.get(table), dict) and "rules" in data[table]:
            pos = locate(positions, (table, "rules"))
            raise PlanError(
                f"'rules' is inside [{table}]: move `rules = [...]` above the first [table] header",
                path=path, line=pos.line if pos else None, column=pos.column if pos else None,
            )
    config = validate(data)
    if config is None:
        config = _validate_with_pydantic(data, positions, path)
    rule_positions = tuple(positions.get(("rules", i)) for i in range(len(config.rules)))
    rules: list[Rule] = []
    for i, text_i in enumerate(config.rules):
        try:
            rules.append(parse_rule(text_i, i))
        except RuleSyntaxError as e:
            pos = rule_positions[i]
            raise PlanError(
                e.message, path=path, line=pos.line if pos else None,
                column=(pos.column + 1 + (e.offset or 0)) if pos else None, context=e.context,
            ) from None
    return Plan(path, config, tuple(rules), rule_positions, positions)


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Load and validate a plan file. Raises `PlanError` with file:line:col."""
    spath = os.fspath(path)
    return plan_from_text(read_text(spath, PlanError, "a plan file"), spath)
