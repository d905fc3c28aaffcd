"""Issue 18, item 7: one library signature. Every public call that involves an engine takes
`engine="llama.cpp"` (a name, with `version=`) or an `Engine`, `moeconf.fit.fit` included (it
raised AttributeError on a name)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import moeconf
from moeconf.engines import Engine, engine
from moeconf.fit import fit

EX = Path(__file__).resolve().parent.parent / "examples"
QWEN = str(EX / "models" / "qwen3-30b-a3b.manifest.json")


def _engine_params() -> list[str]:
    out = []
    for name in moeconf.__all__:
        obj = getattr(moeconf, name)
        if inspect.isfunction(obj) and "engine" in inspect.signature(obj).parameters:
            out.append(name)
    return out


def test_every_public_function_with_an_engine_takes_a_name_or_an_engine() -> None:
    names = _engine_params()
    assert {"explain", "lint", "compile_plan"} <= set(names)
    for name in [*names, "fit"]:
        fn = fit if name == "fit" else getattr(moeconf, name)
        ann = str(inspect.signature(fn).parameters["engine"].annotation)
        assert "str" in ann and "Engine" in ann, (name, ann)


@pytest.mark.parametrize("how", ["llama.cpp", engine("llama.cpp"), engine("llama.cpp", "b7600")])
def test_fit_takes_a_name_or_an_engine(how: str | Engine) -> None:
    inv = moeconf.load_inventory(QWEN)
    r = fit(inv, how, {"CUDA0": "12GiB"}, ["-c", "8192"])
    assert r.memory.devices["CUDA0"].total <= 12 * 2**30 and r.argv[0] == "llama-server"
    assert r.compiled.engine.name == "llama.cpp"
    assert r.assumptions["engine_version"] == ("b7600" if isinstance(how, Engine) and how.version else "b11312")


def test_fit_budgets_need_units_in_the_library_too() -> None:
    with pytest.raises(moeconf.MoeconfError, match="has no unit: write 12GiB"):
        fit(QWEN, "llama.cpp", {"CUDA0": "12"}, [])


@pytest.mark.parametrize("how", ["ik_llama.cpp", engine("ik_llama.cpp", "0.1.5")])
def test_explain_lint_and_compile_take_a_name_or_an_engine(how: str | Engine) -> None:
    ex = moeconf.explain(QWEN, ["-ngl", "99", "-ot", "exps=CPU"], engine=how)
    assert ex.invocation.engine.name == "ik_llama.cpp"
    c = moeconf.compile_plan(str(EX / "plans" / "glm-4.5-air.toml"), engine=how)
    assert c.engine.name == "ik_llama.cpp"
    result = moeconf.lint([str(EX / "deploy")], engine=how)
    assert result.findings


def test_an_unknown_engine_name_is_an_error() -> None:
    with pytest.raises(moeconf.MoeconfError, match=r"moeconf knows llama\.cpp and ik_llama\.cpp"):
        moeconf.explain(QWEN, [], engine="vllm")
    with pytest.raises(moeconf.MoeconfError, match="engine version"):
        fit(QWEN, "llama.cpp", {"CUDA0": "12GiB"}, [], version="banana")


def test_explain_refuses_a_command_line_string() -> None:
    """A string argv is iterated as characters: a wrong placement with no error (issue 25)."""
    inv = moeconf.load_inventory(str(EX / "models" / "qwen3-30b-a3b.manifest.json"))
    with pytest.raises(TypeError, match=r"shlex\.split"):
        moeconf.explain(inv, "llama-server -ngl 999 -ot exps=CPU")  # type: ignore[arg-type]


def test_explanation_carries_the_lint_findings() -> None:
    """The library's Explanation says what `explain --json` and `lint` say about the line."""
    inv = moeconf.load_inventory(str(EX / "models" / "qwen3-30b-a3b.manifest.json"))
    ex = moeconf.explain(inv, ["llama-server", "-ngl", "999", "-fit", "off", "-ot", "exps=CPU, blk\\.1\\.=CUDA0"])
    assert [f.code for f in ex.findings] == ["MOE002"] and ex.findings[0].column == 45  # in the joined line
    assert ex.json()["findings"][0]["code"] == "MOE002"
    clean = moeconf.explain(inv, ["llama-server", "-ngl", "999", "-fit", "off", "-ot", "exps=CPU"])
    assert clean.findings == () and "findings" not in clean.json()


def test_explain_assumes_the_gpus_its_ts_splits_over(capsys: pytest.CaptureFixture[str]) -> None:
    """fit's own two-GPU line (-ts 48,1) explained without --gpus: two GPUs, said in a note, not
    one GPU in silence; a --budget for a GPU explain does not simulate points to --gpus."""
    from moeconf.cli import main

    model = str(EX / "models" / "qwen3-30b-a3b.manifest.json")
    line = ["llama-server", "-m", "x.gguf", "-ngl", "999", "-fit", "off", "-c", "32768", "-ts", "48,1", "-ot",
            "exps=CPU"]
    ex = moeconf.explain(model, line)
    assert ex.accelerators == ("CUDA0", "CUDA1")
    assert ex.placement.devices["output.weight"] == "CUDA1"
    assert any("2 GPUs (CUDA0, CUDA1) assumed from -ts 48,1" in n for n in ex.notes)
    assert moeconf.explain(model, line, gpus=["CUDA0", "CUDA1"]).notes == tuple(
        n for n in ex.notes if "assumed from -ts" not in n)
    assert main(["explain", model, "--budget", "CUDA1=24GiB", "--", *line[:-4], "-ot", "exps=CPU"]) == 2
    assert "--gpus CUDA0,CUDA1" in capsys.readouterr().err


def test_lint_line_takes_a_launch_line_as_text() -> None:
    """`moeconf.lint_line`: one launch line as text (issue 25), the findings lint gives it in a file."""
    line = "llama-server -m m.gguf -ngl 999 -fit off -ot 'exps=CPU, blk\\.1\\.=CUDA0' -c 32k"
    found = moeconf.lint_line(line, model=QWEN)
    assert [(f.code, f.column) for f in found] == [("MOE002", 55), ("MOE042", 74)]  # in the joined words
    assert "reads 32" in found[1].message
    assert [f.code for f in moeconf.lint_line("llama-server -m m.gguf -ngl 999 -fit off -c 4096")] == ["MOE000"]
    with pytest.raises(TypeError, match="as text"):
        moeconf.lint_line(["llama-server"])  # type: ignore[arg-type]
