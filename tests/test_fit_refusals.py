"""Issue 18, item 1: `fit` never prints a command `explain` says the engine refuses.

Every place in `explain`'s code that records a refusal (the command-line reader, the simulation,
the memory settings and `refused_settings`) is found in the source (below: `_refusal_sites`),
and every one must be reached by some case of CASES when the case runs through `moeconf
explain`: a new refusal without a case here fails `test_every_refusal_explain_knows_has_a_case`.
Each case then goes to `moeconf fit`, which must exit 2 with the reason, or print a command that
`explain` accepts (fit completes what it can: the other cache type on an MLA model, `-fa on`)."""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import pytest

import moeconf.engines.cmdline
import moeconf.engines.settings
import moeconf.explanation
import moeconf.memory.estimate
from moeconf.cli import main

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
QWEN = str(MODELS / "qwen3-30b-a3b.manifest.json")  # not MLA
DSV3 = str(MODELS / "deepseek-v3.manifest.json")  # MLA
# a V head 72 wide (Kimi-Linear's value_length): llama.cpp refuses a q8_0 V cache (block 32)
GROK = str(MODELS / "grok-1.manifest.json")  # flash attention forced off by both engines
HEAD72 = str(Path(__file__).resolve().parent / "data" / "head72.manifest.json")

