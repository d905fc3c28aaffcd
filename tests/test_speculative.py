"""Speculative decoding is a refused setting family (issue 17, engines/speculative.py): every flag and
variable that turns it on in the pinned engines makes the memory estimate incomplete with a note
naming it (`explain` prints "?"), `fit` refuses, and lint's memory rules claim no fit; every
speculative parameter that changes nothing alone (and `--spec-type none`) leaves the estimate
complete and equal to the one without it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import moeconf.engines.specflags as sf
import moeconf.engines.speculative as spec
import moeconf.memory.families as families
from moeconf.cli import main
from moeconf.engines import engine as engine_from_name
from moeconf.engines.argvread import known_flags
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.conftest import EXAMPLES

MODELS = EXAMPLES / "models"
QWEN = str(MODELS / "qwen3-30b-a3b.manifest.json")  # no NextN layer
GLM_AIR = str(MODELS / "glm-4.5-air.manifest.json")  # one NextN (MTP) layer
BASE = ["-c", "8192", "-ngl", "99", "-ot", "exps=CPU"]
ENGINES = Path(os.path.expanduser("~/.cache/moeconf/engines"))
ML_SRC = ENGINES / "llama-cpp-python-0.3.36" / "src" / "vendor" / "llama.cpp"
IK_SRC = ENGINES / "ik-llama-cpp-python-0.1.5" / "src" / "vendor" / "ik_llama.cpp"


def _estimate(model: str, engine: str, flags: list[str], env: dict[str, str] | None = None,
              binary: str = "llama-server") -> MemoryEstimate:
    inv = load_inventory(model)
    eng = engine_from_name(engine)
    argv = [binary, *BASE, *flags]
    ex = explain(inv, eng, argv)
    return estimate_explained(ex, read_settings(argv, eng, env))


def _refused(est: MemoryEstimate, word: str) -> None:
    """The estimate is incomplete, with a speculative-decoding note naming `word`."""
    assert not est.complete, est.notes
    notes = [n for n in est.notes if n.startswith("memory is not modelled with speculative decoding")]
    assert notes and any(word in n for n in notes), est.notes
    assert all(m.kv == 0 and m.compute == 0 for m in est.devices.values())


def _modelled(est: MemoryEstimate, engine: str = "llama.cpp", model: str = QWEN, binary: str = "llama-server") -> None:
    """Complete, and the same figures as without the flag (the same binary: llama-server reserves
    fewer output rows than the others)."""
    assert est.complete, est.notes
    base = _estimate(model, engine, [], binary=binary)
    assert {d: m.total for d, m in est.devices.items()} == {d: m.total for d, m in base.devices.items()}


def _with_value(engine: str, flag: str, value: str = "1") -> list[str]:
    return [flag, value] if known_flags(engine_from_name(engine)).get(flag, 0) else [flag]


# --- the table is the pinned parsers' ------------------------------------------------------------

@pytest.mark.skipif(not (ML_SRC / "common" / "arg.cpp").exists() or not (IK_SRC / "common" / "common.cpp").exists(),
                    reason="pinned engine sources not present")
def test_specflags_is_generated_from_the_pinned_parsers() -> None:
    path = Path(__file__).resolve().parent.parent / "scripts" / "extract-spec-flags.py"
    sp = importlib.util.spec_from_file_location("extract_spec_flags", path)
    assert sp is not None and sp.loader is not None
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    ml = mod.mainline((ML_SRC / "common" / "arg.cpp").read_text(), (ML_SRC / "common" / "speculative.cpp").read_text())
    ikd = mod.ik((IK_SRC / "common" / "common.cpp").read_text())
    assert ml["draft"] == set(sf.MAINLINE_DRAFT) and ml["params"] == set(sf.MAINLINE_PARAMS)
    assert ml["valued"] == set(sf.MAINLINE_TYPE_VALUE) and ml["typed"] == sf.MAINLINE_TYPE_SET
    assert ml["env"] == sf.MAINLINE_ENV and ml["types"] == sf.MAINLINE_TYPES
    assert ml["env_examples"] == sf.MAINLINE_ENV_EXAMPLES and mod.binaries(ML_SRC) == sf.MAINLINE_BINARIES
    assert ikd["draft"] == set(sf.IK_DRAFT) and ikd["params"] == set(sf.IK_PARAMS)
    assert ikd["valued"] == sf.IK_TYPE_VALUE and ikd["mtp_on"] == set(sf.IK_MTP_ON)


def test_the_table_knows_the_flags_of_issue_17() -> None:
    assert {"-md", "--model-draft", "-hfd", "--spec-draft-model", "--spec-draft-hf"} <= sf.MAINLINE_DRAFT
    assert {"-ngld", "-ctkd", "-ctvd", "-devd", "--spec-draft-n-max", "-lcs", "-lcd"} <= sf.MAINLINE_PARAMS
    assert "--spec-type" in sf.MAINLINE_TYPE_VALUE and "draft-mtp" in sf.MAINLINE_TYPES
    assert {"-md", "-draft"} <= sf.IK_DRAFT and {"-cd", "-ngld", "-ctkd"} <= sf.IK_PARAMS and "-mtp" in sf.IK_MTP_ON
    # nothing is both a switch-on and a parameter
    assert not sf.MAINLINE_DRAFT & sf.MAINLINE_PARAMS and not sf.IK_DRAFT & sf.IK_PARAMS


# --- llama.cpp ------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", sorted(sf.MAINLINE_DRAFT))
def test_mainline_draft_model_flags_are_refused(flag: str) -> None:
    _refused(_estimate(QWEN, "llama.cpp", _with_value("llama.cpp", flag, "/m/draft.gguf")), "draft model")


@pytest.mark.parametrize("kind", [t for t in sf.MAINLINE_TYPES if t != "none"])
def test_mainline_every_speculative_type_is_refused(kind: str) -> None:
    _refused(_estimate(QWEN, "llama.cpp", ["--spec-type", kind]), f"--spec-type {kind}")


@pytest.mark.parametrize("flag", sorted(sf.MAINLINE_TYPE_SET))
def test_mainline_flags_that_set_a_type_are_refused(flag: str) -> None:
    _refused(_estimate(QWEN, "llama.cpp", [flag]), flag)


@pytest.mark.parametrize("flag", sorted(sf.MAINLINE_PARAMS))
def test_mainline_speculative_parameters_alone_change_nothing(flag: str) -> None:
    _modelled(_estimate(QWEN, "llama.cpp", _with_value("llama.cpp", flag)))


def test_mainline_spec_type_lists_and_repeats() -> None:
    _modelled(_estimate(QWEN, "llama.cpp", ["--spec-type", "none"]))
    _modelled(_estimate(QWEN, "llama.cpp", ["--spec-type", "none", "--spec-type", "none"]))
    _refused(_estimate(QWEN, "llama.cpp", ["--spec-type", "none,ngram-mod"]), "ngram-mod")
    # --spec-type appends (common/arg.cpp): a later none does not turn an earlier type off
    _refused(_estimate(QWEN, "llama.cpp", ["--spec-type", "ngram-simple", "--spec-type", "none"]), "ngram-simple")
    # a parameter of the draft with a draft model is still refused, by the draft model
    _refused(_estimate(QWEN, "llama.cpp", ["-ngld", "99", "-ctkd", "q8_0", "-md", "/m/d.gguf"]), "-md /m/d.gguf")


def test_mainline_a_value_is_not_read_as_a_flag() -> None:
    # -a (the alias) takes one value: `-md` here is a name, not a draft model
    _modelled(_estimate(QWEN, "llama.cpp", ["-a", "-md"]))


@pytest.mark.parametrize(("var", "value", "on"), [
    ("LLAMA_ARG_SPEC_DRAFT_MODEL", "/m/draft.gguf", True),
    ("LLAMA_ARG_SPEC_DRAFT_HF_REPO", "org/draft-GGUF", True),
    ("LLAMA_ARG_SPEC_TYPE", "ngram-mod", True),
    ("LLAMA_ARG_SPEC_TYPE", "draft-mtp", True),
    ("LLAMA_ARG_SPEC_TYPE", "none", False),
    ("LLAMA_ARG_SPEC_DRAFT_MODEL", "", False),
    *[(v, "1", False) for v, k in sorted(sf.MAINLINE_ENV.items()) if k == "param"],
])
def test_mainline_environment(var: str, value: str, on: bool) -> None:
    est = _estimate(QWEN, "llama.cpp", [], {var: value})
    if on:
        _refused(est, var)
    else:
        _modelled(est)


def test_mainline_a_binary_without_the_option_reads_no_variable_for_it() -> None:
    # llama-completion's option set has no --spec-type or -md (common/arg.cpp set_examples)
    for var, value in (("LLAMA_ARG_SPEC_TYPE", "ngram-mod"), ("LLAMA_ARG_SPEC_DRAFT_MODEL", "/m/d.gguf")):
        _modelled(_estimate(QWEN, "llama.cpp", [], {var: value}, binary="llama-completion"), binary="llama-completion")
        _refused(_estimate(QWEN, "llama.cpp", [], {var: value}, binary="llama-cli"), var)
    assert sf.MAINLINE_BINARIES["llama-server"] == "SERVER"
    assert "SERVER" in sf.MAINLINE_ENV_EXAMPLES["LLAMA_ARG_SPEC_TYPE"]


@pytest.mark.parametrize("binary", sorted(spec.SPECULATING_BINARIES))
def test_binaries_that_always_speculate_are_refused(binary: str) -> None:
    _refused(_estimate(QWEN, "llama.cpp", [], binary=binary), binary)


# --- ik_llama.cpp ---------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", sorted(sf.IK_DRAFT))
def test_ik_draft_model_flags_are_refused(flag: str) -> None:
    _refused(_estimate(QWEN, "ik_llama.cpp", [flag, "/m/draft.gguf"]), "draft model")


@pytest.mark.parametrize("kind", [t for t in sf.IK_TYPE_VALUE["--spec-type"] if t != "none"])
def test_ik_ngram_types_are_refused_and_the_last_one_wins(kind: str) -> None:
    _refused(_estimate(QWEN, "ik_llama.cpp", ["--spec-type", kind]), kind)
    _modelled(_estimate(QWEN, "ik_llama.cpp", ["--spec-type", kind, "--spec-type", "none"]), "ik_llama.cpp")


@pytest.mark.parametrize("flag", sorted(sf.IK_PARAMS))
def test_ik_speculative_parameters_alone_change_nothing(flag: str) -> None:
    args = ["--spec-replace", "a", "b"] if flag == "--spec-replace" else _with_value("ik_llama.cpp", flag)
    _modelled(_estimate(QWEN, "ik_llama.cpp", args), "ik_llama.cpp")


@pytest.mark.parametrize("flag", sorted(sf.IK_MTP_ON))
def test_ik_mtp_is_refused_only_on_a_model_with_nextn_layers(flag: str) -> None:
    _refused(_estimate(GLM_AIR, "ik_llama.cpp", [flag]), "NextN")
    # the server turns -mtp off on a model without NextN layers (server-context.cpp): nothing changes
    _modelled(_estimate(QWEN, "ik_llama.cpp", [flag]), "ik_llama.cpp")
    _modelled(_estimate(GLM_AIR, "ik_llama.cpp", [flag, "-no-mtp"]), "ik_llama.cpp", GLM_AIR)


def test_ik_reads_no_speculative_variable() -> None:
    _modelled(_estimate(QWEN, "ik_llama.cpp", [], {"LLAMA_ARG_SPEC_DRAFT_MODEL": "/m/d.gguf"}), "ik_llama.cpp")


# --- the check fed a wrong answer -------------------------------------------------------------------

def test_a_reader_that_misses_the_draft_model_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command with -md never gets a complete estimate: with the family's check broken (it answers
    "nothing unmodelled"), the estimate comes out complete and `_refused` fails on it."""
    flags = ["-md", "/m/draft.gguf"]
    _refused(_estimate(QWEN, "llama.cpp", flags), "-md /m/draft.gguf")
    monkeypatch.setattr(families, "unmodelled_speculation", lambda speculation, inv: [])
    with pytest.raises(AssertionError):
        _refused(_estimate(QWEN, "llama.cpp", flags), "-md /m/draft.gguf")


