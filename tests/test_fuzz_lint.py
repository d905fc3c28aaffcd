"""Fuzzing every input surface of `moeconf lint`: shell, compose, llama-swap, .env and systemd
files (random text, and realistic launch files from tests/corpus and examples/deploy mutated with
the characters that break parsers), `-ot` strings against a real model manifest, inline
directives and `.moeconf.toml` configs.

Property: `moeconf lint` returns 0, 1 or 2 (2 with a message on standard error), never raises,
and each input takes at most a few seconds (the hypothesis deadline). The default run is small;
MOECONF_FUZZ_EXAMPLES=20000 raises the number of examples of each test."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeconf import cli
from tests.conftest import EXAMPLES, REPO

# the default run is small and derandomized (the same inputs every run, so CI is not flaky);
# MOECONF_FUZZ_EXAMPLES=N runs N random inputs per test
EXAMPLES_PER_TEST = int(os.environ.get("MOECONF_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES_PER_TEST, deadline=timedelta(seconds=10),
                derandomize="MOECONF_FUZZ_EXAMPLES" not in os.environ, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SEEDS = sorted([*(REPO / "tests" / "corpus").glob("*.sh"), *(REPO / "tests" / "corpus").glob("*.yaml"),
                *(REPO / "tests" / "corpus").glob("*.env"), *(EXAMPLES / "deploy").glob("*.*")])
SEEDS = [p for p in SEEDS if p.suffix in (".sh", ".yml", ".yaml", ".env", ".service")]
NAMES = {".sh": "run.sh", ".yml": "docker-compose.yml", ".yaml": "llama-swap.yaml", ".env": "x.env",
         ".service": "llama.service"}
MANIFEST = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"

# what breaks parsers: quoting, expansion, heredocs, YAML structure and aliases, separators
NASTY = ["'", '"', "\\", "$", "$(", "`", "${", "}", "${A:-", "$A$A", "A=$A$A\n", "<<EOF\n", "<<-'E'\n", "\nEOF\n",
         "&a ", "*a", "<<: *a\n", "[", "]", "{", "}", ": ", "- ", "\n  ", "\t", "\n", "#", ",", "=", ";", "&&", "|",
         "\x00", "\r", "\ufeff", "é", "-ot ", "-m ", "--override-tensor=", "exps=CPU", "=CUDA0", "cmd: ",
         "command: ", "models:\n", "services:\n", "ExecStart=", "Environment=", "LLAMA_ARG_OVERRIDE_TENSOR=",
         "# moeconf: engine=ik_llama.cpp\n", "# moeconf: model=../nowhere.gguf\n", "# moeconf: gpus=CUDA0+\n",
         "# moeconf: ignore[all]\n", "${PORT}", "macros:\n  m: ${m}\n", "- |\n", ">-\n", "!!binary ", "? ", "...\n"]


def lint_exit(files: dict[str, str | bytes], config: str | None = None, extra: list[str] | None = None) -> int:
    """Write `files` into a fresh folder, lint it in-process; check the property."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, content in files.items():
            data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
            (root / name).write_bytes(data)
        if config is not None:
            (root / ".moeconf.toml").write_text(config, encoding="utf-8", errors="surrogatepass")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(["lint", "--format", "json", *(extra or []), str(root)])
            except SystemExit as e:  # argparse's own usage errors
                code = e.code if isinstance(e.code, int) else 2
        assert code in (0, 1, 2), (code, err.getvalue())
        if code == 2:
            assert err.getvalue().strip(), "exit 2 without a message"
        if out.getvalue():
            report = json.loads(out.getvalue())
            assert all(f["line"] >= 1 and f["column"] >= 1 for f in report["findings"])
        return code


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, str]:
    seed = draw(st.sampled_from(SEEDS))
    text = seed.read_text()
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["insert", "delete", "duplicate", "replace"]))
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 40)))
        if op == "insert":
            text = text[:i] + draw(st.sampled_from(NASTY) | st.text(max_size=8)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[j:]
        elif op == "duplicate":
            text = text[:j] + text[i:j] * draw(st.integers(1, 4)) + text[j:]
        else:
            text = text[:i] + draw(st.sampled_from(NASTY)) + text[j:]
    return NAMES[seed.suffix], text


@FUZZ
@given(mutated())
def test_mutated_launch_files(case: tuple[str, str]) -> None:
    name, text = case
    lint_exit({name: text})


@FUZZ
@given(st.sampled_from(sorted(set(NAMES.values()))),
       st.lists(st.sampled_from(NASTY) | st.text(max_size=12), max_size=30).map("".join))
def test_random_text_of_each_kind(name: str, text: str) -> None:
    lint_exit({name: text})


@FUZZ
@given(st.sampled_from(sorted(set(NAMES.values()))), st.binary(max_size=400))
def test_random_bytes_of_each_kind(name: str, data: bytes) -> None:
    lint_exit({name: data})


_PATTERN = st.text(alphabet=list("blk.\\d0123456789()[]|*+?^$ffn_upgatedownexpsshattn-{},:=!<>#'\" "), max_size=40)
_DEVICE = st.sampled_from(["CPU", "CUDA0", "CUDA1", "cuda0", "RPC0[10.0.0.2:50052]", "$GPU", "Vulkan0", "", "?"])


@FUZZ
@given(st.lists(st.tuples(_PATTERN, _DEVICE), min_size=1, max_size=12),
       st.sampled_from(["llama.cpp", "ik_llama.cpp"]), st.booleans())
def test_ot_strings_against_a_model(items: list[tuple[str, str]], engine: str, as_env: bool) -> None:
    ot = ",".join(f"{p}={d}" if d != "?" else p for p, d in items)
    quoted = "'" + ot.replace("'", "'\\''") + "'"
    directive = f"# moeconf: engine={engine} model={MANIFEST}\n"
    if as_env:
        text = f"{directive}LLAMA_ARG_OVERRIDE_TENSOR={quoted} llama-server -m /m.gguf -fit off\n"
    else:
        text = f"{directive}llama-server -m /m.gguf -fit off -ngl 99 -ot {quoted}\n"
    lint_exit({"run.sh": text})


_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=12)
    | st.sampled_from(["MOE010", "unescaped-dot", "error", "warning", "info", "warn", "CUDA0", "llama.cpp", "b7600"]),
    lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=8), v, max_size=3), max_leaves=6)
_KEYS = st.sampled_from(["engine", "engine_version", "gpus", "models", "select", "ignore", "severity", "fail_on",
                         "selec", "ignor"])


def _toml_value(v: object) -> str:
    if v is None:
        return '""'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


@FUZZ
@given(st.dictionaries(_KEYS, _VALUE, max_size=4), st.lists(st.text(max_size=14), max_size=2))
def test_configs_and_rule_options(table: dict[str, object], select: list[str]) -> None:
    config = "".join(f"{k} = {_toml_value(v)}\n" for k, v in table.items())
    extra = [f"--select={s}" for s in select]
    lint_exit({"run.sh": "llama-server -m /m.gguf -fit off -ot 'blk.1.=CPU'\n"}, config, extra)


def test_a_fuzz_failure_would_be_caught() -> None:
    """The property itself refuses a wrong result: a crash in the linter fails the property."""
    import pytest

    from moeconf.linting import sources

    real = sources.shell_launches
    sources.shell_launches = lambda *a, **k: 1 / 0  # type: ignore[assignment]
    try:
        with pytest.raises((ZeroDivisionError, AssertionError)):  # raised, or exit 3 from a top-level guard
            lint_exit({"run.sh": "llama-server\n"})
    finally:
        sources.shell_launches = real
