"""ik_llama.cpp's layer split over 2+ devices with -ts (moeconf/iksplit.py): the splits ik 0.1.5
logged in the engine suite (tests/engine/test_engines.py, `-c 256` unless the case sets -c), its
float arithmetic, the facts that changed by version, and how explain, plans and fit use it."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import AUTO_GPU, engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import TINY
from moeconf.fixtures.tiny import write_tiny
from moeconf.iksplit import (
    IkSplitSettings,
    assign_layers,
    ik_layer_split,
    layer_sizes,
    read_ik_split_settings,
    split_points,
)
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

MODELS = Path(__file__).parent.parent / "examples" / "models"
IK015 = engine("ik_llama.cpp", "0.1.5")
GPUS = ["CUDA0", "CUDA1"]

# (model, command line, device per block then the output layer) as ik 0.1.5 logged them on two
# RPC devices ("Setting default device in layer L to D")
MEASURED = [
    ("tiny-deepseek2", "-ngl 999 -ts 1,1", [0, 0, 0, 1, 1, 1, 1]),
    ("tiny-llama4", "-ngl 999 -ts 1,1", [0, 0, 1, 1, 1]),
    ("tiny-glm4moe", "-ngl 999 -ts 3,1", [0, 0, 0, 0, 0, 1, 1]),
    ("tiny-qwen3moe", "-ngl 999 -ts 3,1", [0, 0, 0, 0, 0, 1, 1]),
    ("tiny-deepseek2", "-ngl 999 -ts 1,3", [0, 1, 1, 1, 1, 1, 1]),
    ("tiny-deepseek2", "-ngl 999 -ts 1/4", [0, 1, 1, 1, 1, 1, 1]),
    ("tiny-gpt-oss", "-ngl 3 -ts 1,1", [1, 0, 1, 1, 1]),
    ("tiny-deepseek2", "-ngl 5 -ts 1,2 -fa off", [1, 0, 1, 1, 1, 1, 1]),
    ("tiny-glm4moe", "-ngl 5 -ts 1,2 -fa off", [1, 0, 1, 1, 1, 1, 1]),
    ("tiny-llama4", "-ngl 5 -ts 1,2 -fa off", [0, 1, 1, 1, 1]),
    ("tiny-glm4moe", "-ngl 999 -ts 1,1 -c 512", [0, 0, 0, 1, 1, 1, 1]),
    ("tiny-gpt-oss", "-ngl 999 -ts 2,1 -ctk q8_0 -ctv q4_0 -c 1024", [0, 0, 0, 0, 1]),
    ("tiny-glm4moe", "-ngl 999 -ts 2,1 -ctk q8_0 -ctv q4_0 -c 1024", [0, 0, 0, 0, 0, 1, 1]),
    ("tiny-llama4", "-ngl 999 -ts 2,1 -ctk q8_0 -ctv q4_0 -c 1024", [0, 0, 0, 0, 0]),
    ("tiny-glm4moe", "-ngl 999 -ts 2,3 -ub 128 -b 256", [0, 0, 1, 1, 1, 1, 1]),
    ("tiny-gpt-oss", "-ngl 999 -ts 1,1 -mla 1 -fa off", [0, 0, 1, 1, 1]),
    ("tiny-deepseek2", "-ngl 999 -ts 1,1 -ot exps=CPU", [0, 0, 0, 1, 1, 1, 1]),
    ("tiny-qwen3moe", "-ngl 999 -ts 1,2 --n-cpu-moe 2", [0, 0, 1, 1, 1, 1, 1]),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    d = tmp_path_factory.mktemp("tiny")
    return {key: load_inventory(write_tiny(lay, d / f"{key}.gguf")) for key, lay in TINY.items()}


def _split(inv: Inventory, cmd: list[str], version: str = "0.1.5") -> list[int] | str:
    args = cmd if "-c" in cmd else [*cmd, "-c", "256"]
    settings = read_ik_split_settings(args)
    assert isinstance(settings, IkSplitSettings), settings
    ngl = int(args[args.index("-ngl") + 1])
    ts = [float(x) for x in args[args.index("-ts") + 1].replace("/", ",").split(",")]
    return ik_layer_split(inv, engine("ik_llama.cpp", version), settings, ngl, ts, 2)


@pytest.mark.parametrize(("key", "cmd", "logged"), MEASURED, ids=lambda c: c if isinstance(c, str) else "")
def test_predicts_the_split_ik_logged(tiny: dict[str, Inventory], key: str, cmd: str, logged: list[int]) -> None:
    assert _split(tiny[key], cmd.split()) == logged


def test_the_kv_cache_moves_the_split(tiny: dict[str, Inventory]) -> None:
    # the same -ts: a longer context (bigger KV per layer, the output layer unchanged) moves a layer
    inv = tiny["tiny-glm4moe"]
    assert _split(inv, ["-ngl", "999", "-ts", "2,1", "-c", "1024"]) != _split(inv, ["-ngl", "999", "-ts", "2,1"])


def test_running_total_is_a_float() -> None:
    # 16777217 + 2 is past the split point 16777218 in double, but ik's float running total holds
    # 16777217 as 16777216 (24-bit mantissa), so layer 1 still fits on device 0
    assert assign_layers([16777217.0, 2.0, 16777217.0], 0.0, [0.5, 1.0], 2, 999) == [0, 0, 1]


def test_compute_buffer_is_loaded_first_on_each_device() -> None:
    # each device starts with max_compute loaded: with -ts 1,3 a compute buffer as big as two
    # layers leaves device 0 nothing
    assert assign_layers([10.0, 10.0, 10.0, 10.0], 0.0, [0.25, 1.0], 3, 999) == [0, 1, 1, 1]
    assert assign_layers([10.0, 10.0, 10.0, 10.0], 20.0, [0.25, 1.0], 3, 999) == [1, 1, 1, 1]


def test_split_points() -> None:
    assert split_points([3, 1], 2) == [0.75, 1.0]
    assert split_points([1], 2) == [1.0, 1.0]  # a missing value is 0: the second device gets nothing
    assert split_points([0, 0], 2) is None  # ik splits by free memory


def test_partial_ngl_keeps_cpu_layers_and_output_off_the_split() -> None:
    # -ngl 2 of 4 blocks: blocks 0-1 stay on the CPU (their entries keep the last device), the
    # output layer is not offloaded (not weighed)
    assert assign_layers([1.0, 1.0, 1.0, 1.0, 50.0], 0.0, [0.5, 1.0], 4, 2) == [1, 1, 0, 1, 1]


def test_biases_counted_before_pr_1657(tiny: dict[str, Inventory]) -> None:
    # gpt-oss's expert biases: ik 0.1.5 counts them in the compute estimate (it logs 0.55 MiB
    # for block 0 at -c 256), from 2026-04-19 on they are skipped
    inv = tiny["tiny-gpt-oss"]
    old = layer_sizes(inv, IK015, IkSplitSettings(n_ctx=256), 999)
    new = layer_sizes(inv, engine("ik_llama.cpp", "2026-04-19"), IkSplitSettings(n_ctx=256), 999)
    assert not isinstance(old, str) and not isinstance(new, str)
    assert (old.max_compute, new.max_compute) == (573440.0, 524288.0)


def test_mla_3_forced_with_partial_ngl_since_pr_1870(tiny: dict[str, Inventory]) -> None:
    inv = tiny["tiny-deepseek2"]
    s = IkSplitSettings(n_ctx=4096, mla=1, flash_attn=False)

    def sizes(version: str, ngl: int) -> tuple[float, ...]:
        ls = layer_sizes(inv, engine("ik_llama.cpp", version), s, ngl)
        assert not isinstance(ls, str)
        return ls.sizes

    assert sizes("2026-05-23", 3) == sizes("2026-05-23", 999)  # -mla 1 cache either way
    assert sizes("2026-05-24", 3) != sizes("2026-05-24", 999)  # -mla 3 cache with -ngl 3
    assert sizes("2026-05-24", 3) == layer_sizes(inv, IK015, IkSplitSettings(n_ctx=4096, mla=3, flash_attn=False),
                                                 3).sizes  # type: ignore[union-attr]


def test_amb_default_256_since_pr_2312() -> None:
    # DeepSeek-V3 at -mla 3 without flash attention: the wv_b product of 32768 cells is 4 GiB for
    # 128 heads; -amb 256 (the default since 2026-08-13) cuts it to 8 heads at a time
    inv = load_inventory(MODELS / "deepseek-v3.manifest.json")
    s = IkSplitSettings(n_ctx=32768, flash_attn=False)
    before = layer_sizes(inv, engine("ik_llama.cpp", "2026-08-12"), s, 999)
    after = layer_sizes(inv, engine("ik_llama.cpp", "2026-08-13"), s, 999)
    assert not isinstance(before, str) and not isinstance(after, str)
    assert before.max_compute == 2 * 128 * 128 * 32768 * 4
    assert after.max_compute < before.max_compute


@pytest.mark.parametrize(("flags", "why"), [
    (["--fit"], "--fit"), (["-mtp"], "-mtp"), (["-ctk", "q3_K"], "cache type"), (["-c", "x"], "not a number"),
])
def test_unpredictable_settings_say_why(flags: list[str], why: str) -> None:
    got = read_ik_split_settings(["llama-server", *flags])
    assert isinstance(got, str) and why in got


def test_cache_types_are_read_as_ik_reads_them_for_its_estimate() -> None:
    """The split's reader takes ik's cache types as the memory settings do (settings.read_cache_type): its
    own q6_0 and q8_KV (spelled as ik compares it) beside llama.cpp's; a type no engine has is refused."""
    got = read_ik_split_settings(["-ctk", "q8_KV", "-ctv", "q6_0"])
    assert isinstance(got, IkSplitSettings) and (got.cache_type_k, got.cache_type_v) == ("q8_KV", "q6_0")
    for bad in ("q8_KVX", "q8_kv", "Q8_KV"):
        assert isinstance(read_ik_split_settings(["-ctv", bad]), str), bad