# --- the commands -------------------------------------------------------------------------------------

def test_explain_prints_question_marks_with_a_draft_model(capsys: pytest.CaptureFixture[str]) -> None:
    main(["explain", QWEN, "--", "llama-server", "-c", "32768", "-ngl", "99", "-ot", "exps=CPU", "-md",
          "/m/draft.gguf"])
    out = capsys.readouterr().out
    table = out[out.index("memory (MiB)"):]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:4]}
    assert rows["CPU"][3:5] == ["?", "?"] and rows["CUDA0"][2:4] == ["?", "?"], table
    assert rows["CUDA0"][-1].startswith(">=")
    assert "the draft model's weights, KV cache and compute (-md /m/draft.gguf) are not counted" in table


@pytest.mark.parametrize(("model", "engine", "flags", "refused"), [
    (QWEN, "llama.cpp", ["-md", "/m/d.gguf"], "a draft model"),
    (QWEN, "llama.cpp", ["--spec-type", "ngram-mod"], "--spec-type ngram-mod"),
    (QWEN, "llama.cpp", ["--spec-default"], "--spec-default"),
    (QWEN, "llama.cpp", ["--spec-type", "draft-mtp"], "MTP head"),
    (GLM_AIR, "ik_llama.cpp", ["-mtp"], "NextN"),
    (QWEN, "llama.cpp", ["-ngld", "99", "-ctkd", "q8_0"], None),
    (QWEN, "llama.cpp", ["--spec-type", "none"], None),
    (QWEN, "ik_llama.cpp", ["-mtp"], None),
])
def test_fit_refuses_speculation_and_not_its_idle_parameters(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, model: str, engine: str,
                                                              flags: list[str], refused: str | None) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(["fit", model, "--gpu", "24GiB", "--engine", engine, "-c", "8192", *flags])
    captured = capsys.readouterr()
    if refused is None:
        assert rc == 0, captured.err
    else:
        assert rc == 2 and refused in captured.err and "fit" in captured.err, captured.err


