"""ik_llama.cpp on a real CUDA GPU (tests/data/ik_cuda_h200.json): what moeconf prints for the measured
line against what ik logged. Weights and KV are exact; ik's compute is labelled estimated and must
never come out under the buffers ik allocated on the card; the default reserve covers what the card
held beyond ggml's buffers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory import read_settings
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained

MiB = 1024 * 1024
DATA = json.loads((Path(__file__).parent / "data" / "ik_cuda_h200.json").read_text())
LINES = DATA["lines"]


def _inventory(line: dict[str, object], tmp: Path) -> Inventory:
    name = str(line["layout"])
    lay = dataclasses.replace(LAYOUTS[name], key=f"{name}-{line['blocks']}", blocks=int(str(line["blocks"])))
    path = tmp / f"{lay.key}.gguf"
    write_layout(lay, path)
    return load_inventory(path)


def _estimate(line: dict[str, object], tmp: Path) -> dict[str, dict[str, float]]:
    eng = engine("ik_llama.cpp", "0.1.5")
    args = [str(a) for a in line["args"]]  # type: ignore[attr-defined]
    ex = explain(_inventory(line, tmp), eng, args, gpus=["CUDA0"])
    est = estimate_explained(ex, read_settings(args, eng))
    return {dev: {"weights": m.weights / MiB, "kv": m.kv / MiB, "compute": m.compute / MiB}
            for dev, m in est.devices.items()}


@pytest.mark.parametrize("line", LINES, ids=[" ".join(x["args"]) for x in LINES])
def test_ik_cuda_weights_and_kv_exact(line: dict[str, object], tmp_path: Path) -> None:
    logged = line["logged_mib"]
    ours = _estimate(line, tmp_path)
    assert abs(ours["CUDA0"]["weights"] - logged["CUDA0 weights"]) <= 1.0, ours  # type: ignore[index]
    assert abs(ours["CUDA0"]["kv"] - logged["CUDA0 KV"]) <= 1.0, ours  # type: ignore[index]
    assert abs(ours["CPU"]["weights"] - logged["CUDA_Host weights"]) <= 1.0, ours  # type: ignore[index]


@pytest.mark.parametrize("line", LINES, ids=[" ".join(x["args"]) for x in LINES])
def test_ik_cuda_compute_never_under_the_card(line: dict[str, object], tmp_path: Path) -> None:
    logged = line["logged_mib"]
    ours = _estimate(line, tmp_path)
    assert ours["CUDA0"]["compute"] >= logged["CUDA0 compute"], ours  # type: ignore[index]
    assert ours["CPU"]["compute"] >= logged["CUDA_Host compute"], ours  # type: ignore[index]


def test_default_reserve_covers_what_the_card_held_beyond_ggml() -> None:
    from moeconf.engines.settings import DEFAULT_RESERVE

    assert all(line["outside_ggml_buffers_mib"] * MiB <= DEFAULT_RESERVE for line in LINES)


def test_the_gpu_check_named_in_the_label_is_the_measured_one(tmp_path: Path) -> None:
    """ikarchs.GPU_CHECKED states what the GPU logged and what moeconf estimated: both must be today's."""
    from moeconf.memory.ikarchs import GPU_CHECKED, compute_label

    (line,) = [x for x in LINES if x["layout"] == "qwen3-30b-a3b"]
    ours = _estimate(line, tmp_path)
    text = GPU_CHECKED["qwen3moe"]
    assert f"CUDA0 {round(line['logged_mib']['CUDA0 compute'])} MiB logged" in text  # type: ignore[index]
    assert f"this estimate {round(ours['CUDA0']['compute'])}" in text
    assert "checked on a GPU" in str(compute_label("qwen3moe")) and "not measured on a GPU" in str(
        compute_label("glm4moe"))
