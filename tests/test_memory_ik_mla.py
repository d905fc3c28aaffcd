"""ik_llama.cpp's MLA compute (deepseek2, glm-dsa): moeconf's model of build_deepseek2's attention
(moeconf/memory/ikmla.py `attention_peak`, taken where it is above llama.cpp's graph of the same
placement) plus the measured margin, held to the compute buffers ik_llama.cpp 0.1.5 logged on real
loads of the cut DeepSeek-V3 and GLM-5 layouts over RPC (tests/data/ik_mla_figures.json, measured by
tests/engine/test_ik_mla_compute.py; the engine suite measures them again).

What is held: every recorded line within the margin (no ik figure above moeconf's), the margin the
worst error rounded up over as many device figures as the label says, and `fit` on ik answering on
the shipped MLA manifests within budget, with the label."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.writer import write_layout
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.memory.geometry import geometry
from moeconf.memory.ikarchs import mla_compute_label
from moeconf.memory.ikmla import (
    MARGIN_MIB,
    MEASURED_BUFFERS,
    attention_form,
    attention_peak,
    heads_per_chunk_pp,
    heads_per_step_kq,
)
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.model.nametable import SOURCES
from moeconf.sizing import estimate_explained
from tests.engine import ik_compute_cases
from tests.engine import ik_mla_cases as cases

DATA = Path(__file__).parent / "data" / "ik_mla_figures.json"
FIGURES: dict[str, Any] = json.loads(DATA.read_text())
ROWS: list[dict[str, Any]] = FIGURES["rows"]
MiB = 1024 * 1024
EPS = ["127.0.0.1:50052", "127.0.0.1:50053"]
IK = engine("ik_llama.cpp", "0.1.5")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("ikmla")
    out = {}
    for name in cases.MODELS:
        path = ik_compute_cases.cut_path(folder, name)
        write_layout(cases.cut_layout(name), path)
        out[name] = load_inventory(path)
    return out


def _device(key: str) -> str:
    return key if key == "CPU" else f"RPC0[{EPS[int(key[3:])]}]"


def _estimate(inv: Inventory, row: dict[str, Any]) -> MemoryEstimate:
    args = cases.user_args(row["line"], EPS)
    return estimate_explained(explain(inv, IK, args, gpus=[], layer_devices=row.get("layer_devices")),
                              read_settings(args, IK))


@pytest.fixture(scope="module")
def estimates(models: dict[str, Inventory]) -> list[MemoryEstimate]:
    return [_estimate(models[r["model"]], r) for r in ROWS]


def _tokens(line: str) -> int:
    m = re.search(r"-ub (\d+)", line)
    return int(m.group(1)) if m else 512


def errors(rows: list[dict[str, Any]], estimates: list[MemoryEstimate]) -> list[float]:
    """Per GPU figure of each line: ik's logged buffer less moeconf's figure without the margin."""
    from moeconf.memory.ikmla import margin_mib

    out = []
    for row, est in zip(rows, estimates, strict=True):
        for key, mib in row["compute"].items():
            if runs_attention(est, key, row["line"]):
                out.append(mib - (est.devices[_device(key)].compute / MiB - margin_mib(_tokens(row["line"]))))
    return out


def runs_attention(est: MemoryEstimate, key: str, line: str) -> bool:
    """Whether moeconf sized this device's compute by ik's MLA attention (else: llama.cpp's graph, the host
    running no attention layer)."""
    return mla_compute_label(_tokens(line)) in est.devices[_device(key)].estimated


def test_every_line_was_measured_on_the_pinned_ik() -> None:
    assert FIGURES["engine"] == SOURCES["ik_llama.cpp"]
    assert {(r["model"], r["line"]) for r in ROWS} == set(cases.cases())
    assert all(r["rc"] == 0 and r["compute"] and r["command"].startswith("llama-cli -m ") for r in ROWS)


def test_no_figure_is_above_moeconf_s_and_the_margin_is_the_worst_error(estimates: list[MemoryEstimate]) -> None:
    for row, est in zip(ROWS, estimates, strict=True):
        assert est.complete, (row["line"], est.notes)
        for key, mib in row["compute"].items():
            assert mib <= est.devices[_device(key)].compute / MiB + 0.005, (row, est.devices)
            # every RPC device runs attention layers; the host only on the `host` line
            assert runs_attention(est, key, row["line"]) == (key != "CPU" or row["line"].startswith("host")), row
    errs = errors(ROWS, estimates)
    assert (max(0, math.ceil(max(errs) - 0.005)), len(errs)) == (MARGIN_MIB, MEASURED_BUFFERS)


def test_the_kv_cache_is_where_ik_put_it(estimates: list[MemoryEstimate]) -> None:
    for row, est in zip(ROWS, estimates, strict=True):
        for key, mib in row["kv"].items():
            assert abs(est.devices[_device(key)].kv / MiB - mib) <= 0.01, (row, est.devices)


def test_the_forms_and_chunks_follow_build_deepseek2(models: dict[str, Inventory]) -> None:
    assert [attention_form(m, fa, 512) for m, fa in ((3, True), (2, True), (1, True), (3, False), (0, True))] == [
        "pp", "pp", "latent-fa", "kq", None]
    assert attention_form(3, True, 64) == "latent-fa" and attention_form(2, True, 64) == "kq"
    # DeepSeek-V3 at 32k: the f32 K|V of 128 heads is 4,096 MiB; -amb 512 takes 8 chunks of 16 heads
    assert heads_per_chunk_pp(128, 4096, 0) == 128 and heads_per_chunk_pp(128, 4096, 512) == 16
    assert heads_per_chunk_pp(128, 4096, 1) == 1
    # KQ of 8,192 MiB at -amb 512: 16 steps of 8 heads
    assert heads_per_step_kq(128, 8192, 512) == 8 and heads_per_step_kq(128, 8192, 0) == 128
    geo = geometry(models["deepseek-v3"])
    # 192 KiB per cell (the f32 K|V and its two f16 casts), the f16 mask, 252 KiB per token
    assert attention_peak(geo, 32768, 512, 3, True, 0) == 32768 * (128 * 256 * 6 + 512 * 2) + 512 * 252 * 1024


def test_the_error_check_refuses_a_figure_above_the_margin(estimates: list[MemoryEstimate]) -> None:
    row = ROWS[0]
    key = next(k for k in row["compute"] if k != "CPU")
    high = estimates[0].devices[_device(key)].compute / MiB + 2
    bad = {**row, "compute": {**row["compute"], key: high}}
    assert max(errors([bad], [estimates[0]])) > MARGIN_MIB


@pytest.mark.parametrize(("model", "gpu"), [("deepseek-v3", "24GiB"), ("kimi-k2", "24GiB"), ("kimi-k2.5", "24GiB"),
                                          ("glm-5", "32GiB")])
def test_fit_on_ik_answers_on_the_mla_manifests_within_budget(model: str, gpu: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / f"{model}.manifest.json")
    assert main(["fit", path, "--gpu", gpu, "--engine", "ik_llama.cpp", "-c", "32768", "--json"]) == 0, (
        capsys.readouterr().err)
    fitted = json.loads(capsys.readouterr().out)
    gpu = fitted["memory"]["CUDA0"]
    assert gpu["total"] <= fitted["budgets"]["CUDA0"] and gpu["compute"] > 0
    assert any(t.startswith("compute: estimated (ik_llama.cpp's MLA attention") for t in
               fitted["memory_estimated"]["CUDA0"])
    # the printed command, explained, gives the same figures
    argv = fitted["argv"]
    i = argv.index("-m")
    assert main(["explain", path, "--engine", "ik_llama.cpp", "--json", "--", *argv[i + 2:]]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_complete"] is True
    assert data["memory"]["CUDA0"]["total"] == gpu["total"]


def test_an_mla_mode_not_modelled_is_refused_with_the_next_step(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "deepseek-v3.manifest.json")
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768", "-mla", "0"]
    assert main(["explain", path, "--engine", "ik_llama.cpp", "--json", "--", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_complete"] is False and data["memory_kv_complete"] is True
    assert any("-mla 0 (standard attention over the decompressed heads) is not modelled: drop -mla" in n
               for n in data["memory_notes"])
    for mla in ("1", "2"):
        assert main(["explain", path, "--engine", "ik_llama.cpp", "--json", "--", *argv[:-1], mla]) == 0
        assert json.loads(capsys.readouterr().out)["memory_complete"] is True


def test_fit_where_the_model_does_not_fit_says_by_how_much(capsys: pytest.CaptureFixture[str]) -> None:
    # GLM-5 at 32k on 24 GiB: its dense layers, KV cache, ik's compute and the reserve are over the budget
    path = str(EXAMPLES / "glm-5.manifest.json")
    assert main(["fit", path, "--gpu", "24GiB", "--engine", "ik_llama.cpp", "-c", "32768"]) == 2
    err = capsys.readouterr().err
    assert "does not fit: CUDA0 needs" in err and "compute" in err and "not modelled" not in err


def test_fit_takes_amb_and_keeps_it_in_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    # ik 0.1.5 (-amb 0): DeepSeek-V3's attention takes 6,302 MiB at 32k and the dense layers do not fit 24 GiB;
    # -amb 512 cuts it to chunks of 16 heads, and fit answers with it in the command
    path = str(EXAMPLES / "deepseek-v3.manifest.json")
    base = ["fit", path, "--gpu", "24GiB", "--engine", "ik_llama.cpp", "--engine-version", "0.1.5", "-c", "32768"]
    assert main(base) == 2
    assert "does not fit" in capsys.readouterr().err
    assert main([*base, "-amb", "512", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["argv"][-2:] == ["-amb", "512"]
    assert fitted["memory"]["CUDA0"]["total"] <= fitted["budgets"]["CUDA0"]