def test_lint_claims_no_fit_with_a_draft_model(tmp_path: Path) -> None:
    from moeconf.linting.linter import lint

    (tmp_path / ".moeconf.toml").write_text(
        'engine = "llama.cpp"\ngpu_memory = {"CUDA0" = "4GiB"}\n[models]\n'
        f'"m.gguf" = "{MODELS / "qwen3-30b-a3b.manifest.json"}"\n')
    line = "llama-server -m m.gguf -ngl 999 -fit off -c 32768"
    (tmp_path / "launch.sh").write_text(line + "\n")
    over = [f for f in lint([str(tmp_path / "launch.sh")]).findings if f.code == "MOE040"]
    assert over  # without a draft model: over its 4 GiB, said
    (tmp_path / "launch.sh").write_text(line + " -md /m/draft.gguf\n")
    found = [f for f in lint([str(tmp_path / "launch.sh")]).findings if f.code == "MOE040"]
    # no claim about a memory moeconf does not model: an info that says it was not checked (issue 25)
    assert [f.severity for f in found] == ["info"] and "not checked" in found[0].message
    (tmp_path / "launch.sh").write_text("llama-server -m m.gguf -ngl 999 -c 32768 -ot exps=CPU -md /m/d.gguf\n")
    for f in lint([str(tmp_path / "launch.sh")]).findings:
        assert "moeconf fit finds" not in f.message and "Instead, for the GPU sizes" not in f.message


@pytest.mark.parametrize(("extra", "refused"), [('"-md", "/m/d.gguf"', True), ('"--spec-type", "ngram-mod"', True),
                                                ('"-ngld", "99", "-ctkd", "q8_0"', False)])
def test_a_plan_that_fills_by_budget_refuses_speculation(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         extra: str, refused: bool) -> None:
    plan = tmp_path / "p.plan.toml"
    plan.write_text(f'rules = ["experts -> CUDA0, cpu"]\n[model]\npath = "{QWEN}"\nserve_path = "q.gguf"\n'
                    '[engine]\nname = "llama.cpp"\ngpus = ["CUDA0"]\n'
                    f'[flags]\nn_gpu_layers = "all"\nctx_size = 8192\nflash_attn = "on"\nextra = [{extra}]\n'
                    '[budget]\n"CUDA0" = "24 GiB"\nreserve = "1 GiB"\n')
    rc = main(["compile", str(plan)])
    err = capsys.readouterr().err
    if refused:
        assert rc == 2 and "memory is not modelled with speculative decoding" in err, err
    else:
        assert rc == 0, err
