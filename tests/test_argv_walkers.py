"""Readers of an engine command line that walked it with their own loops and read it otherwise
than the engine does, each moved onto the one argv reader (engines/argvread.py read_argv). Every
test here fails on the code before the move."""

from __future__ import annotations

import pytest

from moeconf.engines import engine

MAIN = engine("llama.cpp")
IK = engine("ik_llama.cpp")


def test_memory_settings_read_the_line_as_the_engine_does() -> None:
    """read_settings walked its own loop: `--ctx_size` (the engines read `_` as `-`) went unread,
    and a value that reads as a flag (`--alias -c`) was taken for one."""
    from moeconf.memory import read_settings

    assert read_settings(["llama-server", "--ctx_size", "8192", "--batch_size", "1024"], MAIN).n_ctx == 8192
    assert read_settings(["llama-server", "--ctx_size", "8192", "--batch_size", "1024"], MAIN).n_batch == 1024
    s = read_settings(["llama-server", "-a", "-c", "-ub", "256"], MAIN)
    assert (s.n_ctx, s.n_ubatch, s.problems) == (0, 256, ())
    # ik_llama.cpp's own flags on ik, and --name=value read as meant, are unchanged
    assert read_settings(["-mla", "3", "--ctx-size=4096"], IK).mla == 3
    assert read_settings(["-mla", "3", "--ctx-size=4096"], IK).n_ctx == 4096


def test_flags_extra_is_read_as_the_engine_reads_it() -> None:
    """scan_extra walked `[flags] extra` itself: a two-value flag's second value was an unknown
    word, and a flag the declared build still has (`-dio` before b11312) was unknown."""
    from moeconf.engines.argvread import scan_extra

    assert scan_extra(["--control-vector-layer-range", "1", "4", "-t", "8"], MAIN) == ([(3, "-t")], [])
    assert scan_extra(["-dio", "--jinja"], engine("llama.cpp", "b11000")) == ([], [])
    assert scan_extra(["-dio"], MAIN) == ([], [(0, "-dio")])
    # an unknown option's value, and a stray word, as before
    assert scan_extra(["--frobnicate", "3", "--jinja", "stray"], MAIN) == ([], [(0, "--frobnicate"), (3, "stray")])


def test_env_target_writes_an_extra_flag_as_the_engine_reads_it() -> None:
    """env_form matched words exactly: `--threads_http` (which llama.cpp reads as
    `--threads-http`) had "no LLAMA_ARG_* variable"."""
    import io

    from dotenv import dotenv_values

    from moeconf.compile import compile_plan
    from moeconf.emitting.targets import emit
    from moeconf.plan import plan_from_text
    from tests.conftest import EXAMPLES

    src = EXAMPLES / "plans" / "qwen3-235b-a22b.toml"
    text = src.read_text().replace("[flags]\n", '[flags]\nextra = ["--threads_http", "4", "--no_context_shift"]\n', 1)
    env = dotenv_values(stream=io.StringIO(emit(compile_plan(plan_from_text(text, str(src))), "env")))
    assert env["LLAMA_ARG_THREADS_HTTP"] == "4" and env["LLAMA_ARG_CONTEXT_SHIFT"] == "0"


def test_a_config_setting_is_replaced_only_by_an_option_the_engine_reads() -> None:
    """overridden_by looked at every word: `--alias -c` (the alias is "-c") replaced the config
    file's ctx-size, which the engine still applies."""
    from moeconf.engines.llamaconfig import LlamaConfig, apply, overridden_by, parse_ini

    cfg = LlamaConfig(files=[parse_ini("[*]\nctx-size = 8192\n", "/etc/llama.cpp/config.ini")])
    (s,) = [s for s in apply(cfg, MAIN, "llama-server").settings if s.option.first == "-c"]
    assert overridden_by(s, ["--alias", "-c"], {}, MAIN) is None
    assert overridden_by(s, ["--ctx_size", "4096"], {}, MAIN) == "--ctx_size on the command line"


def test_llama_swap_writes_each_option_with_its_values_on_one_line() -> None:
    """The llama-swap target paired words by their look: `-np -1` went on two lines, a flag and
    its value apart, against its own "one argument pair a line"."""
    from moeconf.compile import compile_plan
    from moeconf.emitting.targets import emit
    from moeconf.plan import plan_from_text
    from tests.conftest import EXAMPLES

    src = EXAMPLES / "plans" / "qwen3-235b-a22b.toml"
    text = src.read_text().replace("[flags]\n", '[flags]\nextra = ["-np", "-1", "--jinja"]\n', 1)
    out = emit(compile_plan(plan_from_text(text, str(src))), "llama-swap")
    lines = [line.strip() for line in out.splitlines()]
    assert "-np -1" in lines and "--jinja" in lines


def test_lint_reads_flags_and_values_as_the_engine_does() -> None:
    """The lint rules walked the words themselves: `-smgs` given as another flag's value counted
    as given (sm-graph-overrides), and `--ctx_size 32k` (read as `--ctx-size`: a context of 32)
    went unnoticed (flag-value-refused)."""
    import moeconf

    def codes(line: str, engine: str) -> set[str]:
        return {f.name for f in moeconf.lint_line(line, engine=engine)}

    assert "sm-graph-overrides" in codes("llama-server -m m.gguf -sm graph -ot exps=CPU -a -smgs", "ik_llama.cpp")
    assert "sm-graph-overrides" not in codes("llama-server -m m.gguf -sm graph -ot exps=CPU -smgs", "ik_llama.cpp")
    assert "flag-value-refused" in codes("llama-server -m m.gguf -ngl 999 -fit off --ctx_size 32k", "llama.cpp")


def test_a_bare_fa_before_another_flag_keeps_the_words_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    """cli.py's splitter gave `-fa` the next flag as its value (`-fa -c`), stranding `4096` among
    moeconf's own words: fit then stopped on "'4096': an engine flag was expected here". fit reads
    a bare -fa before another flag as `-fa on`, and now gets the words in their order."""
    from moeconf.cli import main
    from tests.conftest import EXAMPLES

    manifest = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    code = main(["fit", manifest, "--gpu", "24GiB", "-fa", "-c", "4096"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "-c 4096" in out and "-fa on" in out
