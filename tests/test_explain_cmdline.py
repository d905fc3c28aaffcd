"""`explain` command lines: RPC devices counted once, unknown flags named with the closest known
one, the engines' own flag tables deciding which flags take a value, and exit 1 when the engine
would refuse the command line."""

from __future__ import annotations

import json

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.engines.argvread import Arg, closest_flag, known_flags
from moeconf.engines.cmdline import parse_invocation
from moeconf.engines.flagtable import IK, MAINLINE
from moeconf.engines.flagtable_iknewest import IK_NEWEST
from tests.conftest import EXAMPLES

MANIFEST = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main(["explain", MANIFEST, "--json", *args])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


@pytest.mark.parametrize("gpus", ["RPC0[h:1]", "RPC0[h:1],RPC0[h:1]", ""])
def test_rpc_devices_named_in_gpus_count_once(capsys: pytest.CaptureFixture[str], gpus: str) -> None:
    code, data = explain_json(capsys, f"--gpus={gpus}", "--", "--rpc", "h:1", "-ngl", "99")
    assert code == 0
    assert set(data["bytes_by_device"]) == {"CPU", "RPC0[h:1]"}  # type: ignore[arg-type]


def test_rpc_plus_a_local_gpu_is_two_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = explain_json(capsys, "--gpus=RPC0[h:1],CUDA0", "--", "--rpc", "h:1", "-ngl", "99", "-ts", "1,1")
    assert code == 0
    assert {"CPU", "RPC0[h:1]", "CUDA0"} == set(data["bytes_by_device"])  # type: ignore[arg-type]


def test_bad_gpu_names_are_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MANIFEST, "--gpus", "cuda0", "--ot", "exps=CPU"]) == 2
    assert "did you mean 'CUDA0'" in capsys.readouterr().err


def test_help_says_what_gpus_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "local GPUs" in out and "--rpc" in out and "counts once" in out


@pytest.mark.parametrize(("words", "fragment"), [
    (["--n-cpu-mo", "4"], "unknown argument '--n-cpu-mo' (did you mean --n-cpu-moe?)"),
    (["--ctx-size=4096"], "does not split '--ctx-size=4096' at '=': it stops with an unknown-argument error "
                          "(write --ctx-size 4096)"),
    (["--gpu-layerz", "99"], "did you mean --gpu-layers?"),
    (["-ot"], "-ot needs a value"),
    (["-ot", "(.|.)*Q=CPU"], "takes too long to match"),
    (["-ot", "exps=cuda0"], "unknown buffer type 'cuda0'"),
])
def test_refused_command_lines_exit_1(capsys: pytest.CaptureFixture[str], words: list[str], fragment: str) -> None:
    code = main(["explain", MANIFEST, "--", "llama-server", "-m", "x.gguf", *words])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "error: the engine would refuse to start" in out
    assert fragment in out


def test_clean_command_line_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", MANIFEST, "--", "llama-server", "-m", "x.gguf", "-ngl", "99", "--n_cpu_moe", "4",
                 "--jinja", "-fa", "on", "--host", "0.0.0.0"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "refuse" not in out


def test_flag_tables_decide_which_flags_take_values() -> None:
    eng = engine("llama.cpp")
    # --jinja takes no value: the -ot after it is read as -ot (a table without --jinja swallowed it)
    inv = parse_invocation([Arg(w) for w in ["llama-server", "--jinja", "-ot", "exps=CPU"]], eng)
    assert [o.value.text for o in inv.ot] == ["exps=CPU"] and not inv.unknown_flags
    # --alias takes one: its value is not read as a flag
    inv = parse_invocation([Arg(w) for w in ["llama-server", "--alias", "-ot", "-ngl", "3"]], eng)
    assert inv.ot == [] and inv.ngl is not None and inv.ngl[1] == 3
    # an unknown flag reads its words as the flag it most likely meant
    inv = parse_invocation([Arg(w) for w in ["llama-server", "--n-cpu-mo", "4", "-ngl", "5"]], eng)
    assert [(a.text, c) for a, c in inv.unknown_flags] == [("--n-cpu-mo", "--n-cpu-moe")]
    assert inv.ngl is not None and inv.ngl[1] == 5
    # llama-bench has its own parser: not checked against the server's flags
    inv = parse_invocation([Arg(w) for w in ["llama-bench", "-r", "3", "-p", "512"]], eng)
    assert inv.unknown_flags == []


