"""Setting families held to the engines' figures (h17settings, issue 17): the sequence count each
binary defaults to, and the settings moeconf does not model, which it must refuse rather than
under-estimate. Figures: `llama-fit-params -fitp on` (llama.cpp 0.3.36) on sparse full-size layouts
with RPC devices; llama-server's unified cache measured by the same projection with `kv_unified`
set as llama-server sets it (llama-fit-params itself does not take -kvu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fit import Budget, fit
from moeconf.memory import estimate, read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.inventory import Inventory, load_inventory

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
MiB = 1024 * 1024
GiB = 1024 * MiB
RPC = "127.0.0.1:50052"
DEV = f"RPC0[{RPC}]"


@pytest.fixture(scope="module")
def models() -> dict[str, Inventory]:
    return {k: load_inventory(MODELS / f"{k}.manifest.json")
            for k in ("qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b", "llama-4-maverick")}


def mem(inv: Inventory, argv: list[str], eng: str = "llama.cpp", version: str | None = None) -> MemoryEstimate:
    e = engine(eng, version)
    ex = explain(inv, e, argv, gpus=())
    return estimate(ex.placement, read_settings(argv, e))


# -- slots ------------------------------------------------------------------------------------------
# (binary, model, argv, KV MiB on the RPC device, host compute MiB): llama-server without -np runs 4
# slots in one unified cache; the sliding-window (gpt-oss) and chunked (Llama 4) layers keep one
# window per slot (`n_swa * 4 + n_ubatch` cells); llama-completion and llama-cli run one sequence
SLOTS = [
    ("llama-server", "llama-4-maverick", ["-c", "65536", "-ngl", "999", "-ot", "exps=CPU"], 7752, 138.52),
    ("llama-completion", "llama-4-maverick", ["-c", "65536", "-ngl", "999", "-ot", "exps=CPU"], 4296, 140.52),
    ("llama-cli", "llama-4-maverick", ["-c", "65536", "-ngl", "999", "-ot", "exps=CPU"], 4296, 140.52),
    ("/opt/llama.cpp/build/bin/llama-server", "gpt-oss-20b", ["-c", "32768", "-ngl", "999"], 792, 44.27),
    ("llama-completion", "gpt-oss-20b", ["-c", "32768", "-ngl", "999"], 786, 44.02),
    ("llama-server", "gpt-oss-120b", ["-c", "32768", "-ngl", "999", "-ot", "exps=CPU"], 1188, 111.77),
    ("llama-completion", "gpt-oss-120b", ["-c", "32768", "-ngl", "999", "-ot", "exps=CPU"], 1179, 111.52),
    # a unified cache does not grow with slots on full-attention layers
    ("llama-server", "qwen3-30b-a3b", ["-c", "8192", "-ngl", "999", "-ot", "exps=CPU"], 768, 80.01),
]


@pytest.mark.parametrize(("binary", "model", "argv", "kv_mib", "host_mib"), SLOTS)
def test_sequences_follow_the_binary(models: dict[str, Inventory], binary: str, model: str, argv: list[str],
                                     kv_mib: int, host_mib: float) -> None:
    est = mem(models[model], [binary, "--rpc", RPC, *argv])
    assert est.devices[DEV].kv == kv_mib * MiB
    assert abs(est.devices["CPU"].compute / MiB - host_mib) <= 0.05


def test_server_slots_rule() -> None:
    e = engine("llama.cpp")
    auto = read_settings(["llama-server", "-c", "8192"], e)
    assert (auto.n_parallel, auto.kv_unified, auto.auto_slots) == (4, True, True)
    # -np -1 is auto too, and auto makes the cache unified whatever -no-kvu said
    assert read_settings(["llama-server", "-np", "-1", "-no-kvu"], e).kv_unified
    given = read_settings(["llama-server", "-np", "2"], e)
    assert (given.n_parallel, given.kv_unified, given.auto_slots) == (2, False, False)
    assert read_settings(["llama-server", "-np", "0"], e).problems
    env = read_settings(["llama-server"], e, {"LLAMA_ARG_N_PARALLEL": "1"})
    assert env.n_parallel == 1 and not env.kv_unified
    # other binaries, ik_llama.cpp's server and mainline servers before the auto slots: one sequence
    for argv, eng in ((["llama-cli"], e), (["llama-completion"], e), (["llama-server"], engine("ik_llama.cpp")),
                      (["llama-server"], engine("llama.cpp", "b6000")), (["-c", "8192"], e)):
        s = read_settings(argv, eng)
        assert (s.n_parallel, s.kv_unified) == (1, False), argv
    # the binary the line will run when argv has none (fit's and compile's output)
    assert read_settings(["-c", "8192"], e, binary="llama-server").n_parallel == 4


def test_swa_models_say_which_sequence_count_they_assumed(models: dict[str, Inventory]) -> None:
    inv = models["gpt-oss-20b"]
    assert any("4 slots by default" in n for n in mem(inv, ["llama-server", "-c", "8192"]).notes)
    assert any("no binary" in n for n in mem(inv, ["-c", "8192"]).notes)
    assert not mem(inv, ["llama-completion", "-c", "8192"]).notes


def test_fit_sizes_for_the_slots_of_the_binary_it_prints(models: dict[str, Inventory], tmp_path: Path) -> None:
    inv = models["llama-4-maverick"]
    r = fit(inv, engine("llama.cpp"), [Budget("CUDA0", 24 * GiB)], ["-c", "65536"], model_path=str(inv.source),
            plan_dir=str(tmp_path), reserve=GiB)
    assert r.argv[0] == "llama-server" and "-np" not in r.argv
    # 12 full-attention layers x 65536 cells + 36 chunked layers x (8192 x 4 + 512) cells, 8 KV heads of 128, f16
    assert r.memory.devices["CUDA0"].kv == (12 * 65536 + 36 * 33280) * 8 * 128 * 2 * 2 == 7752 * MiB
    assert r.memory.devices["CUDA0"].total <= 24 * GiB
