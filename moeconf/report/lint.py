"""Lint findings as text, JSON (`schemas/lint.schema.json`) and SARIF 2.1.0 for code scanning."""

from __future__ import annotations

import json
import os
from typing import Any

from moeconf.linting.linter import (
    CANNOT_CHECK,
    FINDINGS_CAPPED,
    INPUT_INVALID,
    INPUT_SKIPPED,
    PLAN_INVALID,
    TOO_MANY_OVERRIDES,
    LintResult,
)
from moeconf.linting.model import Finding
from moeconf.textsafe import safe

# findings about the input itself, not from a rule module
_META_DOC = {
    INPUT_INVALID: "a file that cannot be read as its kind (the tool that reads it would refuse it)",
    INPUT_SKIPPED: "a special file (FIFO, device, socket, broken link) or an oversized file, not read",
    CANNOT_CHECK: "a value the file does not fix (command substitution, unset variable) or over a budget",
    FINDINGS_CAPPED: "more findings, invocations or YAML nodes than moeconf reports or reads",
    TOO_MANY_OVERRIDES: "more -ot items than the engine accepts",
}

_PLAN_INVALID_DOC = "a plan that does not compile"

_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _rule_doc(code: str) -> tuple[str, str]:
    from moeconf.linting.rules import BY_CODE

    mod = BY_CODE.get(code)
    if mod is None:
        return "", ""
    doc = (mod.__doc__ or "").strip()
    first, _, rest = doc.partition("\n")
    short = first.split(":", 1)[1].strip() if ":" in first else first
    why = rest.strip().split("\n\nFAIL", 1)[0].strip()
    return short, why


def _meta_doc(code: str) -> str:
    if code == PLAN_INVALID[0]:
        return _PLAN_INVALID_DOC
    return next((doc for kind, doc in _META_DOC.items() if kind[0] == code), "")


def rule_page(name: str) -> str:
    """`moeconf rule CODE`: the rule module's docstring (what it catches, why, FAIL and PASS
    examples, which the tests run), headed by its code, name and default severity."""
    from moeconf.linting.linter import check_rule_names, known_rules
    from moeconf.linting.rules import BY_CODE

    check_rule_names([name], "`moeconf rule`")  # an unknown one: exit 2 naming the closest
    known = known_rules()
    code = name if name in known else next(c for c, n in known.items() if n == name)
    mod = BY_CODE.get(code)
    if mod is None:  # a finding of the linter itself (plan-invalid, input-invalid, ...): no module
        return f"{code} {known[code]}\n\n{_meta_doc(code)}\n"
    doc = (mod.__doc__ or "").strip()
    needs = "needs the model" if mod.NEEDS_MODEL else "works without the model"
    return f"{mod.CODE} {mod.NAME} [{mod.SEVERITY}] ({needs})\n\n{doc}\n"


def rule_index() -> str:
    """`moeconf rule`: every rule, one line each."""
    from moeconf.linting.linter import known_rules
    from moeconf.linting.rules import BY_CODE

    lines = []
    for code, name in sorted(known_rules().items()):
        mod = BY_CODE.get(code)
        short = _rule_doc(code)[0] if mod is not None else _meta_doc(code)
        lines.append(f"{code} {name:<26} {short}")
    return "\n".join(lines) + "\n`moeconf rule CODE` prints a rule's page.\n"


def text(result: LintResult) -> str:
    lines = [safe(f.text()) for f in result.findings]
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in ("error", "warning", "info")}
    summary = (f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info in "
               f"{len(result.files)} file(s), {result.launches} engine invocation(s)")
    return "\n".join([*lines, summary]) + "\n"


def as_json(result: LintResult) -> dict[str, Any]:
    return {
        "findings": [f.json() for f in result.findings],
        "files": list(result.files),
        "launches": result.launches,
    }


def sarif(result: LintResult, base: str | None = None) -> dict[str, Any]:
    from moeconf import __version__
    from moeconf.linting.rules import ALL

    rules = []
    index = {}
    for i, mod in enumerate(ALL):
        short, why = _rule_doc(mod.CODE)
        index[mod.CODE] = i
        rules.append({
            "id": mod.CODE,
            "name": mod.NAME,
            "shortDescription": {"text": short},
            "fullDescription": {"text": why or short},
            "defaultConfiguration": {"level": _SARIF_LEVEL[mod.SEVERITY]},
            "properties": {"tags": ["moe", "placement"]},
        })
    code, name, sev = PLAN_INVALID
    rules.append({"id": code, "name": name, "shortDescription": {"text": _PLAN_INVALID_DOC},
                  "defaultConfiguration": {"level": _SARIF_LEVEL[sev]}})
    index[code] = len(rules) - 1
    for (code, name, sev), doc in _META_DOC.items():
        rules.append({"id": code, "name": name, "shortDescription": {"text": doc},
                      "defaultConfiguration": {"level": _SARIF_LEVEL[sev]}})
        index[code] = len(rules) - 1

    def uri(path: str) -> str:
        rel = os.path.relpath(path, base) if base else path
        return rel.replace(os.sep, "/")

    results = []
    for f in result.findings:
        results.append(_sarif_result(f, index, uri(f.path)))
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "moeconf", "version": __version__, "rules": rules}},
            "results": results,
        }],
    }


def _sarif_result(f: Finding, index: dict[str, int], uri: str) -> dict[str, Any]:
    return {
        "ruleId": f.code,
        "ruleIndex": index.get(f.code, 0),
        "level": _SARIF_LEVEL[f.severity],
        "message": {"text": f"{f.name}: {f.message}"},
        "locations": [{"physicalLocation": {
            "artifactLocation": {"uri": uri},
            "region": {"startLine": max(f.line, 1), "startColumn": max(f.column, 1)},
        }}],
    }


def render(result: LintResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(as_json(result), indent=1) + "\n"
    if fmt == "sarif":
        return json.dumps(sarif(result, os.getcwd()), indent=1) + "\n"
    return text(result)