def test_explain_shows_the_predicted_split(tiny: dict[str, Inventory]) -> None:
    inv = tiny["tiny-qwen3moe"]
    ex = explain(inv, IK015, ["-ngl", "999", "-ts", "1,3", "-c", "256"], gpus=GPUS)
    dev = ex.placement.devices
    assert dev["blk.0.attn_q.weight"] == "CUDA0" and dev["blk.1.attn_q.weight"] == "CUDA1"
    assert AUTO_GPU not in dev.values()
    # a split from ik's log still wins
    logged = explain(inv, IK015, ["-ngl", "999", "-ts", "1,3"], gpus=GPUS, layer_devices=[1] * 7)
    assert logged.placement.devices["blk.0.attn_q.weight"] == "CUDA1"


@pytest.mark.parametrize("cmd", [
    ["-ngl", "999"],  # free memory
    ["-ngl", "999", "-ts", "0,0"],
    ["-ngl", "999", "-ts", "1,1", "-sm", "graph"],
])
def test_explain_keeps_auto_where_ik_decides(tiny: dict[str, Inventory], cmd: list[str]) -> None:
    ex = explain(tiny["tiny-qwen3moe"], IK015, cmd, gpus=GPUS)
    assert ex.placement.devices["blk.0.attn_q.weight"] == AUTO_GPU


