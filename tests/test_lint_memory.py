"""The memory rules' advice works: `memory-over-device` names expert layers whose move to the CPU
really makes the device fit (measured again, compute included), and `fit-conflict` states what
`moeconf fit` would place instead: that `-ot` on the line clears every finding, and the command it
gives prints the same `-ot`."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.linting.linter import lint
from moeconf.linting.model import Finding
from tests.conftest import EXAMPLES

MODELS = EXAMPLES / "models"


def _lint(tmp: Path, line: str, model: str, gpu_memory: dict[str, str] | None, *, engine: str = "llama.cpp",
          extra_cfg: str = "") -> list[Finding]:
    cfg = [f'engine = "{engine}"']
    if gpu_memory:
        cfg.append("gpu_memory = {" + ", ".join(f'"{d}" = "{s}"' for d, s in gpu_memory.items()) + "}")
    if extra_cfg:
        cfg.append(extra_cfg)
    cfg += ["[models]", f'"m.gguf" = "{MODELS / (model + ".manifest.json")}"']
    (tmp / ".moeconf.toml").write_text("\n".join(cfg) + "\n")
    (tmp / "launch.sh").write_text(line + "\n")
    return lint([str(tmp / "launch.sh")]).findings


def _codes(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings}


CASES = [
    ("qwen3-30b-a3b", "16GiB", "-c 32768 -ctk q8_0 -ctv q8_0"),
    ("qwen3-30b-a3b", "12GiB", "-c 8192"),
    ("glm-4.5-air", "24GiB", "-c 32768 -ctk q8_0 -ctv q8_0"),
    ("glm-4.5-air", "40GiB", "-c 65536 -ub 2048"),
    ("gpt-oss-120b", "24GiB", "-c 131072"),
]


@pytest.mark.parametrize(("model", "size", "flags"), CASES)
def test_memory_over_device_advice_makes_it_fit(tmp_path: Path, model: str, size: str, flags: str) -> None:
    line = f"llama-server -m m.gguf -ngl 999 -fit off {flags}"
    found = [f for f in _lint(tmp_path, line, model, {"CUDA0": size}) if f.code == "MOE040"]
    assert len(found) == 1, found
    m = re.search(r"to the CPU \(blocks (\d+)-(\d+)\) brings it to ([\d,]+) MiB", found[0].message)
    assert m, found[0].message
    lo, hi = int(m.group(1)), int(m.group(2))
    ot = "blk\\.(" + "|".join(str(i) for i in range(lo, hi + 1)) + ")\\.ffn_.*_exps=CPU"
    after = _lint(tmp_path, f"{line} -ot '{ot}'", model, {"CUDA0": size})
    assert "MOE040" not in _codes(after), [f.message for f in after]
    # one layer fewer is not enough: the advice is the smallest move
    if hi > lo:
        ot = "blk\\.(" + "|".join(str(i) for i in range(lo + 1, hi + 1)) + ")\\.ffn_.*_exps=CPU"
        assert "MOE040" in _codes(_lint(tmp_path, f"{line} -ot '{ot}'", model, {"CUDA0": size}))


@pytest.mark.parametrize(("model", "size", "flags"), CASES)
def test_fit_conflict_states_what_fit_does_instead_and_it_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                model: str, size: str, flags: str) -> None:
    line = f"llama-server -m m.gguf -ngl 999 {flags} -ot exps=CPU"
    found = [f for f in _lint(tmp_path, line, model, {"CUDA0": size}) if f.code == "MOE020"]
    assert len(found) == 1
    msg = found[0].message
    m = re.search(r"in RAM: -ot '([^']*)' \((moeconf fit [^)]*)\)$", msg)
    assert m, msg
    ot, command = m.group(1), m.group(2)
    assert f"--gpu CUDA0={size}" in command and all(w in shlex.split(command) for w in flags.split())
    # the -ot it states, with -fit off, gives a line with no memory or fit finding
    fixed = f"llama-server -m m.gguf -ngl 999 -fit off {flags} -ot '{ot}'"
    assert not _codes(_lint(tmp_path, fixed, model, {"CUDA0": size})) & {"MOE020", "MOE040"}
    # and the command it gives prints that -ot
    assert main([*shlex.split(command)[1:], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ot"] == ot


def test_fit_conflict_says_nothing_more_without_gpu_sizes(tmp_path: Path) -> None:
    line = "llama-server -m m.gguf -ngl 999 -c 32768 -ot exps=CPU"
    found = [f for f in _lint(tmp_path, line, "qwen3-30b-a3b", None) if f.code == "MOE020"]
    assert len(found) == 1 and "moeconf fit" not in found[0].message
    # a GPU the line uses has no size: no claim about what fit would do
    two = "llama-server -m m.gguf -ngl 999 -c 32768 -ts 1,1 -ot exps=CPU"
    found = [f for f in _lint(tmp_path, two, "qwen3-30b-a3b", {"CUDA0": "16GiB"}, extra_cfg='gpus = ["CUDA0", "CUDA1"]')
             if f.code == "MOE020"]
    assert len(found) == 1 and "moeconf fit" not in found[0].message


def test_fit_conflict_reads_env_forms_and_rpc_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dev = "RPC0[10.0.0.2:50052]"
    line = ("LLAMA_ARG_CTX_SIZE=16384 llama-server -m m.gguf -ngl 999 --rpc 10.0.0.2:50052 "
            "-ctk q8_0 -ctv q8_0 -ot exps=CPU")
    found = [f for f in _lint(tmp_path, line, "qwen3-30b-a3b", {dev: "10GiB"}, extra_cfg="gpus = []")
             if f.code == "MOE020"]
    assert len(found) == 1
    m = re.search(r"in RAM: -ot '([^']*)' \((moeconf fit [^)]*)\)$", found[0].message)
    assert m, found[0].message
    words = shlex.split(m.group(2))
    assert f"{dev}=10GiB" in words and "16384" in words and "10.0.0.2:50052" in words
    assert main([*words[1:], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ot"] == m.group(1) and out["memory"][dev]["total"] <= 10 * 2**30


def test_fit_conflict_on_ik_states_the_alternative_too(tmp_path: Path) -> None:
    line = "llama-server -m m.gguf -ngl 999 -c 32768 --fit -ot exps=CPU"
    found = [f for f in _lint(tmp_path, line, "glm-4.5-air", {"CUDA0": "24GiB"}, engine="ik_llama.cpp")
             if f.code == "MOE020"]
    assert len(found) == 1 and found[0].severity == "error"
    assert "--engine ik_llama.cpp" in found[0].message and "-ot '" in found[0].message


def test_fit_conflict_when_nothing_fits_says_so(tmp_path: Path) -> None:
    line = "llama-server -m m.gguf -ngl 999 -c 131072 -ot exps=CPU"
    found = [f for f in _lint(tmp_path, line, "deepseek-v3", {"CUDA0": "8GiB"}, extra_cfg='ignore = ["MOE040"]')
             if f.code == "MOE020"]
    assert len(found) == 1 and "finds no placement" in found[0].message and "does not fit: CUDA0" in found[0].message
    # with memory-over-device on, that finding states the analysis and fit-conflict points at it
    both = {f.code: f.message for f in _lint(tmp_path, line, "deepseek-v3", {"CUDA0": "8GiB"})}
    assert "moeconf fit" in both["MOE040"] and "memory-over-device at this line" in both["MOE020"]
    assert "moeconf fit" not in both["MOE020"]


def test_fit_conflict_on_two_gpus_gives_the_split_with_the_ot(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """With two GPUs fit's -ot holds only with fit's -ts: the finding gives both, and the line with
    them (and -fit off) has no memory finding (review: the -ot alone left CUDA0 4 GiB over)."""
    sizes = {"CUDA0": "24GiB", "CUDA1": "16GiB"}
    cfg = 'gpus = ["CUDA0", "CUDA1"]'
    line = "llama-server -m m.gguf -ngl 999 -c 32768 -ts 1,1 -ot exps=CPU"
    found = [f for f in _lint(tmp_path, line, "qwen3-235b-a22b", sizes, extra_cfg=cfg) if f.code == "MOE020"]
    assert len(found) == 1
    m = re.search(r"in RAM: -ts (\S+) -ot '([^']*)' \((moeconf fit [^)]*)\)$", found[0].message)
    assert m, found[0].message
    ts, ot = m.group(1), m.group(2)
    fixed = f"llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ts {ts} -ot '{ot}'"
    assert not _codes(_lint(tmp_path, fixed, "qwen3-235b-a22b", sizes, extra_cfg=cfg)) & {"MOE020", "MOE040"}
    assert main([*shlex.split(m.group(3))[1:], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ot"] == ot and out["argv"][out["argv"].index("-ts") + 1] == ts


def test_memory_over_device_without_ts_says_what_it_cannot_check(tmp_path: Path) -> None:
    """Two GPUs and no -ts: which layers each GPU gets is not known, so no total and no fix are
    claimed for them (review: it reported CUDA0 with KV 0 and advice that left it 4 GiB over), but
    the check is not skipped in silence (issue 25): an info says why, and what -ot pins to a GPU is
    known, a lower bound that is an error when it alone is over."""
    sizes = {"CUDA0": "24GiB", "CUDA1": "16GiB"}
    cfg = 'gpus = ["CUDA0", "CUDA1"]'
    fits = ("llama-server -m m.gguf -ngl 999 -fit off -c 32768 "
            "-ot 'blk\\.(3|4)\\.ffn_.*_exps=CUDA0' -ot exps=CPU")
    found = [f for f in _lint(tmp_path, fits, "deepseek-v3", sizes, extra_cfg=cfg) if f.code == "MOE040"]
    assert [f.severity for f in found] == ["info"] and "give -ts" in found[0].message, found
    over = fits.replace("(3|4)", "(1?[0-9])")  # the experts of blocks 3-19 pinned to a 24 GiB GPU
    found = [f for f in _lint(tmp_path, over, "deepseek-v3", sizes, extra_cfg=cfg) if f.code == "MOE040"]
    assert [f.severity for f in found] == ["error", "info"], found
    assert "CUDA0: what -ot pins there alone needs 119,548 MiB (weights 118,524, reserve 1,024)" in found[0].message
    pinned = over.replace("-c 32768", "-c 32768 -ts 24,37")
    assert "MOE040" in _codes(_lint(tmp_path, pinned, "deepseek-v3", sizes, extra_cfg=cfg))


@pytest.mark.parametrize(("line", "says"), [
    ("-ts 1,1 -ot exps=CUDA1", "CUDA1: no size in [gpu_memory], memory not checked there"),
    ("--override-kv qwen3moe.expert_used_count=int:4", "GPU memory not checked against [gpu_memory]: memory is not "
                                                       "modelled with --override-kv"),
])
def test_memory_over_device_says_what_it_did_not_check(tmp_path: Path, line: str, says: str) -> None:
    full = f"llama-server -m m.gguf -ngl 999 -fit off -c 32768 {line}"
    found = [f for f in _lint(tmp_path, full, "qwen3-30b-a3b", {"CUDA0": "24GiB"}) if f.code == "MOE040"]
    assert [f.severity for f in found] == ["info"] and says in found[0].message, found


def test_gpu_memory_names_the_gpus_a_line_splits_over(tmp_path: Path) -> None:
    """[gpu_memory] with two GPUs and no `gpus` key: the line's layers split over both (the GPUs
    the config sizes are on the machine), not simulated on CUDA0 alone."""
    line = "llama-server -m m.gguf -ngl 999 -fit off -c 262144 -ctk f32 -ctv f32"
    found = [f for f in _lint(tmp_path, line, "qwen3-30b-a3b", {"CUDA0": "24GiB", "CUDA1": "24GiB"})
             if f.code == "MOE040"]
    assert [f.severity for f in found] == ["info"], found
    assert "--gpu CUDA0=24GiB --gpu CUDA1=24GiB" in found[0].message


def test_fit_advice_only_for_a_line_that_reserves_the_servers_output_rows(tmp_path: Path) -> None:
    # `moeconf fit` writes a llama-server line, which reserves 4 output rows (engines/settings.py
    # server_outputs); llama-cli reserves the whole ubatch's, so fit's placement is no advice for it
    server = "llama-server -m m.gguf -ngl 999 -c 32768 -ot exps=CPU"
    found = [f for f in _lint(tmp_path, server, "qwen3-30b-a3b", {"CUDA0": "16GiB"}) if f.code == "MOE020"]
    assert len(found) == 1 and "moeconf fit" in found[0].message
    cli = "llama-cli -m m.gguf -ngl 999 -c 32768 -np 4 -kvu -ot exps=CPU"
    found = [f for f in _lint(tmp_path, cli, "qwen3-30b-a3b", {"CUDA0": "16GiB"}) if f.code == "MOE020"]
    assert len(found) == 1 and "moeconf fit" not in found[0].message
