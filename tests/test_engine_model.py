"""The engine model by version: ik_llama.cpp's version names, --n-cpu-moe on one and several
devices (ik's own rounding), the -ngl default and what -ngl 0 does, read from the engines'
source (ik 0.1.5 = commit 55d3c05bf; newest read 8337e4cd3) and checked against real builds by
the engine suite (tests/engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeconf.compile import compile_plan
from moeconf.engines import engine, ik, ik_date, mainline, version_error
from moeconf.engines.cmdline import ik_layer_devices, ik_ncmoe_share, ncmoe_take
from moeconf.errors import PlanError
from moeconf.explanation import explain
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.plan import plan_from_text
from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def qwen() -> Inventory:
    return load_inventory(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")  # 48 blocks, all MoE


@pytest.fixture(scope="module")
def air() -> Inventory:
    return load_inventory(EXAMPLES / "models" / "glm-4.5-air.manifest.json")  # 47 blocks: 0 dense, 46 nextn


@pytest.fixture(scope="module")
def oss() -> Inventory:
    return load_inventory(EXAMPLES / "models" / "gpt-oss-120b.manifest.json")  # 36 blocks, expert biases


def test_ik_version_names() -> None:
    assert ik_date("0.1.5") == "2026-04-13" and ik_date("v0.1.5") == "2026-04-13"
    assert ik_date(None) == ik_date("2099-01-01") == "2026-08-15"
    assert ik_date("2026-08-01") == "2026-08-01"
    assert version_error("ik_llama.cpp", "0.1.5") is None
    assert version_error("ik_llama.cpp", "2026-08-07") is None
    assert "YYYY-MM-DD" in (version_error("ik_llama.cpp", "b0") or "")
    assert "YYYY-MM-DD" in (version_error("ik_llama.cpp", "2026-13-01") or "")
    # older dates take the oldest code's facts, plus the -ot word split before 2025-09-01
    assert version_error("ik_llama.cpp", "2025-09-01") is None and ik_date("2025-03-14") == "2026-04-13"
    assert ik("2025-08-31").ot_items_read_as_words and not ik("2025-09-01").ot_items_read_as_words
    assert ik("2025-03-14").default_ngl == 0 and ik("2025-03-14").ncmoe_takes == "first"
    assert version_error("llama.cpp", "b7600") is None and version_error("llama.cpp", "7600") is None
    assert "build number" in (version_error("llama.cpp", "0.1.5") or "")


def test_ik_build_numbers_name_their_commit_dates() -> None:
    """`build = N` from ik's log: N is the commit count; the table maps it to the commit's date,
    and each fact switches at the first build of its PR's date (read from ik's history)."""
    assert version_error("ik_llama.cpp", "b4000") is None and version_error("ik_llama.cpp", "4000") is None
    assert ik_date("b4411") == "2026-04-13"  # 0.1.5 vendors commit 55d3c05bf, build 4411
    assert ik("b3869").ot_items_read_as_words and not ik("b3870").ot_items_read_as_words
    assert (ik("b4753").default_ngl, ik("b4754").default_ngl) == (0, 999)
    assert (ik("b4794").ncmoe_takes, ik("b4795").ncmoe_takes) == ("first", "last")
    assert not ik("b4533").output_on_gpu_any_ngl_modes and ik("b4534").output_on_gpu_any_ngl_modes
    assert ik_date("b99999") == "2026-08-15"  # after the newest build read: its facts
    # the table is ordered by build and by date
    from moeconf.engines.ikbuilds import IK_BUILD_DATES, IK_NEWEST_BUILD
    builds = [b for b, _ in IK_BUILD_DATES]
    dates = [d for _, d in IK_BUILD_DATES]
    assert builds == sorted(set(builds)) and dates == sorted(set(dates)) and builds[-1] <= IK_NEWEST_BUILD


def test_ik_facts_change_on_their_pull_requests() -> None:
    before, after = ik("2026-07-29"), ik("2026-07-30")
    assert (before.default_ngl, before.ot_needs_gpu) == (0, False)
    assert (after.default_ngl, after.ot_needs_gpu) == (999, True)
    assert ik("2026-08-06").ncmoe_takes == "first" and ik("2026-08-07").ncmoe_takes == "last"
    assert ik("2026-08-06").ncmoe_suffix == r"\.weight" and ik("2026-08-07").ncmoe_suffix == r"\.(weight|scale)"
    assert ik("0.1.5").output_on_gpu_any_ngl_modes == () and ik().output_on_gpu_any_ngl_modes


def test_ncmoe_one_device_by_version(qwen: Inventory, air: Inventory) -> None:
    # 0.1.5: the first N block indices, dense ones included; weights only
    t = ncmoe_take(ik("0.1.5"), air, 2)
    assert t.blocks == (0, 1) and t.patterns[0] == r"blk\.0\.ffn_(up|down|gate|gate_up)_exps\.weight"
    # since PR #2262: the last N blocks with experts, the nextn block 46 skipped
    t = ncmoe_take(ik(), air, 2)
    assert t.blocks == (45, 44) and t.patterns[0].endswith(r"_exps\.(weight|scale)")
    # mainline: the first N, whatever the devices
    assert ncmoe_take(mainline(), qwen, 2, n_devices=2).blocks == (0, 1)
    # N >= block count takes the one-device path on every device count (--cpu-moe is 999)
    assert len(ncmoe_take(ik("0.1.5"), qwen, 999, n_devices=2).blocks) == 48


def test_ncmoe_shared_over_devices() -> None:
    # ik's rounding: round(count * N / n_layer) each, then fix the total against the exact shares
    assert ik_ncmoe_share([6, 6], 2, 12) == [1, 1]
    assert ik_ncmoe_share([3, 3], 1, 6) == [0, 1]  # both round up to 1: the first device gives one back
    assert ik_ncmoe_share([5, 7], 3, 12) == [1, 2]
    assert ik_ncmoe_share([1, 11], 1, 12) == [0, 1]
    assert ik_ncmoe_share([5, 5, 2], 6, 12) == [2, 3, 1]  # 2.5 rounds away from zero (banker's: [3, 2, 1])
    assert ik_ncmoe_share([4, 4, 4], 1, 12) == [1, 0, 0]  # all round to 0: the first device gets one
    assert ik_ncmoe_share([4, 4, 4], 2, 12) == [0, 1, 1]


def test_ncmoe_two_devices_takes_each_devices_last_blocks(air: Inventory) -> None:
    devs = [0] * 23 + [1] * 25  # blocks 0-22 on device 0, 23-46 and the output on device 1
    t = ncmoe_take(ik("0.1.5"), air, 4, n_devices=2, layer_devices=devs)
    assert t.path == "per-device" and t.shares == ((23, 2), (24, 2))
    assert sorted(t.blocks) == [21, 22, 45, 46]  # the nextn block 46 counts: nothing checks for experts
    assert all(p.endswith(r"\.weight") for p in t.patterns)
    assert not t.estimated_split
    # -sm none with two devices: ik adds no --n-cpu-moe rule at all
    assert ncmoe_take(ik("0.1.5"), air, 4, n_devices=2, split_mode="none").blocks == ()
    # -sm graph: the one-device path
    assert ncmoe_take(ik("0.1.5"), air, 4, n_devices=2, split_mode="graph").blocks == (0, 1, 2, 3)


def test_ik_layer_split_estimate() -> None:
    assert ik_layer_devices(12, 999, 2) == [0] * 6 + [1] * 7
    # blocks -ngl leaves on the CPU count as the last device's
    assert ik_layer_devices(6, 3, 2)[:3] == [1, 1, 1]
    assert ik_layer_devices(6, 0, 2) == [1] * 7


def test_explain_follows_the_version(oss: Inventory) -> None:
    w = "blk.0.attn_q.weight"
    # no -ngl: 0.1.5 offloads nothing, newer ik everything
    old = explain(oss, ik("0.1.5"), [])
    assert old.placement.devices[w] == "CPU" and any("offloads nothing" in n for n in old.notes)
    assert explain(oss, ik(), []).placement.devices[w] == "CUDA0"
    # -ngl 0 with -ot: 0.1.5 applies it, newer ik drops it
    assert explain(oss, ik("0.1.5"), ["-ngl", "0", "-ot", "attn_q=CUDA0"]).placement.devices[w] == "CUDA0"
    assert explain(oss, ik(), ["-ngl", "0", "-ot", "attn_q=CUDA0"]).placement.devices[w] == "CPU"
    # weights only: 0.1.5 leaves the expert biases on the GPU
    d = explain(oss, ik("0.1.5"), ["-ngl", "999", "--n-cpu-moe", "1"]).placement.devices
    assert d["blk.0.ffn_up_exps.weight"] == "CPU" and d["blk.0.ffn_up_exps.bias"] == "CUDA0"
    d = explain(oss, ik(), ["-ngl", "999", "--n-cpu-moe", "1"]).placement.devices
    assert d["blk.35.ffn_up_exps.weight"] == "CPU" and d["blk.0.ffn_up_exps.weight"] == "CUDA0"


def test_ik_keeps_one_ncmoe_value(qwen: Inventory) -> None:
    # --cpu-moe is --n-cpu-moe 999: the later of the two wins
    d = explain(qwen, ik("0.1.5"), ["-ngl", "999", "--cpu-moe", "--n-cpu-moe", "1"]).placement.devices
    assert d["blk.0.ffn_up_exps.weight"] == "CPU" and d["blk.1.ffn_up_exps.weight"] == "CUDA0"
    d = explain(qwen, ik("0.1.5"), ["-ngl", "999", "--n-cpu-moe", "1", "--cpu-moe"]).placement.devices
    assert d["blk.1.ffn_up_exps.weight"] == "CPU"


def test_dev_names_the_devices_used(qwen: Inventory) -> None:
    ex = explain(qwen, ik("0.1.5"), ["-ngl", "999", "--n-cpu-moe", "2", "-dev", "CUDA1"], gpus=["CUDA0", "CUDA1"])
    assert ex.placement.devices["blk.0.attn_q.weight"] == "CUDA1"
    assert ex.placement.devices["blk.0.ffn_up_exps.weight"] == "CPU"  # one device: the first N


def test_two_devices_note_says_the_split_is_estimated(qwen: Inventory) -> None:
    ex = explain(qwen, ik("0.1.5"), ["-ngl", "999", "--n-cpu-moe", "2"], gpus=["CUDA0", "CUDA1"])
    assert any("24 layers -> 1" in n and "estimate" in n for n in ex.notes)


def test_plan_with_an_unknown_version_is_refused(tmp_path: Path) -> None:
    text = ('rules = ["experts -> cpu"]\n[model]\npath = "m.gguf"\n[engine]\nname = "ik_llama.cpp"\n'
            'version = "latest"\n')
    plan = plan_from_text(text, str(tmp_path / "p.toml"))
    with pytest.raises(PlanError) as e:
        compile_plan(plan, inventory=load_inventory(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"))
    assert e.value.line == 6 and "YYYY-MM-DD" in e.value.message


def test_engine_accepts_both_spellings() -> None:
    assert engine("ik", "0.1.5").date == "2026-04-13" and engine("llama.cpp", "b7600").build == 7600


def test_init_says_what_the_version_decides(tmp_path: Path) -> None:
    from moeconf.plan.starter import starter_plan

    inv = load_inventory(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    text = starter_plan(inv, str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"), str(tmp_path), "ik_llama.cpp")
    assert "0.1.5" in text and "2026-08-15" in text and "--n-cpu-moe" in text
    plan = plan_from_text(text, str(tmp_path / "plan.toml"))
    assert compile_plan(plan, inventory=inv).ot


def test_lint_config_with_an_unknown_version_is_refused(tmp_path: Path) -> None:
    from moeconf.errors import MoeconfError
    from moeconf.linting.linter import lint

    (tmp_path / ".moeconf.toml").write_text('engine = "ik_llama.cpp"\nengine_version = "latest"\n')
    (tmp_path / "run.sh").write_text("llama-server -m m.gguf -ngl 999\n")
    with pytest.raises(MoeconfError, match="YYYY-MM-DD"):
        lint([str(tmp_path / "run.sh")])
