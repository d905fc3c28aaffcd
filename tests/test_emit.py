"""Every target round-trips: parsing the output the way its consumer does gives back the exact
`-ot` value (shell split, JSON, dotenv and docker --env-file, compose YAML with `$$`, llama-swap's
own cmd processing)."""

from __future__ import annotations

import io
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from dotenv import dotenv_values

from moeconf.compile import Compiled, compile_plan
from moeconf.emitting.targets import TARGETS, emit
from moeconf.errors import MoeconfError
from tests.conftest import EXAMPLES

PLANS = sorted((EXAMPLES / "plans").glob("*.toml"))


def ot_from_argv(argv: list[str]) -> str:
    values = [argv[i + 1] for i, a in enumerate(argv) if a in ("-ot", "--override-tensor")]
    assert len(values) == 1, argv
    return values[0]


def llama_swap_cmd_argv(cmd: str, macros: dict[str, str]) -> list[str]:
    """llama-swap's processing of `cmd`: drop comment lines, join trailing backslashes,
    expand ${macros}, then split like a POSIX shell."""
    lines = [ln for ln in cmd.splitlines() if not ln.strip().startswith("#")]
    text = "\n".join(ln[:-1] + " " if ln.endswith("\\") else ln for ln in lines)
    text = re.sub(r"\$\{([A-Za-z0-9_-]+)\}", lambda m: macros[m.group(1)], text)
    return shlex.split(text)


def docker_env_file(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        k, _, v = line.partition("=")
        out[k] = v
    return out


def extract(c: Compiled, target: str, text: str) -> str:
    if target in ("llama.cpp", "ik_llama.cpp", "docker"):
        lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert len(lines) == 1
        return ot_from_argv(shlex.split(lines[0]))
    if target == "argv":
        return ot_from_argv(json.loads(text))
    if target == "env":
        a = dotenv_values(stream=io.StringIO(text))["LLAMA_ARG_OVERRIDE_TENSOR"]
        b = docker_env_file(text)["LLAMA_ARG_OVERRIDE_TENSOR"]
        assert a == b
        return str(a)
    if target == "compose":
        doc = yaml.safe_load(text)
        (svc,) = doc["services"].values()
        return ot_from_argv([a.replace("$$", "$") for a in svc["command"]])
    if target == "llama-swap":
        doc = yaml.safe_load(text)
        (model,) = doc["models"].values()
        return ot_from_argv(llama_swap_cmd_argv(model["cmd"], {"PORT": "5800"}))
    if target == "json":
        data = json.loads(text)
        assert ot_from_argv(data["argv"]) == data["ot"]
        return str(data["ot"])
    if target == "ot":
        return text.rstrip("\n")
    raise AssertionError(target)


def extract_ot_all_targets(c: Compiled) -> dict[str, str]:
    out = {}
    for target in TARGETS:
        if target in ("llama.cpp", "ik_llama.cpp") and target != c.engine.name:
            continue
        if target == "env" and not c.engine.env_override_tensor:
            continue
        out[target] = extract(c, target, emit(c, target))
    return out


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.stem)
def test_examples_round_trip_every_target(plan: Path) -> None:
    c = compile_plan(plan)
    assert c.ot
    values = extract_ot_all_targets(c)
    assert set(values) >= {"argv", "docker", "compose", "llama-swap", "json", "ot", c.engine.name}
    assert all(v == c.ot for v in values.values()), values


def test_env_refused_for_ik() -> None:
    c = compile_plan(EXAMPLES / "plans" / "gpt-oss-120b.toml")
    assert c.engine.name == "ik_llama.cpp"
    with pytest.raises(MoeconfError, match=r"ik_llama\.cpp reads no -ot"):
        emit(c, "env")


def test_env_for_mainline_has_the_flags() -> None:
    c = compile_plan(EXAMPLES / "plans" / "qwen3-235b-a22b.toml")
    env = docker_env_file(emit(c, "env"))
    assert env["LLAMA_ARG_FIT"] == "off"
    assert env["LLAMA_ARG_N_GPU_LAYERS"] == "999"
    assert env["LLAMA_ARG_NO_MMAP"] == "1"  # b7600 predates --load-mode
    assert env["LLAMA_ARG_MODEL"] == "/models/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf"


def test_compose_doubles_dollars_and_quotes_backslashes() -> None:
    from moeconf.emitting.targets import yaml_str

    assert yaml_str(r"a\.b$=CPU", compose=True) == r"'a\.b$$=CPU'"
    assert yaml.safe_load("x: " + yaml_str("it's")) == {"x": "it's"}


def test_docker_images() -> None:
    c = compile_plan(EXAMPLES / "plans" / "qwen3-235b-a22b.toml")
    assert "ghcr.io/ggml-org/llama.cpp:server-cuda-b7600" in emit(c, "docker")
    c = compile_plan(EXAMPLES / "plans" / "gpt-oss-120b.toml")
    text = emit(c, "docker")
    assert "ghcr.io/ikawrakow/ik-llama-cpp:cu12-server" in text
    assert "--host 0.0.0.0" in text  # ik's image does not set LLAMA_ARG_HOST


def test_llama_swap_uses_port_macro() -> None:
    c = compile_plan(EXAMPLES / "plans" / "qwen3-235b-a22b.toml")
    doc = yaml.safe_load(emit(c, "llama-swap"))
    argv = llama_swap_cmd_argv(doc["models"]["qwen3-235b"]["cmd"], {"PORT": "5800"})
    assert argv[argv.index("--port") + 1] == "5800"
