"""Expert groups the pinned llama.cpp cannot use, refused without the engine (the engine suite sees the engine stop
on each: tests/engine/test_expert_groups.py): the loader's assertions on the groups are a load refusal of the file,
which --override-kv of a group key lifts; GroveMoE's graph aborts with groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.graphmodels import write_graph_model
from moeconf.memory import read_settings
from moeconf.memory.graph.model import file_refusals
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained


def _grouped(arch: str, folder: Path, groups: int, used: int) -> Inventory:
    return load_inventory(write_graph_model(arch, "a", folder / f"{arch}-{groups}-{used}.gguf", keys=(
        (f"{arch}.expert_group_count", groups, "u32"), (f"{arch}.expert_group_used_count", used, "u32"))))


def test_grovemoe_with_groups_is_refused(tmp_path: Path) -> None:
    assert not file_refusals(_grouped("grovemoe", tmp_path, 0, 0))
    why = file_refusals(_grouped("grovemoe", tmp_path, 2, 1))
    assert len(why) == 1 and "cannot run this grovemoe file: it sets 2 expert groups" in why[0], why


@pytest.mark.parametrize(("groups", "used", "bad"), [(3, 1, "8 experts that 3 groups do not divide"),
                                                     (2, 2, "2 of the 2 groups used"), (2, 0, "0 of the 2 groups used"),
                                                     (8, 1, "as many groups as experts (8) or more")])
def test_groups_the_loader_stops_on(tmp_path: Path, groups: int, used: int, bad: str) -> None:
    inv = _grouped("qwen3moe", tmp_path, groups, used)
    eng = engine("llama.cpp")
    line = ["-c", "4096", "-ngl", "99", "-fit", "off"]
    ex = explain(inv, eng, line, gpus=["CUDA0"])
    assert len(ex.load_refusals) == 1 and bad in ex.load_refusals[0], ex.load_refusals
    est = estimate_explained(ex, read_settings(line, eng))
    assert not est.complete and any("llama.cpp's loader stops on this qwen3moe file" in n for n in est.notes)
    # the loader reads the override instead: no load refusal, and memory refused for the override, not the file
    fixed = [*line, "--override-kv", "qwen3moe.expert_group_count=int:0"]
    ex = explain(inv, eng, fixed, gpus=["CUDA0"])
    assert not ex.load_refusals
    est = estimate_explained(ex, read_settings(fixed, eng))
    assert not est.complete and not any("loader stops" in n for n in est.notes)
    assert any("memory is not modelled with --override-kv qwen3moe.expert_group_count=int:0" in n for n in est.notes)


def test_two_groups_of_eight_experts_are_modelled(tmp_path: Path) -> None:
    inv = _grouped("qwen3moe", tmp_path, 2, 1)
    eng = engine("llama.cpp")
    line = ["-c", "4096", "-ngl", "99", "-fit", "off"]
    ex = explain(inv, eng, line, gpus=["CUDA0"])
    assert not ex.load_refusals
    assert estimate_explained(ex, read_settings(line, eng)).complete