def test_flag_tables_hold_both_engines_flags() -> None:
    assert MAINLINE["-ot"] == MAINLINE["--override-tensor"] == 1
    assert MAINLINE["--cpu-moe"] == 0 and MAINLINE["-fit"] == 1 and MAINLINE["-lm"] == 1
    assert "--no-mmap" not in MAINLINE  # gone from the pinned llama.cpp (cmdline.REMOVED_FLAGS)
    assert IK["-mqkv"] == 0 and IK["--fit"] == 0 and "-fit" not in IK and IK["-ncmoe"] == 1
    # ik's `argv[++i]` blocks take a value as CHECK_ARG ones do (an extractor once read 0)
    assert IK["-ctk"] == IK["-ctkd"] == IK_NEWEST["-ctkd"] == IK["-hft"] == 1
    assert known_flags(engine("ik_llama.cpp", "0.1.5")) is IK and len(MAINLINE) > 400 and len(IK) > 390
    assert known_flags(engine("ik_llama.cpp", "2025-06-01")) is IK  # older: 0.1.5's facts
    assert known_flags(engine("ik_llama.cpp")) is IK_NEWEST and set(IK) <= set(IK_NEWEST)
    assert known_flags(engine("ik_llama.cpp", "2026-08-15")) is IK_NEWEST
    assert closest_flag(engine("llama.cpp"), "--n-cpu-mo") == "--n-cpu-moe"
    assert closest_flag(engine("llama.cpp"), "--completely-different") is None


