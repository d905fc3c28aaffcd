"""The one argv reader (moeconf/engines/argvread.py read_argv): an engine command line read once,
as the engine's parser steps over it, into options with their canonical flag, values and place;
and the readers that moved onto it reading what the engine reads."""

from __future__ import annotations

from moeconf.engines import engine
from moeconf.engines.argvread import Arg, read_argv

MAIN = engine("llama.cpp")
IK = engine("ik_llama.cpp")


def test_each_option_with_its_canonical_flag_values_and_place() -> None:
    r = read_argv(["llama-server", "-m", "x.gguf", "--override-tensor", "exps=CPU", "-ot", "a=CUDA0",
                   "--ctx_size", "8192", "--jinja"], MAIN)
    assert r.binary is not None and r.binary.text == "llama-server"
    assert [(o.name, o.canonical, [v.text for v in o.values], o.index) for o in r.options] == [
        ("-m", "-m", ["x.gguf"], 1), ("--override-tensor", "-ot", ["exps=CPU"], 3), ("-ot", "-ot", ["a=CUDA0"], 5),
        ("--ctx-size", "-c", ["8192"], 7), ("--jinja", "--jinja", [], 9)]
    assert [o.value.text for o in r.of("-ot") if o.value] == ["exps=CPU", "a=CUDA0"]
    last = r.last("-c")
    assert last is not None and last.word.text == "--ctx_size" and last.row is not None and last.row.setting == "n_ctx"


def test_values_are_skipped_by_the_flag_table_not_by_their_look() -> None:
    # --alias takes "-c" as its value: the engine never reads a context size here
    r = read_argv(["-a", "-c", "--port", "8080"], MAIN)
    assert [o.name for o in r.options] == ["-a", "--port"]
    assert r.last("-c") is None
    # a two-value flag takes both
    r = read_argv(["--control-vector-layer-range", "1", "4", "-c", "64"], MAIN)
    assert [(o.name, [v.text for v in o.values]) for o in r.options] == [
        ("--control-vector-layer-range", ["1", "4"]), ("-c", ["64"])]


def test_flag_equals_value_is_read_as_meant_and_marked_inline() -> None:
    r = read_argv([Arg("--ctx-size=4096", "f", 1, 10)], MAIN)
    (o,) = r.options
    assert (o.name, o.inline, o.kind) == ("--ctx-size", True, "known")
    assert o.value == Arg("4096", "f", 1, 21) and o.word.text == "--ctx-size=4096"


def test_unknown_flags_are_kept_and_take_the_values_of_the_flag_meant() -> None:
    r = read_argv(["--n-cpu-mo", "5", "-c", "64"], MAIN)
    assert [(o.name, o.kind, o.closest, [v.text for v in o.values]) for o in r.options] == [
        ("--n-cpu-mo", "unknown", "--n-cpu-moe", ["5"]), ("-c", "known", None, ["64"])]
    # an ik_llama.cpp flag on llama.cpp: unknown there, and its value is its own (ik takes one)
    r = read_argv(["-mla", "3", "-c", "64"], MAIN)
    assert [(o.name, o.kind) for o in r.options] == [("-mla", "unknown"), ("-c", "known")]
    # a word that is no flag (a number, a stray path) is a word of its own
    r = read_argv(["-c", "64", "stray", "-5"], MAIN)
    assert [(o.name, o.kind) for o in r.options] == [("-c", "known"), ("stray", "word"), ("-5", "word")]


def test_missing_value_and_binary() -> None:
    r = read_argv(["-c"], MAIN)
    (o,) = r.options
    assert o.missing and o.value is None and r.binary is None
    # binary=False: the first word is an option even when it does not look like one (fit's flags)
    r = read_argv(["x", "-c", "1"], MAIN, binary=False)
    assert r.binary is None and r.options[0].kind == "word"


def test_fa_takes_a_value_by_version_and_bare_fa_reads_the_switch_meant() -> None:
    # -c is -fa's value (the engine then stops on it), 64 a stray word
    assert [(o.name, o.kind) for o in read_argv(["-fa", "-c", "64"], MAIN).options] == [("-fa", "known"),
                                                                                      ("64", "word")]
    old = engine("llama.cpp", "b6000")
    assert [o.name for o in read_argv(["-fa", "-c", "64"], old).options] == ["-fa", "-c"]
    r = read_argv(["-fa", "-c", "64"], MAIN, bare_fa=True)
    assert [(o.name, len(o.values)) for o in r.options] == [("-fa", 0), ("-c", 1)]
    assert [v.text for v in read_argv(["-fa", "-1"], MAIN, bare_fa=True).options[0].values] == ["-1"]


def test_removed_flags_are_known_to_the_versions_that_have_them() -> None:
    assert read_argv(["--no-mmap"], engine("llama.cpp", "b11000")).options[0].kind == "removed"
    assert read_argv(["--no-mmap"], MAIN).options[0].kind == "unknown"
    assert read_argv(["-fmoe"], engine("ik_llama.cpp", "2025-09-01")).options[0].kind == "removed"



def test_no_module_but_the_reader_steps_over_a_command_lines_words() -> None:
    """Every reader of an engine command line goes through read_argv: no other module walks the
    words by index (`words[i + 1]`, `argv.index("-m")`, `while i < len(words)`). The exceptions
    read no engine command line: moeconf's own (cli.py splits it from the engine's words before
    an engine is known) and the shell's (a docker `-e`, a command's leading assignments)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    walking = re.compile(r"(argv|words|args|texts)\[[a-z]+ \+ 1\]|(argv|words|args)\.index\(|"
                         r"while [a-z] < len\((argv|words|args)\)|in enumerate\((argv|words|args|inv\.args)\)")
    allowed = {"moeconf/engines/argvread.py", "moeconf/cli.py", "moeconf/linting/sources.py",
               "moeconf/linting/shell.py"}
    found = [f"{p.relative_to(root).as_posix()}:{n}: {line.strip()}"
             for p in sorted((root / "moeconf").rglob("*.py")) if p.relative_to(root).as_posix() not in allowed
             for n, line in enumerate(p.read_text().splitlines(), 1) if walking.search(line)]
    assert not found, "read the line through engines/argvread.py read_argv:\n" + "\n".join(found)