def test_explain_says_why_a_split_is_not_predicted(tiny: dict[str, Inventory]) -> None:
    ex = explain(tiny["tiny-qwen3moe"], IK015, ["-ngl", "999", "-ts", "1,1", "-mtp"], gpus=GPUS)
    assert ex.placement.devices["blk.0.attn_q.weight"] == AUTO_GPU
    assert any("-mtp" in n and AUTO_GPU in n for n in ex.notes), ex.notes


def test_fit_for_two_gpus_checks_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fit", str(MODELS / "minimax-m2.manifest.json"), "--gpu", "24GiB", "--gpu", "24GiB",
               "--engine", "ik_llama.cpp", "-c", "32768", "-fa", "on"])
    got = capsys.readouterr()
    out = got.out + got.err  # the command, and its report
    assert rc == 0, out
    assert AUTO_GPU not in out and "CUDA0" in out and "CUDA1" in out


def test_output_layer_weighs_the_logits_less_the_compute_buffer() -> None:
    # Qwen3-30B-A3B: 151936 logits x 512 tokens x 4 bytes, less the largest compute buffer (which
    # every device already holds), on top of output.weight
    inv = load_inventory(MODELS / "qwen3-30b-a3b.manifest.json")
    ls = layer_sizes(inv, IK015, IkSplitSettings(n_ctx=4096), 999)
    assert not isinstance(ls, str)
    out_w = inv.by_name["output.weight"].nbytes
    assert ls.max_compute < 151936 * 512 * 4
    assert ls.sizes[-1] == out_w + 151936 * 512 * 4 - ls.max_compute
