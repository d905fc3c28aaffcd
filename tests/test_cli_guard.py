"""Exit codes mean one thing each (0 clean, 1 findings, 2 user error, 3 internal error), a bug is
one line and never a traceback, every option has help, and the engine harness keeps the checkout
clean."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import moeconf.cli as cli
from moeconf.cli import main
from tests.conftest import EXAMPLES, REPO

MANIFEST = str(EXAMPLES / "models" / "kimi-k2.manifest.json")


def _raise(exc: BaseException) -> Any:
    def handler(args: argparse.Namespace) -> int:
        raise exc

    return handler


def _recurse(args: argparse.Namespace) -> int:
    return _recurse(args) + 1


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyError("k"), AssertionError("invariant"),
                                 MemoryError(), TypeError("'module' object is not callable"),
                                 ValueError("bad \x1b[2J value")],
                         ids=lambda e: type(e).__name__)
def test_unexpected_exception_is_exit_3_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                 exc: BaseException) -> None:
    monkeypatch.delenv("MOECONF_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_cmd_inspect", _raise(exc))
    assert main(["inspect", MANIFEST]) == 3
    out = capsys.readouterr()
    assert out.out == ""
    first, second = out.err.splitlines()
    assert first.startswith(f"moeconf: internal error: {type(exc).__name__}")
    assert "\x1b" not in out.err  # the message is escaped like any other text from a file
    assert "report" in second and "MOECONF_DEBUG=1" in second
    assert "Traceback" not in out.err


def test_recursion_error_is_exit_3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("MOECONF_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_cmd_schema", _recurse)
    assert main(["schema"]) == 3
    assert capsys.readouterr().err.startswith("moeconf: internal error: RecursionError: ")


def test_os_error_naming_a_file_is_a_user_error(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "_cmd_inspect", _raise(PermissionError(13, "Permission denied", "/x/model.gguf")))
    assert main(["inspect", MANIFEST]) == 2
    assert capsys.readouterr().err == "moeconf: error: /x/model.gguf: Permission denied\n"


def test_interrupt_is_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "_cmd_inspect", _raise(KeyboardInterrupt()))
    assert main(["inspect", MANIFEST]) == 130
    assert capsys.readouterr().err == "moeconf: interrupted\n"


def test_real_process_exit_3_and_debug_traceback() -> None:
    """Through a real interpreter and the console entry point's code path: exit 3 and no
    traceback; with MOECONF_DEBUG=1 the traceback is shown for developers."""
    code = ("import sys, moeconf.cli as c\n"
            "def bad(args): raise RuntimeError('kaboom')\n"
            "c._cmd_schema = bad\n"
            "sys.exit(c.main(['schema']))\n")
    env = {k: v for k, v in os.environ.items() if k != "MOECONF_DEBUG"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert r.returncode == 3
    assert r.stderr.startswith("moeconf: internal error: RuntimeError: kaboom\n")
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**env, "MOECONF_DEBUG": "1"}, timeout=60)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "RuntimeError: kaboom" in r.stderr


def test_usage_errors_are_2_and_findings_1(tmp_path: Path) -> None:
    def run(*args: str) -> int:
        return subprocess.run([sys.executable, "-m", "moeconf", *args], capture_output=True, text=True, cwd=REPO,
                              timeout=120).returncode

    assert run("inspect", "--no-such-option", MANIFEST) == 2
    assert run("inspect", str(tmp_path / "missing.gguf")) == 2
    assert run("lint", str(EXAMPLES / "deploy" / "run-glm-air.sh")) == 1
    assert run("inspect", MANIFEST) == 0


def test_a_command_sets_the_collectors_threshold_for_itself_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """main raises the cyclic collector's threshold while a command runs (cli.main) and gives the
    caller's back, also when the command fails."""
    import gc

    seen: list[tuple[int, int, int]] = []
    monkeypatch.setattr(cli, "_cmd_inspect", lambda args: seen.append(gc.get_threshold()) or 0)
    monkeypatch.setattr(cli, "_cmd_lint", _raise(RuntimeError("boom")))
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert main(["inspect", MANIFEST]) == 0
        assert seen == [(100_000, 10, 10)] and gc.get_threshold() == (700, 10, 10)
        assert main(["lint", MANIFEST]) == 3
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


def _actions(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in a._choices_actions}
            for name, sub in a.choices.items():
                out.append((f"{path} {name}", helps.get(name)))
                out += _actions(sub, f"{path} {name}")
        else:
            out.append((f"{path} {'/'.join(a.option_strings) or a.dest}", a.help))
    return out


def test_every_option_and_subcommand_has_help() -> None:
    actions = _actions(cli._parser(), "moeconf")
    assert len(actions) > 40
    missing = [name for name, text in actions if not (text and text.strip() and text != argparse.SUPPRESS)]
    assert missing == []


def test_engine_harness_runs_engines_outside_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ik_llama.cpp's llama-cli writes main.log into its working directory: the harness must give
    every engine process (and RPC server) a working directory outside the checkout."""
    from tests.engine import harness

    seen: list[dict[str, Any]] = []

    class Done:
        returncode = 0
        stdout = ""
        stderr = ""

    def fake_run(argv: list[str], **kw: Any) -> Done:
        seen.append({"argv": argv, **kw})
        return Done()

    monkeypatch.setattr(harness.subprocess, "run", fake_run)
    build = harness.EngineBuild("ik_llama.cpp", "test", None, tmp_path / "llama-cli", tmp_path / "rpc-server")
    monkeypatch.chdir(REPO)
    harness.run_engine(build, Path("model.gguf"), ["-ngl", "0"])
    (call,) = seen
    cwd = Path(call["cwd"]).resolve()
    assert not cwd.is_relative_to(REPO.resolve())
    assert call["argv"][2] == str(REPO / "model.gguf")  # a relative model path still names the same file
    assert not cwd.exists()  # removed afterwards

    started: list[dict[str, Any]] = []

    class Proc:
        def terminate(self) -> None: ...
        def wait(self, timeout: float | None = None) -> int:
            return 0
        def poll(self) -> None:
            return None

    def fake_popen(argv: list[str], **kw: Any) -> Proc:
        started.append(kw)
        return Proc()

    monkeypatch.setattr(harness.subprocess, "Popen", fake_popen)
    monkeypatch.setattr(harness.socket, "create_connection", lambda *a, **k: _Conn())
    with harness.rpc_servers(build, 1):
        pass
    (kw,) = started
    assert not Path(kw["cwd"]).resolve().is_relative_to(REPO.resolve())


class _Conn:
    def __enter__(self) -> _Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