# (model, engine flags as a user gives them to explain and fit)
CASES: list[tuple[str, list[str]]] = [
    (QWEN, ["--ctk", "q8_0"]),  # a typo: unknown flag
    (QWEN, ["--flash-attn-typo", "on"]),
    (QWEN, ["--ctx-size=4096"]),  # neither engine splits at '='
    (QWEN, ["-m", "/m/Qwen3-30B-A3B-00002-of-00003.gguf"]),  # not the first shard
    (QWEN, ["-ts", "a,b"]),
    (QWEN, ["-mg", "x"]),
    (QWEN, ["-sm", "none", "-mg", "3"]),  # no such main GPU
    (QWEN, ["-sm", "none", "-ot", "exps=CUDA1"]),
    (QWEN, ["-ot", "exps"]),  # no '='
    (QWEN, ["-ot", "exps=CUDA9x"]),  # unknown buffer type
    (QWEN, ["-ot", "exps(=CPU"]),  # a regex the engine refuses
    (QWEN, ["-c"]),  # needs a value
    (QWEN, ["-fa"]),  # mainline's -fa takes a value
    (QWEN, ["-fa", "maybe"]),
    (QWEN, ["-fit", "auto"]),  # -fit's handler takes on/off words only
    (QWEN, ["--env", "LLAMA_ARG_FIT=yes", "-ngl", "99"]),  # and the env loop rethrows its error
    (QWEN, ["--n-cpu-moe", "-3"]),
    (QWEN, ["--n-cpu-ffn", "x"]),  # mainline b11312: a number of blocks
    (QWEN, ["--n-cpu-ffn", "-1"]),
    (QWEN, ["-t", "99999999999"]),  # std::stoi out of range: the engine stops (issue 25)
    (QWEN, ["-ts", "1e308,1"]),  # std::stof out of range
    (QWEN, ["--env", "LLAMA_ARG_MAIN_GPU=x", "-ngl", "99"]),  # an env value std::stoi cannot read
    (QWEN, ["-ngl", "many"]),
    (QWEN, ["-c", "abc"]),
    (QWEN, ["-b", "0"]),
    (QWEN, ["-ctk", "q3_k"]),
    (DSV3, ["-c", "4096", "-ctk", "q8_0"]),  # MLA: fit sets -ctv to match
    (DSV3, ["-c", "4096", "-ctk", "q8_0", "-ctv", "q4_0"]),
    (QWEN, ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off"]),  # quantized V without flash attention
    (HEAD72, ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"]),
    (GROK, ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"]),  # Grok: FA forced off, then no quantized V
    (QWEN, ["llama-server", "-np", "0"]),  # llama-server refuses -np 0  # the cache block does not divide the head
    (QWEN, ["--engine", "ik_llama.cpp", "--engine-version", "0.1.5", "-ngl", "auto"]),  # no -ngl words there
]


def _refusal_sites() -> set[tuple[str, int]]:
    """(file, line) of every statement that records a refusal: `refusals.append(...)`,
    `refusals += ...`, `problems.append(...)` (the command line's and the settings'), in the
    modules `moeconf explain` decides refusals with (refused_settings only, of the estimate)."""
    sites: set[tuple[str, int]] = set()
    mods: list[tuple[ModuleType, str | None]] = [
        (moeconf.explanation, None), (moeconf.engines.cmdline, None), (moeconf.engines.settings, None),
        (moeconf.memory.estimate, "refused_settings")]
    for mod, only in mods:
        path = inspect.getsourcefile(mod)
        assert path
        tree = ast.parse(Path(path).read_text())
        roots: list[ast.AST] = [tree]
        if only:
            roots = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == only]
        for root in roots:
            for node in ast.walk(root):
                target = None
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append":
                    target = node.func.value
                elif isinstance(node, ast.AugAssign):
                    target = node.target
                name = (target.attr if isinstance(target, ast.Attribute)
                        else target.id if isinstance(target, ast.Name) else None)
                if name in ("refusals", "problems"):
                    sites.add((path, node.lineno))
    return sites


SITES = _refusal_sites()
_FILES = {f for f, _ in SITES}


class _Lines:
    def __init__(self) -> None:
        self.hit: set[tuple[str, int]] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename not in _FILES:
            return None
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.hit.add((frame.f_code.co_filename, frame.f_lineno))
        return self._local


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(moeconf's --engine options, the engine flags) of a case."""
    if argv[:1] == ["--engine"]:
        return argv[:4], argv[4:]
    if argv[:1] == ["--env"]:  # explain's environment (fit writes none)
        return argv[:2], argv[2:]
    return [], argv


def _explain(model: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    opts, flags = _split(argv)
    rc = main(["explain", model, *opts, "--json", "--", *flags])
    out = capsys.readouterr()
    return rc, out.out


def test_refusal_sites_are_found() -> None:
    # the source scan itself: it must see the refusals it is meant to enumerate
    assert len(SITES) >= 15
    assert any(f.endswith("estimate.py") for f, _ in SITES) and any(f.endswith("cmdline.py") for f, _ in SITES)


def test_every_refusal_explain_knows_has_a_case(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _Lines()
    refused = []
    old = sys.gettrace()
    sys.settrace(lines)
    try:
        for model, argv in CASES:
            rc, out = _explain(model, argv, capsys)
            data = json.loads(out)
            refused.append(rc == 1 and bool(data["refusals"] or data["memory_problems"]))
    finally:
        sys.settrace(old)
    missing = sorted(SITES - lines.hit)
    assert not missing, f"refusals explain knows that no case reaches (add one to CASES): {missing}"
    assert all(refused), [c for c, r in zip(CASES, refused, strict=True) if not r]


@pytest.mark.parametrize(("model", "argv"), CASES, ids=[" ".join(a) for _, a in CASES])
def test_fit_never_prints_what_explain_refuses(model: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    opts, flags = _split(argv)
    if opts[:1] == ["--env"]:
        pytest.skip("fit takes no environment")
    rc = main(["fit", model, "--gpu", "24GiB", *opts, "--json", *flags])
    out = capsys.readouterr()
    if rc == 2:
        assert out.out == "" and "moeconf: error: " in out.err and "internal error" not in out.err
        return
    assert rc == 0, out.err
    printed = json.loads(out.out)["argv"]
    code, text = _explain(model, [*opts, *printed], capsys)
    data = json.loads(text)
    assert code == 0 and not data["refusals"] and not data["memory_problems"], (printed, data["refusals"])


def test_fit_completes_ctv_on_an_mla_model_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", DSV3, "--gpu", "24GiB", "-c", "32768", "-ctk", "q8_0"]) == 0
    out = capsys.readouterr()
    assert "-ctk q8_0 -ctv q8_0" in out.out.splitlines()[0]
    assert "moeconf: note: -ctv q8_0 added to match -ctk q8_0" in out.err
    # given both, and different, it is the engine's refusal, with nothing printed
    assert main(["fit", DSV3, "--gpu", "24GiB", "-c", "32768", "-ctk", "q8_0", "-ctv", "f16"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "refuses different K and V cache types on an MLA model" in out.err


def test_compile_never_prints_what_the_engine_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compile runs the same checks: a plan whose settings the engine refuses is exit 2 at the
    plan's line, never a printed command."""
    plan = tmp_path / "p.toml"
    head = f'rules = ["experts -> cpu"]\n[model]\npath = "{DSV3}"\nserve_path = "/m/d.gguf"\n[flags]\n'
    plan.write_text(head + 'cache_type_k = "q8_0"\n')
    assert main(["compile", str(plan)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "refuses different K and V cache types on an MLA model" in out.err
    plan.write_text(head + 'cache_type_k = "q8_0"\ncache_type_v = "q8_0"\nflash_attn = "off"\n')
    assert main(["compile", str(plan)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and f"{plan}:8:1: " in out.err and "quantized V cache" in out.err
    plan.write_text(head + 'cache_type_k = "q8_0"\ncache_type_v = "q8_0"\nextra = ["--ctk", "q8_0"]\n')
    assert main(["compile", str(plan)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "unknown argument '--ctk' (did you mean -ctk?)" in out.err
    plan.write_text(head + 'cache_type_k = "q8_0"\ncache_type_v = "q8_0"\n')
    assert main(["compile", str(plan), "-q"]) == 0


_WORDS = ["-c", "4096", "8192", "-ctk", "-ctv", "q8_0", "f16", "q4_0", "-fa", "on", "off", "auto", "-t", "16",
          "--host", "--port", "8080", "--no-mmap", "--mlock", "-lm", "none", "--jinja", "-np", "2", "-nkvo",
          "--swa-full", "-b", "-ub", "512", "0", "-1", "x", "--ctk", "--flash-attn-typo", "-m", "/m/a.gguf",
          "-ngl", "--alias", "--ctx-size=9", "-sm", "row", "layer", "-mg"]


def test_fit_on_random_engine_flags_prints_only_what_explain_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    """A property over word sequences from the flags above: fit exits 2 with a message, or prints a
    command `explain` accepts; never an internal error."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=int(os.environ.get("MOECONF_FUZZ_EXAMPLES", "25")), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(words=st.lists(st.sampled_from(_WORDS), max_size=8), model=st.sampled_from([QWEN, DSV3]))
    def run(words: list[str], model: str) -> None:
        rc = main(["fit", model, "--gpu", "80GiB", "--json", "--", *words])
        out = capsys.readouterr()
        assert rc in (0, 2), (words, out.err)
        if rc == 2:
            assert out.out == "" and out.err.startswith("moeconf: error: ")
            return
        printed = json.loads(out.out)["argv"]
        code, text = _explain(model, printed, capsys)
        data = json.loads(text)
        assert code == 0 and not data["refusals"] and not data["memory_problems"], (words, printed, data)

    run()