def test_many_catastrophic_items_share_one_time_budget(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    ot = ",".join(f"(.|.)*Q{i}=CPU" for i in range(20))
    t = time.monotonic()
    code = main(["explain", MANIFEST, "--ot", ot])
    out, _ = capsys.readouterr()
    assert time.monotonic() - t < 8  # 3 s of budget, then 0.1 s each, not 20 x 1 s
    assert code == 1
    assert out.count("takes too long to match") == 20


def test_dash_m_naming_a_later_shard_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", MANIFEST, "--", "llama-server", "-m", "/m/q-00002-of-00003.gguf", "-ngl", "99"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "write -m /m/q-00001-of-00003.gguf" in out


def test_flags_removed_since_a_version_are_known_before_it() -> None:
    words = [Arg(w) for w in ["llama-server", "-fmoe", "-ngl", "99"]]
    old = parse_invocation(words, engine("ik_llama.cpp", "2025-06-09"))
    assert old.unknown_flags == [] and old.ngl is not None and old.ngl[1] == 99
    assert [a.text for a, _ in parse_invocation(words, engine("ik_llama.cpp", "0.1.5")).unknown_flags] == ["-fmoe"]
    new = parse_invocation(words, engine("ik_llama.cpp"))
    assert [a.text for a, _ in new.unknown_flags] == ["-fmoe"]
    from moeconf.engines.argvread import unknown_flag_message

    msg = unknown_flag_message(engine("ik_llama.cpp"), "-fmoe", None)
    assert "removed 2025-10-25" in msg and "-no-fmoe" in msg


def test_split_mode_none_keeps_only_the_main_gpu(tmp_path: object) -> None:
    """llama.cpp -sm none: the layers go to the device -mg names (checked against the engine in
    tests/engine/test_engines.py::test_split_mode_none_uses_the_main_gpu)."""
    from moeconf.explanation import explain
    from moeconf.model.load import load_inventory

    inv = load_inventory(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    eng = engine("llama.cpp")
    gpus = ["CUDA0", "CUDA1"]

    def layered(argv: list[str]) -> set[str | None]:
        ex = explain(inv, eng, argv, gpus=gpus)
        return {ex.placement.devices[t.name] for t in inv.tensors if t.layer is not None}

    assert layered(["-ngl", "999", "-sm", "none"]) == {"CUDA0"}
    assert layered(["-ngl", "999", "-sm", "none", "-mg", "1"]) == {"CUDA1"}
    assert layered(["-ngl", "999", "-sm", "none", "-mg", "-1"]) == {"CPU"}
    assert layered(["-ngl", "999", "-sm", "layer", "-mg", "1", "-ts", "1,1"]) == {"CUDA0", "CUDA1"}
    assert layered(["-ngl", "999"]) == {"GPU(auto)"}  # no -ts: split by free memory
    bad = explain(inv, eng, ["-ngl", "999", "-sm", "none", "-mg", "2"], gpus=gpus)
    assert any("invalid value for main_gpu: 2" in r for r in bad.refusals)
    other = explain(inv, eng, ["-ngl", "999", "-sm", "none", "-ot", "exps=CUDA1"], gpus=gpus)
    assert any("aborts at start" in r for r in other.refusals)
    env = explain(inv, eng, ["-ngl", "999"], env={"LLAMA_ARG_SPLIT_MODE": "none", "LLAMA_ARG_MAIN_GPU": "1"},
                  gpus=gpus)
    assert {env.placement.devices[t.name] for t in inv.tensors if t.layer is not None} == {"CUDA1"}


def test_plan_rule_naming_a_gpu_split_mode_none_drops_is_refused(tmp_path: object) -> None:
    from pathlib import Path

    from moeconf.compile import compile_plan
    from moeconf.errors import PlanError
    from moeconf.plan import plan_from_text

    base = ('[model]\npath = "{m}"\nserve_path = "/m/q.gguf"\n[engine]\nname = "llama.cpp"\n'
            'gpus = ["CUDA0", "CUDA1"]\n[flags]\nn_gpu_layers = "all"\nsplit_mode = "none"\n')
    m = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"
    where = str(Path(str(tmp_path)) / "plan.toml")
    text = 'rules = ["experts -> cpu", "experts layers 0..3 -> gpu1"]\n' + base.format(m=m)
    with pytest.raises(PlanError, match="CUDA1 is not used with split_mode") as e:
        compile_plan(plan_from_text(text, where))
    assert (e.value.line, e.value.column) == (1, 52)
    ok = compile_plan(plan_from_text(text.replace("0..3 -> gpu1", "0..3 -> gpu") + "main_gpu = 0\n", where))
    assert "CUDA1" not in ok.ot
    moved = compile_plan(plan_from_text(text.replace("0..3 -> gpu1", "0..3 -> gpu1") + "main_gpu = 1\n", where))
    assert moved.placement.devices["blk.0.attn_q.weight"] == "CUDA1" and "-mg" in moved.argv


def _explain_json(capsys: pytest.CaptureFixture[str], model: str, *args: str) -> tuple[int, dict[str, object]]:
    code = main(["explain", model, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_explain_budgets_show_free_memory_and_exit_1_when_over(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    flags = ["--", "-ngl", "999", "-c", "32768", "-ot", "blk\\.(4[0-7])\\.ffn_.*_exps=CPU"]
    code, out = _explain_json(capsys, model, "--budget", "16GiB", "--budget", "cpu=32GiB", *flags)
    assert code == 1
    assert out["budgets"] == {"CUDA0": 16 * 2**30, "CPU": 32 * 2**30}
    over = out["over_budget"]
    assert isinstance(over, dict) and set(over) == {"CUDA0"}
    assert over["CUDA0"] == out["memory"]["CUDA0"]["total"] - 16 * 2**30  # type: ignore[index]
    code, out = _explain_json(capsys, model, "--budget", "24GiB", *flags)
    assert code == 0 and out["over_budget"] == {}
    assert main(["explain", model, "--budget", "24GiB", *flags]) == 0
    text = capsys.readouterr().out
    assert "budget" in text and "free" in text
    assert main(["explain", model, "--budget", "CUDA3=8GiB", *flags]) == 2
    assert "not a device of this command line" in capsys.readouterr().err
    assert main(["explain", model, "--budget", "8GiB", "--budget", "CUDA0=9GiB", *flags]) == 2
    assert "names CUDA0 twice" in capsys.readouterr().err


def test_explain_exits_1_when_the_engine_refuses_the_cache_types(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(EXAMPLES / "models" / "deepseek-v3.manifest.json")
    code, out = _explain_json(capsys, model, "--", "-ngl", "999", "-c", "8192", "-ctk", "q8_0", "-ot", "exps=CPU")
    assert code == 1 and any("different K and V cache types" in p for p in out["memory_problems"])  # type: ignore[union-attr]


def test_explain_budget_on_a_free_memory_split_is_noted_not_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Two GPUs and no -ts: CUDA0 is a device of the line, its share is not known (review: exit 2,
    'puts nothing there'); -ngl 0: it holds nothing, within any budget."""
    model = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    code, out = _explain_json(capsys, model, "--gpus", "CUDA0,CUDA1", "--budget", "CUDA0=8GiB", "--", "-ngl", "999")
    assert code == 0 and out["unchecked_budgets"] == ["CUDA0"] and out["over_budget"] == {}
    code, out = _explain_json(capsys, model, "--budget", "CUDA0=8GiB", "--", "-ngl", "0")
    assert code == 0 and out["over_budget"] == {} and out["unchecked_budgets"] == []


@pytest.mark.parametrize(("engine_name", "version", "refused"), [
    ("llama.cpp", None, True),            # since b6325 -fa takes on|off|auto: '-c' is its value, refused
    ("llama.cpp", "b6000", False),        # before, a bare switch
    ("ik_llama.cpp", None, True),         # ik PR #944 (2025-11-13), as in 0.1.5's common.cpp
    ("ik_llama.cpp", "0.1.5", True),
    ("ik_llama.cpp", "2025-10-01", False),
    ("ik_llama.cpp", "b3983", False),     # a build of the day before PR #944 (builds map to their day)
    ("ik_llama.cpp", "b3985", True),
])
def test_a_bare_fa_before_another_flag_is_refused_where_fa_takes_a_value(engine_name: str, version: str | None,
                                                                          refused: bool) -> None:
    from moeconf.explanation import explain
    from moeconf.model.load import load_inventory

    inv = load_inventory(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    ex = explain(inv, engine(engine_name, version), ["-ngl", "99", "-fa", "-c", "4096"])
    assert any("unknown value for -fa: '-c'" in r for r in ex.refusals) == refused, ex.refusals
    ok = explain(inv, engine(engine_name, version), ["-ngl", "99", "-fa", "on", "-c", "4096"])
    assert not [r for r in ok.refusals if "-fa" in r]


def test_explain_says_what_it_assumes_without_a_binary(capsys: pytest.CaptureFixture[str]) -> None:
    """The binary decides the sequences and the output rows in the compute buffer: without one,
    explain says what it assumed (it printed llama-cli's figures in silence)."""
    model = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    flags = ["-ngl", "999", "-fit", "off", "-c", "32768", "-ot", "exps=CPU"]
    assert main(["explain", model, "--", *flags]) == 0
    assert "assumed: no binary named" in capsys.readouterr().out
    assert main(["explain", model, "--", "llama-server", *flags]) == 0
    assert "assumed: no binary named" not in capsys.readouterr().out


@pytest.mark.parametrize(("engine_name", "word", "refused"), [
    # mainline's -fa handler compares the word as written (common/arg.cpp is_truthy/is_falsey/is_autoy)
    ("llama.cpp", "on", False), ("llama.cpp", "enabled", False), ("llama.cpp", "-1", False),
    ("llama.cpp", "ON", True), ("llama.cpp", "Auto", True),
    # ik_llama.cpp lowercases it first and takes on/off/auto/1/0 only (common.cpp)
    ("ik_llama.cpp", "ON", False), ("ik_llama.cpp", "Auto", False), ("ik_llama.cpp", "enabled", True),
    ("ik_llama.cpp", "true", True), ("ik_llama.cpp", "-1", True), ("ik_llama.cpp", "disabled", True),
])
def test_fa_values_are_read_with_each_engines_case_rule(engine_name: str, word: str, refused: bool) -> None:
    """The command line's refusal and the memory settings' reading are one (engines/llamaconfig
    flash_attn_word): they took different word lists for ik_llama.cpp before."""
    from moeconf.memory import read_settings

    inv = parse_invocation([Arg(w) for w in ["llama-server", "-fa", word]], engine(engine_name))
    assert any("unknown value for -fa" in why for _, why in inv.problems) == refused, inv.problems
    settings = read_settings(["llama-server", "-fa", word], engine(engine_name))
    assert bool(settings.problems) == refused and [why for _, why in inv.problems] == list(settings.problems)


def test_a_refused_fa_word_is_reported_once_and_the_memory_header_says_what_it_assumed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A -fa word the engine stops on was reported twice (the command line's refusal and the memory
    settings', in other words) under a memory header that said "flash attention on" as if it ran."""
    model = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    assert main(["explain", model, "--", "llama-server", "-ngl", "99", "-fa", "maybe", "-c", "8192"]) == 1
    out = capsys.readouterr().out
    assert out.count("unknown value for -fa: 'maybe'") == 1, out
    assert "memory (MiB), were the refused values their defaults, at -c 8192" in out
    assert main(["explain", model, "--", "llama-server", "-ngl", "99", "-fa", "on", "-c", "8192"]) == 0
    assert "memory (MiB) at -c 8192" in capsys.readouterr().out


@pytest.mark.parametrize(("var", "value", "expect"), [
    ("LLAMA_ARG_OFFLINE", "1", True), ("LLAMA_ARG_OFFLINE", "enabled", True),
    ("LLAMA_ARG_OFFLINE", "TRUE", False), ("LLAMA_ARG_OFFLINE", "yes", False),
    ("LLAMA_ARG_CPU_MOE", "on", True), ("LLAMA_ARG_CPU_MOE", "On", False), ("LLAMA_ARG_CPU_MOE", "off", False),
])
def test_env_switches_are_set_only_by_the_words_the_engine_reads_as_true(var: str, value: str, expect: bool) -> None:
    """A switch's variable is set where common/arg.cpp's is_truthy takes the word, compared as
    written: `LLAMA_ARG_OFFLINE=TRUE` leaves llama.cpp online."""
    inv = parse_invocation([Arg("llama-server")], engine("llama.cpp"), env={var: Arg(value)})
    got = inv.offline if var == "LLAMA_ARG_OFFLINE" else bool(inv.cpu_moe)
    assert got == expect


def test_ik_llama_cpp_reads_no_offline_variable() -> None:
    """ik_llama.cpp 0.1.5 reads a short fixed list of LLAMA_ARG_* variables (common/common.cpp), without
    LLAMA_ARG_OFFLINE: a remote model is looked up online for it (lint read the variable for ik too)."""
    env = {"LLAMA_ARG_OFFLINE": Arg("1")}
    assert parse_invocation([Arg("llama-server")], engine("llama.cpp"), env=env).offline
    assert not parse_invocation([Arg("llama-server")], engine("ik_llama.cpp"), env=env).offline


_QWEN = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")


@pytest.mark.parametrize("model", [[_QWEN, "--", "llama-server"], ["--", "llama-server", "-m", _QWEN]])
def test_explain_reads_a_server_line_once(model: list[str], monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The model (named before the line or by its -m), the simulation and the rules take one reading of
    the line (linter.read_line)."""
    import moeconf.engines.cmdline as cmdline
    import moeconf.linting.linter as linter

    reads: list[str] = []
    original = cmdline.parse_invocation

    def counted(args: list[Arg], *rest: object, **kw: object) -> object:
        reads.append(args[0].text)
        return original(args, *rest, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(cmdline, "parse_invocation", counted)
    monkeypatch.setattr(linter, "parse_invocation", counted)
    assert main(["explain", "--json", *model, "-c", "4096", "-ot", "exps=CPU"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["CPU"]["weights"] > 0
    assert reads == ["llama-server"]


def test_lint_command_takes_a_read_line_for_a_line_not_llama_benchs_only() -> None:
    from moeconf.linting.linter import lint_command, read_line

    eng = engine("llama.cpp")
    line = read_line(["llama-server", "-m", "x.gguf"], eng)
    with pytest.raises(ValueError, match="`line` given for llama-bench's line"):
        lint_command(None, eng, ["llama-bench", "-m", "x.gguf"], line=line)


def test_explain_takes_the_model_the_environment_names(capsys: pytest.CaptureFixture[str]) -> None:
    """The line is read as the engine reads it, its environment too: LLAMA_ARG_MODEL names the model
    where the words do not (and -m, read after it, wins)."""
    qwen = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    air = str(EXAMPLES / "models" / "glm-4.5-air.manifest.json")
    assert main(["explain", "--json", "--env", f"LLAMA_ARG_MODEL={qwen}", "--", "llama-server", "-c", "4096"]) == 0
    by_env = json.loads(capsys.readouterr().out)
    assert main(["explain", "--json", "--", "llama-server", "-m", qwen, "-c", "4096"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"] == by_env["memory"]
    main(["explain", "--json", "--env", f"LLAMA_ARG_MODEL={air}", "--", "llama-server", "-m", qwen, "-c", "4096"])
    assert json.loads(capsys.readouterr().out)["memory"] == by_env["memory"]


@pytest.mark.parametrize(("argv", "env", "refused"), [
    (["-fit", "on"], {}, False), (["-fit", "off"], {}, False), (["-fit", "ON"], {}, True), (["-fit", "auto"], {}, True),
    ([], {"LLAMA_ARG_FIT": "off"}, False), ([], {"LLAMA_ARG_FIT": "auto"}, True), ([], {"LLAMA_ARG_FIT": "yes"}, True),
])
def test_a_fit_word_the_engine_does_not_take_stops_it(argv: list[str], env: dict[str, str], refused: bool) -> None:
    """-fit's handler (common/arg.cpp) takes the true and false words as written and throws on any other, from the
    command line or LLAMA_ARG_FIT alike (the env loop rethrows: the server does not start); `auto` is not one."""
    inv = parse_invocation([Arg(w) for w in ["llama-server", *argv]], engine("llama.cpp"),
                           env={k: Arg(v) for k, v in env.items()})
    assert any("unknown value for" in why and "fit" in why.lower() for _, why in inv.problems) == refused, inv.problems
