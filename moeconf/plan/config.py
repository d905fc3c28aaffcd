"""Plan validation without pydantic on the hot path.

The plan's single source of truth is the pydantic model (`moeconf.plan.model`); the JSON Schema
generated from it ships inside the package (`plan.schema.json`, checked by a test to be current).
`validate` reads that schema and accepts only values it can take *exactly* as pydantic would
(no coercions beyond int -> float for number fields), returning a `Section` with the same
attributes and values as the pydantic model. Anything else returns None, and the caller asks
pydantic, which gives the error message (or, for an input this validator is too strict for, the
value). A property test checks that whatever this accepts, pydantic accepts with equal values.
Importing pydantic and building the models costs ~0.15 s, most of a `compile` run.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from functools import cache
from typing import Any


class Section:
    """A validated plan table: attribute access, immutable, compares by value."""

    __slots__ = ("_extra", "_values")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, values: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_extra", extra)

    @property
    def model_extra(self) -> dict[str, Any] | None:
        """Keys a table allows beyond its fields (`[budget]` devices), as pydantic's `model_extra`."""
        extra: dict[str, Any] | None = self._extra
        return extra

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"plan sections are read-only ({key})")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Section):
            return bool(self._values == other._values and self._extra == other._extra)
        return NotImplemented

    def __repr__(self) -> str:
        return "Section(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def model_copy(self, update: dict[str, Any] | None = None) -> Section:
        """A copy with some values replaced (pydantic's spelling, so either config works)."""
        return Section({**self._values, **(update or {})}, self._extra)

    def model_dump(self) -> dict[str, Any]:
        items = {**self._values, **(self._extra or {})}
        return {k: v.model_dump() if isinstance(v, Section) else copy.deepcopy(v) for k, v in items.items()}


@cache
def plan_schema_file() -> dict[str, Any]:
    """The packaged plan schema (generated from the pydantic model)."""
    # a plain file read: importlib.resources would import tempfile, zipfile and more (~5 ms)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan.schema.json"), encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


class _Reject(Exception):
    pass


def validate(data: Any) -> Section | None:
    """`data` (parsed TOML) as a validated `Section`, or None if pydantic must decide."""
    schema = plan_schema_file()
    try:
        out = _value(data, schema, schema.get("$defs", {}))
    except _Reject:
        return None
    assert isinstance(out, Section)
    return out


def _value(v: Any, sch: dict[str, Any], defs: dict[str, Any]) -> Any:
    ref = sch.get("$ref")
    if ref is not None:
        sch = defs[ref.rsplit("/", 1)[-1]]
    if "anyOf" in sch:
        for alt in sch["anyOf"]:
            try:
                return _value(v, alt, defs)
            except _Reject:
                continue
        raise _Reject
    t = sch.get("type")
    if t == "object":
        return _object(v, sch, defs)
    if t == "array":
        if not isinstance(v, list):
            raise _Reject
        items = sch.get("items", {})
        return [_value(x, items, defs) for x in v]
    if t == "string":
        if not isinstance(v, str):
            raise _Reject
        pattern = sch.get("pattern")
        if pattern is not None and not re.fullmatch(pattern, v):
            raise _Reject
    elif t == "integer":
        if not isinstance(v, int) or isinstance(v, bool):
            raise _Reject
        _bounds(v, sch)
    elif t == "number":
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise _Reject
        if isinstance(v, float) and not math.isfinite(v):
            raise _Reject  # nan and inf: pydantic's validators decide
        _bounds(v, sch)
        v = float(v)
    elif t == "boolean":
        if not isinstance(v, bool):
            raise _Reject
    elif t == "null":
        if v is not None:
            raise _Reject
    else:
        raise _Reject  # a schema shape this reader does not know: pydantic decides
    if "const" in sch and v != sch["const"]:
        raise _Reject
    if "enum" in sch and v not in sch["enum"]:
        raise _Reject
    return v


def _bounds(v: float, sch: dict[str, Any]) -> None:
    if "minimum" in sch and v < sch["minimum"]:
        raise _Reject
    if "maximum" in sch and v > sch["maximum"]:
        raise _Reject
    if set(sch) & {"exclusiveMinimum", "exclusiveMaximum", "multipleOf"}:
        raise _Reject


def _object(v: Any, sch: dict[str, Any], defs: dict[str, Any]) -> Section:
    if not isinstance(v, dict):
        raise _Reject
    props: dict[str, Any] = sch.get("properties", {})
    extra_schema = sch.get("additionalProperties")
    extra: dict[str, Any] | None = None
    if isinstance(extra_schema, dict):  # extra="allow" with a schema for the extra values
        extra = {k: _value(x, extra_schema, defs) for k, x in v.items() if k not in props}
    elif extra_schema is not False or set(v) - set(props):
        raise _Reject
    required = set(sch.get("required", ()))
    out: dict[str, Any] = {}
    for key, psch in props.items():
        if key in v:
            out[key] = _value(v[key], psch, defs)
        elif key in required:
            raise _Reject
        elif "default" in psch:
            out[key] = copy.deepcopy(psch["default"])
        elif "$ref" in psch:
            out[key] = _value({}, psch, defs)  # a table left out: all its defaults
        else:
            raise _Reject
    return Section(out, extra)
