"""The fit-params oracle of the engine suite reads each device's figures from the engine's log. When the log has
lost a row the stdout names, it runs the projection again, and after its tries it is an error, never a zero."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.engine import oracle

STDOUT = "RPC0 18468 3072 464 \nHost 410 0 1219 \n"
RPC_ROW = ("common_memory_breakdown_print: |   - RPC0 (127.0.0.1:38769) | 24105 = 24105 + "
           "(22005 = 18468 +    3072 +     464) +      -22005 |")
HOST_ROW = ("common_memory_breakdown_print: |   - Host                   |                   1629 =   410 +    "
            "   0 +    1219                |")


def _fake(tmp_path: Path, logs: list[str], rc: int = 0) -> Path:
    """A stand-in for llama-fit-params that prints the same stdout each run and the next of `logs` on stderr."""
    for i, log in enumerate(logs):
        (tmp_path / f"log{i}").write_text(log + "\n")
    script = tmp_path / "fit-params"
    script.write_text(
        "#!/bin/sh\n"
        f"cd '{tmp_path}'\n"
        "n=$(cat count 2>/dev/null || echo 0)\n"
        "echo $((n + 1)) > count\n"
        f"cat log$n >&2 2>/dev/null || cat log{len(logs) - 1} >&2\n"
        f"printf '{STDOUT.replace(chr(10), chr(92) + 'n')}'\n"
        f"exit {rc}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_a_lost_row_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oracle, "FIT_PARAMS", _fake(tmp_path, ["", RPC_ROW, RPC_ROW + "\n" + HOST_ROW]))
    proj = oracle.project(tmp_path / "m.gguf", [], ["127.0.0.1:38769"])
    assert (tmp_path / "count").read_text().strip() == "3"
    assert proj.model == {"RPC0[127.0.0.1:38769]": 18468, "CPU": 410}
    assert proj.context == {"RPC0[127.0.0.1:38769]": 3072, "CPU": 0}
    assert proj.compute == {"RPC0[127.0.0.1:38769]": 464, "CPU": 1219}


def test_rows_lost_every_time_are_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oracle, "FIT_PARAMS", _fake(tmp_path, [RPC_ROW]))
    with pytest.raises(RuntimeError, match=r"breakdown lacks a device of \['Host', 'RPC0'\] in 3 runs"):
        oracle.project(tmp_path / "m.gguf", [], ["127.0.0.1:38769"])
    assert (tmp_path / "count").read_text().strip() == "3"


def test_a_failure_whose_reason_was_lost_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "0.00.100.000 E llama_init_from_model: failed to create llama_context"
    monkeypatch.setattr(oracle, "FIT_PARAMS", _fake(tmp_path, ["", reason], rc=1))
    with pytest.raises(RuntimeError, match="failed to create llama_context"):
        oracle.project(tmp_path / "m.gguf", [], ["127.0.0.1:38769"])
    assert (tmp_path / "count").read_text().strip() == "2"


def test_a_load_failure_whose_message_was_lost_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = "check_tensor_dims: tensor 'blk.0.attn_q.weight' not found"
    monkeypatch.setattr(oracle, "FIT_PARAMS", _fake(tmp_path, ["", "", f"0.1 E llama_model_load: {message}"], rc=1))
    p = oracle.load_failure(tmp_path / "m.gguf", message)
    assert p.returncode == 1 and message in p.stderr
    assert (tmp_path / "count").read_text().strip() == "3"
