"""Setting families held to the engines' figures (issue 17): the sequence count each
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
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
MiB = 1024 * 1024
GiB = 1024 * MiB
RPC = "127.0.0.1:50052"
DEV = f"RPC0[{RPC}]"


@pytest.fixture(scope="module")
def models() -> dict[str, Inventory]:
    return {k: load_inventory(MODELS / f"{k}.manifest.json")
            for k in ("qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b", "llama-4-maverick",
                      "glm-4.5-air")}


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
    assert not [n for n in mem(inv, ["llama-completion", "-c", "8192"]).notes if "slot" in n or "binary" in n]


def test_fit_sizes_for_the_slots_of_the_binary_it_prints(models: dict[str, Inventory], tmp_path: Path) -> None:
    inv = models["llama-4-maverick"]
    # (28 GiB: the graph's CUDA op offload of the routed experts left on the CPU takes 8.3 GiB of compute)
    r = fit(inv, engine("llama.cpp"), [Budget("CUDA0", 28 * GiB)], ["-c", "65536"], model_path=str(inv.source),
            plan_dir=str(tmp_path), reserve=GiB)
    assert r.argv[0] == "llama-server" and "-np" not in r.argv
    # 12 full-attention layers x 65536 cells + 36 chunked layers x (8192 x 4 + 512) cells, 8 KV heads of 128, f16
    assert r.memory.devices["CUDA0"].kv == (12 * 65536 + 36 * 33280) * 8 * 128 * 2 * 2 == 7752 * MiB
    assert r.memory.devices["CUDA0"].total <= 28 * GiB


# -- ik_llama.cpp -mla on a mainline GGUF (attn_k_b + attn_v_b, no attn_kv_b) -----------------------
# ik 0.1.5 computes wkv_b at load for -mla 2/3 (llm_prepare_mla), so the cache keeps -mla 3's single
# latent even with flash attention off: a real-GPU log of DeepSeek-V3 at 32k f16 shows 2,196 MiB
# (moeconf said 4,148: it fell back to -mla 1's K + V^T pair). -mla 1 really has that pair.
@pytest.mark.parametrize(("flags", "kv_mib"), [
    (["-mla", "3", "-fa", "off"], 2196), (["-fa", "off"], 2196), (["-mla", "2", "-fa", "off"], 2196),
    (["-mla", "3"], 2196), (["-mla", "1", "-fa", "off"], 2196 + 1952),
])
def test_ik_mla_on_a_mainline_gguf(models: dict[str, Inventory], flags: list[str], kv_mib: int) -> None:
    inv = models["deepseek-v3"]
    e = engine("ik_llama.cpp", "0.1.5")
    argv = ["llama-server", "-c", "32768", "-ngl", "99", *flags]
    est = estimate(explain(inv, e, argv, gpus=["CUDA0"]).placement, read_settings(argv, e))
    assert est.devices["CUDA0"].kv == kv_mib * MiB


def test_ik_counts_the_wkv_b_it_computes(models: dict[str, Inventory]) -> None:
    inv = models["deepseek-v3"]
    e = engine("ik_llama.cpp", "0.1.5")

    def weights(flags: list[str]) -> tuple[int, tuple[str, ...]]:
        argv = ["llama-server", "-c", "4096", "-ngl", "99", *flags]
        d = estimate(explain(inv, e, argv, gpus=["CUDA0"]).placement, read_settings(argv, e)).devices["CUDA0"]
        return d.weights, d.estimated

    (w3, est3), (w1, est1) = weights(["-mla", "3"]), weights(["-mla", "1"])
    # 61 layers x wkv_b (512 x 128 x (128 + 128)) in Q8_0: 17 MiB each, labelled as modelled from the code
    assert w3 - w1 == 61 * 17 * MiB
    assert any("computes at load" in t for t in est3) and not any("computes at load" in t for t in est1)


# -- flash attention off with routed experts on the CPU: the host's share replayed ------------------
# (model, argv, host compute MiB by llama-fit-params -fitp on; the phase model said 700, 572, 476,
# 254 and 272: at long contexts its f32 masks stacked on the experts)
@pytest.mark.parametrize(("model", "argv", "host_mib", "tolerance"), [
    ("deepseek-v3", ["-c", "65536", "-ub", "1024"], 508.02, 0.05),
    ("deepseek-v3", ["-c", "32768", "-ub", "1024"], 508.02, 0.05),
    ("deepseek-v3", ["-c", "8192", "-ub", "1024"], 476.02, 0.05),
    ("deepseek-v3", ["-c", "16384"], 254.01, 0.05),
    # within tolerance (max(3%, 16 MiB)), a few MiB under: the host holds one input more
    ("qwen3-30b-a3b", ["-c", "32768", "-ub", "1024"], 204.02, 16),
])
def test_host_compute_with_flash_attention_off(models: dict[str, Inventory], model: str, argv: list[str],
                                               host_mib: float, tolerance: float) -> None:
    est = mem(models[model], ["llama-completion", "--rpc", RPC, "-ngl", "999", "-fa", "off", "-ot", "exps=CPU", *argv])
    assert est.complete
    assert abs(est.devices["CPU"].compute / MiB - host_mib) <= tolerance


# -- families moeconf does not model: incomplete with a note, never a number --------------------------
# each line with the engine's figure moeconf printed wrongly before (MiB: device, moeconf, engine)
REFUSED = [
    ("qwen3-30b-a3b", [RPC], ["-c", "32768", "-ot", "exps=CPU", "-nkvo"], "-nkvo"),  # host 104 vs 80
    ("gpt-oss-20b", [RPC], ["-c", "8192", "-ot", "exps=CPU", "-nkvo"], "-nkvo"),  # GPU 404 vs 432.13
    ("llama-4-maverick", [RPC, "127.0.0.1:50053"], ["-c", "8192", "-ts", "1,1", "-ot", "exps=CPU", "-nkvo"],
     "-nkvo"),  # a GPU 132 vs 160
    # routed experts and the output on the CPU over two GPUs where replay.moe_graph is not the model's
    # graph (sliding-window and chunked attention): a GPU 432 vs 469.14, 1,056 vs 1,136.17 at -ub 4096
    ("gpt-oss-20b", [RPC, "127.0.0.1:50053"],
     ["-c", "8192", "-ts", "1,1", "-b", "4096", "-ub", "4096", "-ot", r"exps=CPU,^output\.weight=CPU"], "output"),
    ("llama-4-maverick", [RPC, "127.0.0.1:50053"],
     ["-c", "8192", "-ts", "1,1", "-b", "4096", "-ub", "4096", "-ot", r"exps=CPU,^output\.weight=CPU"], "output"),
]


@pytest.mark.parametrize(("model", "eps", "argv", "fragment"), REFUSED)
def test_unmodelled_setting_families_are_refused(models: dict[str, Inventory], model: str, eps: list[str],
                                                 argv: list[str], fragment: str) -> None:
    est = mem(models[model], ["llama-completion", "--rpc", ",".join(eps), "-ngl", "999", *argv])
    assert not est.complete
    assert any("not modelled" in n and fragment in n for n in est.notes)
    assert all(m.kv == 0 and m.compute == 0 for m in est.devices.values())


@pytest.mark.parametrize(("model", "argv"), [
    # -nkvo with every expert on the GPU, and the output on the CPU with one GPU, stay modelled
    ("qwen3-30b-a3b", ["-c", "8192", "-nkvo"]),
    ("deepseek-v3", ["-c", "8192", "-nkvo", "-ub", "1024"]),
    ("qwen3-30b-a3b", ["-c", "8192", "-ot", r"exps=CPU,^output\.weight=CPU"]),
    # over two GPUs where the engine's graph gives every GPU's buffer (exact: tests/test_memory_replay.py)
    ("qwen3-30b-a3b", ["-c", "8192", "-ts", "1,1", "-b", "4096", "-ub", "4096", "-ot",
                       r"exps=CPU,^output\.weight=CPU"]),
    ("glm-4.5-air", ["-c", "32768", "-ts", "1,1", "-ot", r"exps=CPU,^output\.weight=CPU"]),
])
def test_neighbouring_settings_stay_modelled(models: dict[str, Inventory], model: str, argv: list[str]) -> None:
    rpc = ",".join([RPC, "127.0.0.1:50053"]) if "-ts" in argv else RPC
    assert mem(models[model], ["llama-completion", "--rpc", rpc, "-ngl", "999", *argv]).complete


def test_fit_refuses_a_fill_in_an_unmodelled_family(models: dict[str, Inventory], tmp_path: Path) -> None:
    from moeconf.errors import MoeconfError

    inv = models["qwen3-30b-a3b"]
    with pytest.raises(MoeconfError, match="-nkvo"):
        fit(inv, engine("llama.cpp"), [Budget("CUDA0", 8 * GiB)], ["-c", "32768", "-nkvo"],
            model_path=str(inv.source), plan_dir=str(tmp_path), reserve=GiB)
    # with room for every expert on the GPU, -nkvo is modelled and fits
    r = fit(inv, engine("llama.cpp"), [Budget("CUDA0", 40 * GiB)], ["-c", "32768", "-nkvo"],
            model_path=str(inv.source), plan_dir=str(tmp_path), reserve=GiB)
    assert r.memory.complete and r.memory.devices["CPU"].kv == 3072 * MiB


# -- host weights on a CPU with AMX ------------------------------------------------------------------
# llama-fit-params -fitp on -v with llama.cpp 0.3.36's CPU backend built with AMX (GGML_NATIVE on this
# workplace's Sapphire Rapids CPUs): the host's model buffers `Host + CPU_REPACK + AMX`, each row
# floored to a MiB (so the sum may fall up to 3 MiB under the bytes). moeconf without AMX said
# 7,477.69, 210,482.14, 73,201.78, 145,303.57 and 626.35; gpt-oss's F16 attention is not packed.
AMX = [
    ("qwen3-30b-a3b", ["-c", "4096", "-ngl", "30"], 3178 + 4104 + 200),
    ("deepseek-v3", ["-c", "4096", "-ngl", "30"], 85962 + 116928 + 7727),
    ("glm-4.5-air", ["-c", "4096", "-ngl", "20", "-ot", "exps=CPU"], 34049 + 35640 + 3906),
    ("llama-4-maverick", ["-c", "4096", "-ngl", "20"], 59391 + 80640 + 5545),
    ("qwen3-30b-a3b", ["-c", "4096", "-ngl", "999", "-ot", r"output\.weight=CPU"], 166 + 465),
    ("gpt-oss-20b", ["-c", "4096", "-ngl", "10"], 608 + 6051 + 759),
]


@pytest.mark.parametrize(("model", "argv", "host_mib"), AMX)
def test_host_weights_on_an_amx_cpu(models: dict[str, Inventory], model: str, argv: list[str], host_mib: int) -> None:
    import dataclasses

    inv = models[model] if model in models else load_inventory(MODELS / f"{model}.manifest.json")
    e = engine("llama.cpp")
    full = ["llama-completion", "--rpc", RPC, *argv]
    ex = explain(inv, e, full, gpus=())
    settings = dataclasses.replace(read_settings(full, e), host_cpu="amx")
    ours = estimate(ex.placement, settings).devices["CPU"].weights / MiB
    assert host_mib <= ours < host_mib + 3


def test_host_cpu_option_and_detection(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from moeconf.cli import main
    from moeconf.memory.amx import resolve_host_cpu

    model = str(MODELS / "qwen3-30b-a3b.manifest.json")
    # an RPC server has no pinned host buffer type: the CPU's extra buffer types come first
    argv = ["explain", model, "--", "llama-completion", "-c", "4096", "-ngl", "30", "--rpc", "127.0.0.1:50052"]
    assert main([*argv[:2], "--host-cpu", "amx", *argv[2:]]) == 0
    assert "AMX buffer (+5 MiB of host weights)" in capsys.readouterr().out
    assert main([*argv[:2], "--host-cpu", "plain", *argv[2:]]) == 0
    assert "up to 5 MiB more host weights" in capsys.readouterr().out
    # -nr (--no-repack) turns the extra buffer types off
    assert main([*argv[:2], "--host-cpu", "amx", *argv[2:], "-nr"]) == 0
    assert "AMX" not in capsys.readouterr().out
    # a CUDA GPU's pinned host buffer type comes before them: no AMX, unless --no-host
    cuda = ["explain", model, "--", "llama-completion", "-c", "4096", "-ngl", "30"]
    assert main([*cuda[:2], "--host-cpu", "amx", *cuda[2:]]) == 0
    assert "AMX" not in capsys.readouterr().out
    assert main([*cuda[:2], "--host-cpu", "amx", *cuda[2:], "--no-host"]) == 0
    assert "AMX buffer (+5 MiB of host weights)" in capsys.readouterr().out
    # the same by the variables the engine reads (explain's --env)
    assert main([*cuda[:2], "--host-cpu", "amx", "--env", "LLAMA_ARG_NO_HOST=1", *cuda[2:]]) == 0
    assert "AMX buffer (+5 MiB of host weights)" in capsys.readouterr().out
    assert main([*cuda[:2], "--host-cpu", "amx", "--env", "LLAMA_ARG_NO_HOST=1", "--env", "LLAMA_ARG_REPACK=false",
                 *cuda[2:]]) == 0
    assert "AMX" not in capsys.readouterr().out
    monkeypatch.setenv("MOECONF_HOST_CPU", "amx")
    assert resolve_host_cpu("auto") == "amx" and resolve_host_cpu("plain") == "plain"
    monkeypatch.delenv("MOECONF_HOST_CPU")
    assert resolve_host_cpu("auto") in ("amx", "plain")
    # ik_llama.cpp has no AMX buffer type
    ik = engine("ik_llama.cpp", "0.1.5")
    inv = load_inventory(model)
    full = ["llama-server", "-c", "4096", "-ngl", "30"]
    import dataclasses

    est = estimate(explain(inv, ik, full, gpus=["CUDA0"]).placement,
                   dataclasses.replace(read_settings(full, ik), host_cpu="amx"))
    assert not any("AMX" in n for n in est.notes)


# -- the linter sizes a launch for the binary it runs ------------------------------------------------
@pytest.mark.parametrize(("line", "over"), [
    # Llama 4 at 64k on a 24 GiB card (24,576 MiB): the GPU needs 9,534 + 7,752 (KV, 4 slots) + 8,509
    # (compute, with CUDA's op offload of the CPU expert tensors: memory/graph) + 1,024 = 26,819 MiB as
    # llama-server, with 4,296 MiB of KV as llama-completion (23,363)
    ("llama-server -m m.gguf -ngl 999 -fit off -c 65536 -ot exps=CPU", True),
    ("llama-completion -m m.gguf -ngl 999 -fit off -c 65536 -ot exps=CPU", False),
    ("docker run --gpus all ghcr.io/ggml-org/llama.cpp:server-cuda -m m.gguf -ngl 999 -fit off -c 65536 "
     "-ot exps=CPU", True),
    ("llama-server -m m.gguf -ngl 999 -fit off -c 65536 -ot exps=CPU -np 1", False),
])
def test_lint_sizes_for_the_binary(tmp_path: Path, line: str, over: bool) -> None:
    from tests.test_lint_memory import _lint

    found = [f for f in _lint(tmp_path, line, "llama-4-maverick", {"CUDA0": "24GiB"}) if f.code == "MOE040"]
    assert bool(found) == over, [f.message for f in found]


def test_image_binary() -> None:
    from moeconf.linting.linter import image_binary

    assert image_binary("ghcr.io/ggml-org/llama.cpp:server-cuda") == "llama-server"
    assert image_binary("ghcr.io/ggml-org/llama.cpp:light") == "llama-cli"
    assert image_binary("ghcr.io/ggml-org/llama.cpp:full") is None and image_binary(None) is None


# the output on the CPU after a GPU that follows CPU layers, -ub above 512 (MiB, that GPU: moeconf
# before, engine): Qwen3-30B-A3B 676 vs 704.2, GLM-4.5-Air 1,236 vs 1,296.08; at -ub 512 84.5 vs 88.03
@pytest.mark.parametrize(("model", "argv", "refused"), [
    ("qwen3-30b-a3b", ["-ngl", "30", "-b", "4096", "-ub", "4096"], True),
    ("glm-4.5-air", ["-ngl", "30", "-b", "4096", "-ub", "4096"], True),
    ("qwen3-30b-a3b", ["-ngl", "30"], False),
    ("qwen3-30b-a3b", ["-ngl", "999", "-b", "4096", "-ub", "4096"], False),  # 676.08 as the engine
])
def test_output_on_the_cpu_after_a_partial_offload(model: str, argv: list[str], refused: bool) -> None:
    inv = load_inventory(MODELS / f"{model}.manifest.json")
    est = mem(inv, ["llama-completion", "--rpc", RPC, "-c", "8192", *argv, "-ot", r"output\.weight=CPU"])
    assert est.complete != refused
    assert refused == any("partial -ngl" in n for n in est.notes)


def test_no_op_offload_drops_the_estimated_copy_of_a_host_expert_tensor() -> None:
    """--no-op-offload (llama.cpp common.cpp: cparams.op_offload = !no_op_offload, handed to
    ggml_backend_sched_new): the scheduler runs host ops where their weights are, so the GPU keeps
    no copy of the largest routed-expert tensor left in host memory."""
    inv = load_inventory(MODELS / "qwen3-30b-a3b.manifest.json")
    eng = engine("llama.cpp")
    line = ["llama-server", "-c", "8192", "-ngl", "999", "-ot", "exps=CPU"]
    on = estimate(explain(inv, eng, line).placement, read_settings(line, eng))
    off_line = [*line, "--no-op-offload"]
    off = estimate(explain(inv, eng, off_line).placement, read_settings(off_line, eng))
    largest = max(t.nbytes for t in inv.tensors if t.role == "experts")
    # the engine's graph (memory/graph) copies each offloaded host weight in at its split's start: the
    # largest routed-expert tensor and what its offloaded matmuls leave beside it
    assert on.devices["CUDA0"].compute - off.devices["CUDA0"].compute >= largest
    assert any("op-offload" in e for e in on.devices["CUDA0"].estimated)
    assert not any("op-offload" in e for e in off.devices["CUDA0"].estimated)
    # the last of --op-offload / --no-op-offload wins
    again = [*off_line, "--op-offload"]
    assert estimate(explain(inv, eng, again).placement, read_settings(again, eng)).devices["CUDA0"].compute == \
        on.devices["CUDA0"].compute


def test_flash_attention_and_switch_words_are_read_as_each_engine_reads_them() -> None:
    """llama.cpp compares -fa's word, and a switch variable's, as written (common_arg_utils::is_truthy: `ON` stops
    the server, `LLAMA_ARG_EMBEDDINGS=TRUE` runs no handler); ik_llama.cpp lowercases -fa on its command line, and
    its environment reader sets a bool from "1" or "true" and clears it on any other word (`=on` turns FA off)."""
    main, ik = engine("llama.cpp"), engine("ik_llama.cpp")
    assert read_settings(["-fa", "on"], main).flash_attn == "on"
    assert any("unknown value for -fa: 'ON'" in p for p in read_settings(["-fa", "ON"], main).problems)
    assert any("'ON'" in p for p in read_settings([], main, {"LLAMA_ARG_FLASH_ATTN": "ON"}).problems)
    assert read_settings(["-fa", "ON"], ik).flash_attn == "on" and not read_settings(["-fa", "ON"], ik).problems
    assert read_settings([], ik, {"LLAMA_ARG_FLASH_ATTN": "on"}).flash_attn == "off"
    assert read_settings([], ik, {"LLAMA_ARG_FLASH_ATTN": "true"}).flash_attn == "on"
    # an embedding server keeps every output row (0: all); a word the engine does not read as true changes nothing
    plain = read_settings(["llama-server"], main).n_outputs
    assert read_settings(["llama-server"], main, {"LLAMA_ARG_EMBEDDINGS": "TRUE"}).n_outputs == plain
    assert read_settings(["llama-server"], main, {"LLAMA_ARG_EMBEDDINGS": "true"}).n_outputs != plain


def test_a_refused_np_0_is_sized_at_the_default_slots() -> None:
    """llama-server refuses -np 0; the figures printed beside that refusal are for the refused value at its default
    (auto slots in one unified cache), as the memory header says, not for one slot of its own."""
    main = engine("llama.cpp")
    refused = read_settings(["llama-server", "-np", "0"], main)
    default = read_settings(["llama-server"], main)
    assert any("refuses -np 0" in p for p in refused.problems)
    assert (refused.n_parallel, refused.kv_unified, refused.auto_slots) == (
        default.n_parallel, default.kv_unified, default.auto_slots) and default.auto_slots
