"""No value in a plan can change the structure of the YAML or shell moeconf writes: for random
strings in every user-controlled field, the output of every target parses back (yaml.safe_load,
shlex.split, llama-swap's cmd processing, dotenv) to the same structure and the same values, or
the value is refused with a clear error, and only when the target cannot carry it."""

from __future__ import annotations

import io
import json
import re
import shlex
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from dotenv import dotenv_values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from moeconf.cli import main
from moeconf.compile import Compiled, compile_plan
from moeconf.emitting.argv import build_argv
from moeconf.emitting.targets import docker_argv, docker_image, emit, server_args
from moeconf.errors import MoeconfError, PlanError
from moeconf.plan.model import PlanModel
from moeconf.textsafe import first_unsafe
from tests.conftest import EXAMPLES
from tests.test_emit import docker_env_file, llama_swap_cmd_argv

SPECIAL = ["\n", "\r", "\r\n", "'", '"', "$", "$$", " ", "#", " #", "\\", "`", ":", ": ", "-", "--", "- ", "&&", ";",
           "|", "\t", "\x1b[2J", "${PORT}", "${x}", "{", "}", "[", "]", ",", "*", "&a", "*a", "!tag", "%", "@", "~",
           "null", "true", "\u2028", "\x85", "é", "\ufeff", "\uffff", "? ", "\n    privileged: true\n", "'\n  x: 1"]
VALUE = st.lists(st.one_of(st.sampled_from(SPECIAL), st.text(max_size=4)), max_size=6).map("".join)
SERVICE = st.one_of(st.from_regex(r"[a-zA-Z0-9._-]{1,12}", fullmatch=True), VALUE)
FIELDS = st.fixed_dictionaries({
    "serve_path": VALUE.filter(bool), "binary": VALUE, "host": VALUE, "docker_image": VALUE,
    "docker_volumes": st.lists(VALUE, max_size=2), "compose_service": SERVICE, "llama_swap_model": VALUE,
    "extra": st.lists(VALUE, max_size=3), "cache_type_k": VALUE,
})
ENV_UNQUOTABLE = set(" \t\n#'\"$")
_MACRO = re.compile(r"\$\{([A-Za-z0-9_-]+)\}")


@cache
def base(plan: str) -> Compiled:
    return compile_plan(EXAMPLES / "plans" / plan)


def with_fields(c0: Compiled, fields: dict[str, Any]) -> Compiled:
    data = c0.plan.config.model_dump()
    data["model"]["serve_path"] = fields["serve_path"]
    for key in ("binary", "host", "docker_image", "docker_volumes", "compose_service", "llama_swap_model"):
        data["targets"][key] = fields[key] or None if key not in ("docker_volumes", "compose_service") else fields[key]
    data["flags"]["extra"] = fields["extra"]
    data["flags"]["cache_type_k"] = fields["cache_type_k"] or None
    plan = replace(c0.plan, config=PlanModel.model_validate(data))
    return replace(c0, plan=plan, argv=tuple(build_argv(plan, c0.engine, c0.inventory, c0.synthesis)))


def _values(fields: dict[str, Any]) -> list[str]:
    out = [fields[k] for k in ("serve_path", "binary", "host", "docker_image", "compose_service",
                               "llama_swap_model", "cache_type_k")]
    return out + fields["docker_volumes"] + fields["extra"]


def _parse_back(c: Compiled, target: str, text: str) -> None:
    t = c.plan.config.targets
    if target in ("llama.cpp", "ik_llama.cpp"):
        assert text.count("\n") == 1
        assert shlex.split(text) == list(c.argv)
    elif target == "docker":
        assert text.count("\n") == 1
        words = shlex.split(text)
        assert words == docker_argv(c)
        assert words[-len(server_args(c, for_container=True)):] == server_args(c, for_container=True)
        assert [words[i + 1] for i, w in enumerate(words) if w == "-v"] == list(t.docker_volumes)
        assert docker_image(c) in words
    elif target == "compose":
        doc = yaml.safe_load(text)
        assert list(doc) == ["services"]
        assert list(doc["services"]) == [t.compose_service]
        svc = doc["services"][t.compose_service]
        assert set(svc) <= {"image", "command", "ports", "volumes", "deploy"}

        def unescape(v: str) -> str:
            return v.replace("$$", "$")  # compose's interpolation of the doubled dollars

        assert unescape(svc["image"]) == docker_image(c)
        assert [unescape(a) for a in svc["command"]] == server_args(c, for_container=True)
        assert [unescape(v) for v in svc.get("volumes", [])] == list(t.docker_volumes)
    elif target == "llama-swap":
        doc = yaml.safe_load(text)
        assert list(doc) == ["models"]
        name = t.llama_swap_model or Path(c.plan.path).stem
        assert list(doc["models"]) == [name]
        entry = doc["models"][name]
        assert set(entry) <= {"cmd", "proxy"}
        macros: dict[str, str] = {"PORT": "5800"}
        got = llama_swap_cmd_argv(entry["cmd"], _Identity(macros))
        # ${...} in a value is llama-swap's own macro syntax: it expands it, as it would by hand
        want = [_MACRO.sub(lambda m: _Identity(macros)[m.group(1)], a) for a in c.argv] + ["--port", "5800"]
        assert got == want
    elif target == "env":
        parsed = dotenv_values(stream=io.StringIO(text))
        assert parsed == docker_env_file(text)
        assert parsed["LLAMA_ARG_MODEL"] == c.argv[c.argv.index("-m") + 1]
        if t.host:
            assert parsed["LLAMA_ARG_HOST"] == t.host
    else:
        raise AssertionError(target)


class _Identity(dict[str, str]):
    """Macros: PORT is defined, any other ${name} stays as written."""

    def __missing__(self, key: str) -> str:
        return "${" + key + "}"


