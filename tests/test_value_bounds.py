"""Values the engines stop on, refused by moeconf before anything is printed (issue 25): a number
std::stoi / std::stof cannot hold (how each flag's value is read comes from the engines' parsers:
engines/flagtable.py MAINLINE_VALUES / IK_VALUES), and sizes no machine has."""

from __future__ import annotations

import pytest

from moeconf.cli import main
from moeconf.engines import ik, mainline
from moeconf.engines.flags import value_problem
from moeconf.engines.flagtable import IK_VALUES, MAINLINE_VALUES
from tests.conftest import EXAMPLES

MODEL = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")


def test_the_table_says_how_each_engine_reads_a_number() -> None:
    assert MAINLINE_VALUES["-t"] == MAINLINE_VALUES["--ctx-size"] == "int"
    assert MAINLINE_VALUES["-ngl"] == "int|auto|all" and IK_VALUES["-ngl"] == "int"  # mainline's words
    assert MAINLINE_VALUES["-ts"] == IK_VALUES["-ts"] == "floats"
    assert "-ot" not in MAINLINE_VALUES and "-m" not in IK_VALUES  # strings


@pytest.mark.parametrize(("flag", "value", "stops"), [
    ("-t", "16", False), ("-t", "99999999999", True), ("-c", "2147483647", False), ("-c", "2147483648", True),
    ("-c", "-2147483648", False), ("-c", "4096k", False),  # std::stoi ignores what follows the digits
    ("-c", " 8192", False), ("-c", "k4096", True), ("-ngl", "auto", False), ("-ngl", "99999999999999999999", True),
    ("-ts", "3,1", False), ("-ts", "1e308,1", True), ("-ts", "1/1", False), ("-ts", "inf,1", False),
])
def test_stoi_and_stof_as_the_engine_calls_them(flag: str, value: str, stops: bool) -> None:
    assert (value_problem(mainline(), flag, value) is not None) == stops


def test_ik_reads_ngl_words_as_no_number() -> None:
    assert value_problem(ik("0.1.5"), "-ngl", "all") is not None


@pytest.mark.parametrize("flags", [["-c", "99999999999999"], ["-ngl", "99999999999999999999"], ["-ts", "1e308,1"],
                                   ["-t", "99999999999"]])
def test_explain_refuses_what_the_engine_stops_on(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", MODEL, "--", "llama-server", "-m", "x.gguf", "-fit", "off", *flags]) == 1
    assert "the engine would refuse to start" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["-q", "-t", "99999999999"], ["--ram", "1e400GiB"], ["--ram", "nanGiB"]])
def test_fit_refuses_out_of_range_values_as_user_errors(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", MODEL, "--gpu", "12GiB", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "internal error" not in err and "moeconf: error:" in err


def test_a_number_is_read_as_stoi_reads_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`-c 4096k`: llama.cpp's std::stoi reads 4096 and the server starts; moeconf reads the same
    (it refused it as no number)."""
    assert main(["explain", MODEL, "--", "llama-server", "-ngl", "99", "-fit", "off", "-c", "4096k"]) == 0
    assert "at -c 4096 " in capsys.readouterr().out
