"""llama-bench lines are read with llama-bench's own parser (engines/benchtable.py, generated from
the pinned llama-bench.cpp; engines/benchline.py), not as llama-server's: lint runs only the rules
that hold for them, on each -ot set; explain takes one test at llama-bench's context or refuses,
naming the list; an option llama-bench does not have is named."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import Engine, engine
from moeconf.engines.argvread import is_bench
from moeconf.engines.benchline import BenchLine, default, int_range, read_bench
from moeconf.linting.linter import command_words, lint
from moeconf.linting.model import Config, Finding
from tests.conftest import EXAMPLES

MODELS = EXAMPLES / "models"
QWEN = str(MODELS / "qwen3-30b-a3b.manifest.json")
ML = engine("llama.cpp")
IK = engine("ik_llama.cpp")


def _line(text: str, eng: Engine = ML) -> BenchLine:
    return read_bench(command_words(shlex.split(text)), eng)


# --- the option table, read from the sources -----------------------------------------------------

def test_table_is_llama_bench_own() -> None:
    from moeconf.engines import benchtable as t

    # no -c, no --fit on mainline's llama-bench; its booleans take a value; ik's has --fit N
    assert "-c" not in t.MAINLINE_FLAGS and "--fit" not in t.MAINLINE_FLAGS and "-fit" not in t.MAINLINE_FLAGS
    assert t.MAINLINE_FLAGS["--no-op-offload"] == 1 and t.MAINLINE_FLAGS["-nopo"] == 1
    assert "--no-op-offload" in t.MAINLINE_BOOLS and "-ot" in t.MAINLINE_LISTS and "-ub" in t.MAINLINE_RANGES
    assert t.IK_FLAGS["--fit"] == 1 and "-ot" not in t.IK_LISTS  # ik: -ot items add to one list
    assert t.MAINLINE_FIELDS["-ngl"] == "n_gpu_layers" and t.IK_FIELDS["--n-cpu-moe"] == "buft_overrides"


def test_defaults_differ_from_the_server() -> None:
    assert default(ML, "n_gpu_layers") == "-1" and default(IK, "n_gpu_layers") == "999"
    assert default(ML, "flash_attn") == "auto" and default(IK, "flash_attn") == "1"
    assert default(IK, "mla_attn") == "3"
    assert default(ML, "n_ubatch") == "512" and default(ML, "n_batch") == "2048"
    assert default(ML, "n_threads") is None  # a call, not a value: not written


def test_int_range_as_llama_bench_reads_it() -> None:
    assert int_range("128-512*2") == [128, 256, 512]
    assert int_range("1-7+3,64") == [1, 4, 7, 64]
    assert int_range("0-8+0") is None  # a step that does not advance: "invalid range"
    assert int_range("-1") is None and int_range("-1", negative=True) == [-1]
    assert int_range("4k") is None


# --- reading a line ------------------------------------------------------------------------------

def test_switch_values_are_values_not_stray_words() -> None:
    line = _line("llama-bench -m x.gguf -ngl 99 -ot exps=CPU --no-op-offload 1 -p 512 -n 128 -fa 1")
    assert not line.problems and not line.unknown
    assert [p.text for p in line.given["no_op_offload"]] == ["1"]
    words = [a.text for a in line.tests()[0].words()]
    assert "--no-op-offload" in words and words[-4:] == ["-c", "512", "-fit", "off"]


def test_contexts_are_prompt_plus_generated_plus_depth() -> None:
    line = _line("llama-bench -m x.gguf -p 512 -n 128 -d 0,4096")
    assert line.contexts() == [("pp512", 512), ("tg128", 128), ("pp512 @ d4096", 4608),
                               ("tg128 @ d4096", 4224)]
    assert line.tests()[0].context == 4608
    assert _line("llama-bench -m x.gguf -pg 2048,256 -p 0 -n 0").contexts() == [
        ("pp2048+tg256", 2304)]


def test_ot_sets_are_tests_with_their_own_places() -> None:
    text = r"llama-bench -m x.gguf -ot 'exps=CPU,blk\.0\.ffn_.*=CUDA0;exps=CPU,'"
    line = _line(text)
    sets = line.given["tensor_buft_overrides"]
    assert [p.text for p in sets] == ["exps=CPU", r"blk\.0\.ffn_.*=CUDA0;exps=CPU", ""]  # a trailing , : no overrides
    col = text.index("exps=CPU") - 1 + 1  # 1-based column of the value, quotes removed by the shell
    assert sets[1].arg.column == sets[0].arg.column + len("exps=CPU,")
    assert sets[0].arg.column == col
    tests = line.tests()
    assert len(tests) == 3 and line.test_count() == 6
    words = tests[1].words()
    ot = words[[a.text for a in words].index("-ot") + 1]
    assert ot.text == r"blk\.0\.ffn_.*=CUDA0,exps=CPU" and ot.column == sets[1].arg.column
    assert "-ot" not in [a.text for a in tests[2].words()]


def test_ncmoe_follows_the_overrides() -> None:
    words = [a.text for a in _line("llama-bench -ncmoe 4 -ot attn=CUDA0 -m x.gguf").tests()[0].words()]
    assert words.index("-ot") < words.index("-ncmoe")


def test_ik_reads_its_own_table_and_defaults() -> None:
    line = _line("llama-bench -m x.gguf --n-cpu-moe 2 -ot exps=CPU -p 1024", IK)
    assert not line.unknown and not line.problems
    words = [a.text for a in line.tests()[0].words()]
    # --n-cpu-moe's rules where it stands, before the later -ot (ik's llama-bench keeps one list)
    ots = [words[i + 1] for i, w in enumerate(words) if w == "-ot"]
    assert ots[0] == r"blk\.(0|1)\.(ffn_(up|down|gate)_exps\.weight)=CPU" and ots[1] == "exps=CPU"
    assert words[words.index("-ngl") + 1] == "999" and words[words.index("-mla") + 1] == "3"
    # ik: pp1024 (context 1024) and tg128 (128); no -d, no -fit to turn off
    assert "-fit" not in words and words[words.index("-c") + 1] == "1024"
    assert _line("llama-bench -m x.gguf -d 512", IK).unknown
    assert "number of blocks >= 0" in _line("llama-bench -m x.gguf --n-cpu-moe -2", IK).problems[0][1]


def test_refused_values_and_unknown_options_are_named() -> None:
    line = _line("llama-bench -m x.gguf -nopo true -ub 5x -c 4096 --no-mmap")
    msgs = [m for _, m in line.problems]
    assert any("-nopo 'true'" in m and "0 or 1" in m for m in msgs)
    assert any("-ub '5x'" in m for m in msgs)
    unknown = [(a.text, m) for a, m in line.unknown]
    assert [u for u, _ in unknown] == ["-c", "--no-mmap"]
    assert "has no option '-c'" in unknown[0][1] and "invalid parameter for argument" in unknown[0][1]


def test_is_bench() -> None:
    assert is_bench(["/opt/llama.cpp/build/bin/llama-bench", "-m", "x"]) and is_bench(["llama-bench.exe"])
    assert not is_bench(["llama-server", "-m", "x"]) and not is_bench(["-m", "x"]) and not is_bench([])
    assert not is_bench(["llama-batched-bench"])


# --- lint: the rules that used to misfire --------------------------------------------------------

def _lint(tmp_path: Path, line: str, engine_name: str = "llama.cpp") -> list[Finding]:
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\n# moeconf: model={QWEN}\n# moeconf: engine={engine_name}\n{line}\n")
    return lint([str(script)], Config()).findings


@pytest.mark.parametrize(("line", "misfired"), [
    # --fit is llama-server's: llama-bench has none
    ("llama-bench -m x.gguf -ngl 99 -ot exps=CPU --no-op-offload 1 -p 512 -n 128 -fa 1", "fit-conflict"),
    # `;` separates overrides of one set: not part of the device name
    (r"llama-bench -m x.gguf -ngl 99 -ot 'blk\.0\.ffn_.*=CUDA0;exps=CPU'", "unknown-device"),
    # a trailing `,` adds a test without overrides: no item is lost
    ("llama-bench -m x.gguf -ngl 99 -ot exps=CPU,", "trailing-comma"),
    # a repeated -ot adds tests: none is dropped
    ("llama-bench -m x.gguf -ngl 99 -ot exps=CPU -ot attn=CUDA0", "repeated-ot"),
    # `,` starts another set, not another item of the same one
    (r"llama-bench -m x.gguf -ngl 99 -ot 'blk\.(0|1)\.ffn_.*_exps=CPU,exps=CPU'", "comma-in-pattern"),
])
def test_rule_that_misfired_is_quiet(tmp_path: Path, line: str, misfired: str) -> None:
    names = [f.name for f in _lint(tmp_path, line)]
    assert misfired not in names, names
    # the same words on a server line still get it (the rule is still on where it holds)
    server = line.replace("llama-bench", "llama-server").replace("--no-op-offload 1", "--no-op-offload")
    server = server.replace(" -p 512 -n 128 -fa 1", "")
    if misfired != "comma-in-pattern":
        assert misfired in [f.name for f in _lint(tmp_path, server)]


def test_each_set_simulated_as_the_engine_would(tmp_path: Path) -> None:
    # the second set moves a tensor nothing else touches and one that the set's first rule already took
    line = r"llama-bench -m x.gguf -ngl 99 -ot 'exps=CPU,blk\.0\.ffn_up_exps=CPU;blk\.0\.ffn_up_exps=CUDA0'"
    found = _lint(tmp_path, line)
    shadowed = [f for f in found if f.name in ("shadowed-rule", "rule-overridden", "duplicate-rule")]
    assert shadowed, [(f.name, f.message) for f in found]
    text = shlex.split(line)
    value = text[text.index("-ot") + 1]
    second = value.index(";") + 1  # the item the set's first rule shadows
    col0 = len("llama-bench -m x.gguf -ngl 99 -ot '") + 1  # the value's first character, after the quote
    assert any(f.column == col0 + second for f in shadowed), [(f.column, f.message) for f in shadowed]


def test_unknown_option_and_refused_value_are_findings(tmp_path: Path) -> None:
    found = _lint(tmp_path, "llama-bench -m x.gguf -ngl 99 -c 4096 -nopo yes")
    by = {f.name: f for f in found}
    assert "has no option '-c'" in by["unknown-flag"].message
    assert by["unknown-flag"].column == len("llama-bench -m x.gguf -ngl 99 ") + 1
    assert "0 or 1" in by["flag-value-refused"].message
    assert "fit-conflict" not in by


def test_ik_bench_line_lints(tmp_path: Path) -> None:
    found = _lint(tmp_path, "llama-bench -m x.gguf -ngl 99 -ot exps=CPU -fmoe 1 -mla 3 -p 512", "ik_llama.cpp")
    assert not [f for f in found if f.severity in ("error", "warning")], [(f.name, f.message) for f in found]


# --- explain --------------------------------------------------------------------------------------

def _explain(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["explain", QWEN, "--color", "never", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_explain_one_test_at_its_context(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _explain(["--", "llama-bench", "-m", "x.gguf", "-ngl", "99", "-ot", "exps=CPU", "--no-op-offload",
                             "1", "-p", "512", "-n", "128", "-fa", "1"], capsys)
    assert code == 0, out
    assert "MOE020" not in out and "fit" not in out.split("memory (MiB)")[0].lower()
    assert "memory (MiB) at -c 512 -ub 512" in out and "40960" not in out and "40,960" not in out
    assert "pp512 at context 512, tg128 at context 128" in out
    # no binary-missing note: llama-bench is the binary
    assert "no binary named" not in out


@pytest.mark.parametrize("model", [[QWEN, "--", "llama-bench", "-m", "x.gguf"], ["--", "llama-bench", "-m", QWEN]])
def test_explain_reads_the_line_once(model: list[str], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    # the model, the note on the test, the memory and the rules all take the one reading (the
    # model named before the line or by its -m)
    import moeconf.engines.benchline as benchline

    reads: list[int] = []

    def counted(words: list[str], eng: Engine) -> BenchLine:
        reads.append(len(words))
        return read_bench(words, eng)

    monkeypatch.setattr(benchline, "read_bench", counted)
    assert main(["explain", "--json", *model, "-ot", "exps=CPU", "-p", "512", "-n", "128"]) == 0
    assert json.loads(capsys.readouterr().out)["llama_bench"]["test"] == "pp512"
    assert reads == [9]


def test_lint_command_takes_a_bench_test_for_a_bench_line_only() -> None:
    from moeconf.linting.linter import bench_test, lint_command
    from moeconf.model.load import load_inventory

    test = bench_test(["llama-bench", "-m", "x.gguf"], engine("llama.cpp"))
    with pytest.raises(ValueError, match="not llama-bench's"):
        lint_command(load_inventory(QWEN), test.engine, ["llama-server", "-m", "x.gguf"], bench=test)


def test_explain_json_names_the_test(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _explain(["--json", "--", "llama-bench", "-m", "x.gguf", "-ot", "exps=CPU", "-p", "0", "-n", "256",
                             "-d", "8192"], capsys)
    assert code == 0
    js = json.loads(out)
    assert js["llama_bench"]["test"] == "tg256 @ d8192" and js["llama_bench"]["context"] == 8448


@pytest.mark.parametrize(("words", "said"), [
    (["-ub", "512,1024,2048"], "llama-bench runs 6 tests (-ub 512,1024,2048): give one value to explain it"),
    (["-ot", "exps=CPU,attn=CUDA0"], "(-ot exps=CPU,attn=CUDA0): give one value"),
    (["-ngl", "10-30+10"], "llama-bench runs 6 tests (-ngl 10-30+10)"),
    (["-c", "4096"], "has no option '-c'"),
    (["-fitt", "1024"], "-fitt 1024"),
    (["-nkvo", "2"], "0 or 1"),
    (["-pg", "512"], "takes a pair `PROMPT,GENERATED`"),
    (["-p", "0", "-n", "0"], "llama-bench runs no test (-p 0 -n 0"),
    (["-p", "1-100000"], "gives more than 4,096 values"),
    (["stray"], "takes no positional word 'stray'"),
    (["--model=x.gguf"], "has no option '--model=x.gguf'"),
    (["-m"], "-m needs a value"),
])
def test_explain_refuses_naming_what_to_change(words: list[str], said: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _explain(["--", "llama-bench", "-m", "x.gguf", *words], capsys)
    assert code == 2 and said in err and "Traceback" not in err, err
    assert out == ""


def test_explain_refuses_env_for_llama_bench(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _explain(["--env", "LLAMA_ARG_N_CPU_MOE=4", "--", "llama-bench", "-m", "x.gguf"], capsys)
    assert code == 2 and "reads no LLAMA_ARG_" in err


def test_explain_bench_defaults_offload_every_layer(capsys: pytest.CaptureFixture[str]) -> None:
    # llama.cpp's llama-bench offloads every layer without -ngl (-1), and fits nothing
    code, out, _ = _explain(["--json", "--", "llama-bench", "-m", "x.gguf"], capsys)
    assert code == 0
    js = json.loads(out)
    assert js["llama_bench"]["command"][-2:] == ["-fit", "off"]
    assert js["memory"]["CUDA0"]["weights"] > js["memory"]["CPU"]["weights"]


def test_fit_refuses_a_llama_bench_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fit", QWEN, "--gpu", "16GiB", "--", "llama-bench", "-m", "x.gguf", "-p", "512"])
    err = capsys.readouterr().err
    assert code == 2 and "a llama-bench line is explained" in err and "Traceback" not in err


def test_values_become_the_servers_options() -> None:
    ml = _line("llama-bench -m x.gguf --repack 0 -nkvo 1 -ts '1;2' -dev CUDA0/CUDA1 -lm mmap").tests()[0].words()
    w = [a.text for a in ml]
    assert ("-nr" in w or "--no-repack" in w) and "-nkvo" in w and "-lm" in w
    assert w[w.index("-ts") + 1] == "1/2" and w[w.index("-dev") + 1] == "CUDA0,CUDA1"
    ik = [a.text for a in _line("llama-bench -m x.gguf -fmoe 0 -mmp 0 -rtr 1 -fa 0", IK).tests()[0].words()]
    assert {"-no-fmoe", "--no-fused-moe"} & set(ik) and "--no-mmap" in ik and "-rtr" in ik
    assert "-fa" not in ik or ik[ik.index("-fa") + 1] == "off"


def test_a_setting_no_server_option_sets_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from moeconf.engines import benchline

    # ik's --print-overrides only prints; read as if it did more, no server option sets it
    monkeypatch.setattr(benchline, "_TIMING", benchline._TIMING - {"print_overrides"})
    line = _line("llama-bench -m x.gguf --print-overrides 1", IK)
    assert line.tests()[0].untranslated() == ["--print-overrides 1"]
    why = line.explain_refusal()
    assert why is not None and "does not model llama-bench's --print-overrides 1" in why
    # its default: nothing to set
    assert _line("llama-bench -m x.gguf --print-overrides 0", IK).explain_refusal() is None


def test_a_set_from_an_unset_variable_is_not_checked(tmp_path: Path) -> None:
    found = _lint(tmp_path, 'llama-bench -m x.gguf -ngl 99 -ot "exps=CPU,$OT"')
    assert [f.name for f in found if f.severity != "info"] == []
    notes = [f for f in found if f.name == "cannot-check"]
    assert notes and "$OT" in notes[0].message


def test_places_survive_quoting_across_lines(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\n# moeconf: model={QWEN}\nllama-bench -m x.gguf -ngl 99 \\\n"
                      "  -ot 'exps=CPU,blk\\.0\\.ffn_up_exps=CPU;blk\\.0\\.ffn_up_exps=CUDA0'\n")
    found = [f for f in lint([str(script)], Config()).findings if f.name == "shadowed-rule"]
    line4 = "  -ot 'exps=CPU,blk\\.0\\.ffn_up_exps=CPU;blk\\.0\\.ffn_up_exps=CUDA0'"
    assert [(f.line, f.column) for f in found] == [(4, line4.index(";") + 2)]


def test_explain_takes_the_model_from_the_bench_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", "--", "llama-bench", "-m", f"{QWEN},{MODELS / 'glm-4.5-air.manifest.json'}"])
    err = capsys.readouterr().err
    assert code == 2 and "llama-bench runs 4 tests (-m " in err  # two models: one test each, refused
    assert main(["explain", "--json", "--", "llama-bench", "-m", QWEN, "-ngl", "99"]) == 0
    assert json.loads(capsys.readouterr().out)["llama_bench"]["context"] == 512


def test_lint_says_where_it_stops_checking_tests(tmp_path: Path) -> None:
    sets = ",".join(f"blk\\.{i}\\.ffn_up_exps=CPU" for i in range(20))
    found = _lint(tmp_path, f"llama-bench -m x.gguf -ngl 99 -ot '{sets}' -ub 256,512")
    notes = [f.message for f in found if f.name == "cannot-check"]
    assert notes == ["llama-bench runs 40 combinations of -ot sets, -ngl, -ub, ...: the first 16 were checked"]
    assert not [f for f in _lint(tmp_path, "llama-bench -m x.gguf -ngl 99 -ot exps=CPU") if f.name == "cannot-check"]


def test_past_the_limit_every_set_is_still_checked(tmp_path: Path) -> None:
    # 12 sets x 2 ubatch sizes: the 16 checked tests hold every set (the last one's rule matches nothing)
    sets = ",".join([*(f"blk\\.{i}\\.ffn_up_exps=CPU" for i in range(11)), "blk\\.0\\.nothing=CPU"])
    found = _lint(tmp_path, f"llama-bench -m x.gguf -ngl 99 -ot '{sets}' -ub 256,512")
    assert any(f.name == "unmatched-pattern" and "nothing" in f.message for f in found), \
        [(f.name, f.message) for f in found]
