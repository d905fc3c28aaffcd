"""Mistral-Small-4 (mistral4) on ik_llama.cpp 0.1.5: weights and KV cache modelled (held with the other
newer architectures by tests/test_memory_ik_newer.py), compute refused (moeconf/memory/ikarchs.py
COMPUTE_DIFFERS): ik's graph for it is build_deepseek2, whose MLA attention is far above llama.cpp's graph
(tests/data/ik_compute_figures.json), and ik's MLA attention model (memory/ikmla.py, measured on DeepSeek-V3
and GLM-5) misses its buffers by far more than its margin (tests/data/ik_mla_mistral4.json, measured by
tests/engine/test_ik_mla_compute.py). This holds the refusal to those figures: were the model within its
margin of them, the refusal would be unfounded and this fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.writer import write_layout
from moeconf.memory import read_settings
from moeconf.memory.ikarchs import COMPUTE_DIFFERS, KV_ONLY, MLA_MODELLED
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.model.nametable import SOURCES
from moeconf.sizing import estimate_explained
from tests.engine import ik_compute_cases
from tests.engine import ik_mla_cases as cases

DATA = Path(__file__).parent / "data" / "ik_mla_mistral4.json"
FIGURES: dict[str, Any] = json.loads(DATA.read_text())
ROWS: list[dict[str, Any]] = FIGURES["rows"]
EPS = ["127.0.0.1:50052", "127.0.0.1:50053"]
IK = engine("ik_llama.cpp", "0.1.5")
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    path = ik_compute_cases.cut_path(tmp_path_factory.mktemp("ikmistral4"), "mistral-small-4")
    write_layout(cases.cut_layout("mistral-small-4"), path)
    return load_inventory(path)


@pytest.fixture(scope="module")
def trial(cut: Inventory) -> list[dict[str, float]]:
    return [cases.as_if_modelled(cut, r["line"], EPS, r.get("layer_devices")) for r in ROWS]


def test_every_line_was_measured_on_the_pinned_ik() -> None:
    assert FIGURES["engine"] == SOURCES["ik_llama.cpp"]
    assert {(r["model"], r["line"]) for r in ROWS} == set(cases.differs_cases())
    assert all(r["rc"] == 0 and r["compute"] for r in ROWS)
    assert "mistral4" in KV_ONLY and "mistral4" in COMPUTE_DIFFERS and "mistral4" not in MLA_MODELLED


def test_the_mla_model_would_under_size_ik_s_buffer_by_far(trial: list[dict[str, float]]) -> None:
    # -c 32768 -b 2048 -ub 2048: ik logged 1,536.01 MiB on the device running attention, the trial model 1,429
    assert cases.worst_under(ROWS, trial) == pytest.approx(107.01, abs=0.01)
    assert cases.worst_under(ROWS, trial) > 64
    # figures the model would cover (each at most its figure): the refusal would be unfounded, and this is caught
    covered = [{**r, "compute": {k: min(v, p[k]) for k, v in r["compute"].items()}} for r, p in zip(ROWS, trial,
                                                                                                     strict=True)]
    assert cases.worst_under(covered, trial) <= 0


def test_the_kv_cache_is_where_ik_put_it(cut: Inventory) -> None:
    for row in ROWS:
        args = cases.user_args(row["line"], EPS)
        est = estimate_explained(explain(cut, IK, args, gpus=[], layer_devices=row.get("layer_devices")),
                                 read_settings(args, IK))
        assert not est.complete and est.kv_known, est.notes
        assert any("build_deepseek2" in n for n in est.notes), est.notes
        for key, mib in row["kv"].items():
            device = key if key == "CPU" else f"RPC0[{EPS[int(key[3:])]}]"
            assert abs(est.devices[device].kv / MiB - mib) <= 0.01, (row["line"], key, mib, est.devices)


def test_fit_on_ik_refuses_saying_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mistral-small-4.gguf"
    write_layout(cases.cut_layout("mistral-small-4"), path, vocab=256)
    assert main(["fit", str(path), "--engine", "ik_llama.cpp", "--gpu", "24GiB", "-c", "8192"]) != 0
    err = capsys.readouterr().err
    assert "build_deepseek2" in err and "weights and KV cache are modelled" in err, err