def _expect_refusal(target: str, fields: dict[str, Any]) -> bool:
    values = _values(fields)
    if any(first_unsafe(v) is not None for v in values):
        return True
    if target == "env":
        in_env = [fields["serve_path"], fields["host"], fields["cache_type_k"]]
        return bool(fields["extra"]) or any(ENV_UNQUOTABLE & set(v) or any(ch.isspace() for ch in v)
                                            for v in in_env)
    if target == "llama-swap":
        # llama-swap expands ${...} in cmd, quoted or not: a value the command line carries with it is refused
        in_cmd = [fields["serve_path"], fields["binary"], fields["host"], fields["cache_type_k"], *fields["extra"]]
        return any("${" in v for v in in_cmd)
    return False


@pytest.mark.parametrize("plan", ["qwen3-235b-a22b.toml", "gpt-oss-120b.toml"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=FIELDS)
def test_no_value_changes_the_structure(plan: str, fields: dict[str, Any]) -> None:
    c0 = base(plan)
    try:
        c = with_fields(c0, fields)
    except ValidationError as e:
        loc = e.errors()[0]["loc"]
        if loc == ("targets", "binary"):  # a binary the engine would read as an option
            assert fields["binary"].startswith("-"), e
            return
        assert not re.fullmatch(r"[a-zA-Z0-9._-]+", fields["compose_service"]), e
        assert loc == ("targets", "compose_service")
        return
    assert json.loads(emit(c, "argv")) == list(c.argv)  # JSON carries any value
    assert json.loads(emit(c, "json"))["argv"] == list(c.argv)
    for target in (c.engine.name, "docker", "compose", "llama-swap", "env"):
        if target == "env" and not c.engine.env_override_tensor:
            continue
        try:
            text = emit(c, target)
        except MoeconfError as e:
            assert _expect_refusal(target, fields), f"{target}: refused without reason: {e}"
            continue
        assert not _expect_refusal(target, fields), f"{target} accepted {fields}"
        _parse_back(c, target, text)


def test_compose_service_injection_is_a_plan_error_at_its_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    manifest = EXAMPLES / "models" / "gpt-oss-20b.manifest.json"
    plan = tmp_path / "plan.toml"
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{manifest}"\nserve_path = "/m/x.gguf"\n'
                    '[targets]\ncompose_service = "llama:\\n    privileged: true\\n  x"\n')
    assert main(["compile", str(plan), "--target", "compose"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"moeconf: error: {plan}:6:1: targets.compose_service: String should match pattern")
    assert "privileged: true\n" not in err


def test_a_newline_in_a_path_is_refused_at_its_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = EXAMPLES / "models" / "gpt-oss-20b.manifest.json"
    plan = tmp_path / "plan.toml"
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{manifest}"\n'
                    'serve_path = "/m/x.gguf\\n    privileged: true"\n')
    for target in ("compose", "llama-swap", "docker", "llama.cpp"):
        assert main(["compile", str(plan), "--target", target]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"moeconf: error: {plan}:4:1: model.serve_path has a control character (\\n)"), err
    assert main(["compile", str(plan), "--target", "json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["argv"][2] == "/m/x.gguf\n    privileged: true"


def test_awkward_but_printable_values_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Quotes, spaces, `$`, `#` and YAML indicators in paths and names survive every target."""
    fields = {"serve_path": "/models/it's a \"model\" $HOME #1: - [x].gguf", "binary": "/opt/llama server/bin",
              "host": "::", "docker_image": "reg.example/llama:$TAG", "docker_volumes": ["/m y:/models:ro"],
              "compose_service": "llm.svc-1", "llama_swap_model": "true", "extra": ["--alias", "a 'b' \"c\" $x {y}"],
              "cache_type_k": "q8_0"}
    for plan in ("qwen3-235b-a22b.toml", "gpt-oss-120b.toml"):
        c = with_fields(base(plan), fields)
        for target in (c.engine.name, "docker", "compose", "llama-swap"):
            _parse_back(c, target, emit(c, target))


def test_a_macro_in_a_llama_swap_value_is_refused_at_its_key(tmp_path: Path) -> None:
    """llama-swap expands ${...} anywhere in cmd, quoted or not (and ${PORT} itself): a value with
    `${` would not reach the engine as written, so it is a plan error at its key, never exit 3."""
    c = with_fields(base("gpt-oss-120b.toml"), {"serve_path": "/m/${PORT}.gguf", "binary": "", "host": "",
                                                   "docker_image": "", "docker_volumes": [], "compose_service": "x",
                                                   "llama_swap_model": "", "extra": [], "cache_type_k": ""})
    with pytest.raises(PlanError, match=r"model.serve_path contains '\$\{': llama-swap expands"):
        emit(c, "llama-swap")
    assert "${PORT}" in emit(c, c.engine.name)  # the shell target quotes it as it is


@pytest.mark.parametrize("path", ["\xa0", "model\u2003.gguf", "\u3000m.gguf"])
def test_env_refuses_unicode_whitespace_that_dotenv_strips(path: str) -> None:
    """A counterexample hypothesis found: python-dotenv (and compose) strip a value's Unicode spaces
    where docker --env-file keeps them, so `LLAMA_ARG_MODEL=\\xa0` read back as '' under compose; any
    whitespace in a value is refused, as the ASCII space already was."""
    fields = {"serve_path": path, "binary": "", "host": "", "docker_image": "", "docker_volumes": [],
              "compose_service": "llama", "llama_swap_model": "", "extra": [], "cache_type_k": ""}
    c = with_fields(base("qwen3-235b-a22b.toml"), fields)
    with pytest.raises(MoeconfError, match="cannot be written unquoted"):
        emit(c, "env")
