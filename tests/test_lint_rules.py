"""Every lint rule's own documentation examples: FAIL examples must produce the rule's finding,
PASS examples must not. The docs cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from moeconf.linting.linter import lint
from moeconf.linting.rules import ALL
from tests.conftest import EXAMPLES

_HEAD = re.compile(r"^(FAIL|PASS)(?: \((?P<opts>[^)]*)\))?:$")


def examples(rule: ModuleType) -> list[tuple[str, dict[str, str], str]]:
    doc = rule.__doc__ or ""
    lines = doc.splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _HEAD.match(lines[i].strip())
        if not m:
            i += 1
            continue
        opts = dict(kv.split("=", 1) for kv in (m.group("opts") or "").split(", ") if kv)
        body = []
        i += 1
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
            if lines[i].strip():
                body.append(lines[i][4:])
            i += 1
        out.append((m.group(1), opts, "\n".join(body) + "\n"))
    return out


CASES = [(rule, kind, opts, body) for rule in ALL for kind, opts, body in examples(rule)]


def test_every_rule_has_fail_and_pass_examples() -> None:
    for rule in ALL:
        kinds = {k for k, _, _ in examples(rule)}
        assert kinds == {"FAIL", "PASS"}, rule.NAME
        assert re.fullmatch(r"MOE\d{3}", rule.CODE)
        assert rule.__doc__ and rule.__doc__.split(":", 1)[0].strip() == rule.NAME
    codes = [r.CODE for r in ALL]
    names = [r.NAME for r in ALL]
    assert len(set(codes)) == len(codes) and len(set(names)) == len(names)


@pytest.mark.parametrize(("rule", "kind", "opts", "body"), CASES,
                         ids=[f"{r.NAME}-{k}" for r, k, _, _ in CASES])
def test_rule_examples(tmp_path: Path, rule: ModuleType, kind: str, opts: dict[str, str], body: str) -> None:
    model = opts.get("model")
    cfg = [f'engine = "{opts.get("engine", "llama.cpp")}"']
    if "version" in opts:
        cfg.append(f'engine_version = "{opts["version"]}"')
    if "gpu_memory" in opts:
        sizes = ", ".join(f'"{d}" = "{s}"' for d, s in (x.split(":") for x in opts["gpu_memory"].split("+")))
        cfg.append(f"gpu_memory = {{{sizes}}}")
    if model:
        cfg.append("[models]")
        cfg.append(f'"m.gguf" = "{EXAMPLES}/models/{model}.manifest.json"')
        cfg.append(f'"/models/m.gguf" = "{EXAMPLES}/models/{model}.manifest.json"')
    (tmp_path / ".moeconf.toml").write_text("\n".join(cfg) + "\n")
    name = opts.get("file", "launch.sh")
    if model:
        body = body.replace("@MODEL@", f"{EXAMPLES}/models/{model}.manifest.json")
    llama_config = None
    body, sep, ini = body.partition("--- llama.cpp config.ini ---\n")
    if sep:  # the example's llama.cpp config file (engines/llamaconfig.py), in place of this machine's
        from moeconf.engines.llamaconfig import load

        (tmp_path / "config.ini").write_text(ini)
        llama_config = load([str(tmp_path / "config.ini")])
    (tmp_path / name).write_text(body)
    result = lint([str(tmp_path / name)], llama_config=llama_config)
    mine = [f for f in result.findings if f.code == rule.CODE]
    if kind == "FAIL":
        assert mine, f"{rule.NAME}: FAIL example produced no finding; got {[f.text() for f in result.findings]}"
        for f in mine:
            assert f.line >= 1 and f.column >= 1
    else:
        assert not mine, f"{rule.NAME}: PASS example produced {[f.text() for f in mine]}"


def test_docs_list_every_rule() -> None:
    from tests.conftest import REPO

    page = (REPO / "docs" / "lint.md").read_text()
    for rule in ALL:
        assert f"| `{rule.CODE}` | `{rule.NAME}` | {rule.SEVERITY} |" in page, rule.NAME
