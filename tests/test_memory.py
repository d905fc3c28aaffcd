"""The memory model against figures read from the engines' code and measured with llama.cpp's
own projection (shared/memory-facts.md); the engine suite checks many more command lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import estimate, read_settings
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def models() -> dict[str, Inventory]:
    return {k: load_inventory(MODELS / f"{k}.manifest.json")
            for k in ("qwen3-30b-a3b", "deepseek-v3", "glm-4.5-air", "gpt-oss-20b", "llama-4-maverick")}


def mem(inv: Inventory, argv: list[str], eng: str = "llama.cpp", gpus: tuple[str, ...] = ("CUDA0",),
        env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    e = engine(eng)
    ex = explain(inv, e, argv, env=env, gpus=gpus)
    return estimate(ex.placement, read_settings(argv, e, env))


@pytest.mark.parametrize(("ctk", "mib"), [("f16", 3072), ("q8_0", 1632), ("q4_0", 864)])
def test_qwen3_kv_matches_the_engine(models: dict[str, Inventory], ctk: str, mib: int) -> None:
    est = mem(models["qwen3-30b-a3b"], ["-c", "32768", "-ngl", "99", "-ctk", ctk, "-ctv", ctk])
    assert est.devices["CUDA0"].kv == mib * MiB
    assert est.devices["CPU"].kv == 0


def test_deepseek_mla_caches_the_latent_only(models: dict[str, Inventory]) -> None:
    est = mem(models["deepseek-v3"], ["-c", "32768", "-ngl", "99"])
    assert est.devices["CUDA0"].kv == 2196 * MiB  # 61 layers x 576 x 32768 x 2 bytes
    est = mem(models["deepseek-v3"], ["-c", "32768", "-ngl", "99", "-ctk", "q8_0", "-ctv", "q8_0"])
    assert round(est.devices["CUDA0"].kv / MiB, 2) == 1166.62


def test_mla_refuses_different_k_and_v_types(models: dict[str, Inventory]) -> None:
    est = mem(models["deepseek-v3"], ["-c", "8192", "-ngl", "99", "-ctk", "q8_0"])
    assert any("different K and V cache types" in p for p in est.problems)
    assert not mem(models["qwen3-30b-a3b"], ["-c", "8192", "-ngl", "99", "-ctk", "q8_0"]).problems


def test_quantized_v_without_flash_attention_is_refused(models: dict[str, Inventory]) -> None:
    est = mem(models["qwen3-30b-a3b"], ["-c", "8192", "-ctv", "q8_0", "-fa", "off"])
    assert any("flash attention off" in p for p in est.problems)


def test_nextn_block_has_no_kv_on_mainline(models: dict[str, Inventory]) -> None:
    est = mem(models["glm-4.5-air"], ["-c", "8192", "-ngl", "99"])
    assert est.devices["CUDA0"].kv == 46 * 8192 * 8 * 128 * 2 * 2  # 46 of 47 blocks


def test_sliding_window_layers_get_window_plus_ubatch(models: dict[str, Inventory]) -> None:
    est = mem(models["gpt-oss-20b"], ["-c", "4096", "-ngl", "99"])
    assert est.swa_cells == 768  # PAD(128 + 512, 256)
    assert est.devices["CUDA0"].kv == 114 * MiB
    full = mem(models["gpt-oss-20b"], ["-c", "4096", "-ngl", "99", "--swa-full"])
    assert full.swa_cells == 4096 and full.devices["CUDA0"].kv == 192 * MiB


def test_llama4_chunked_layers(models: dict[str, Inventory]) -> None:
    est = mem(models["llama-4-maverick"], ["-c", "32768", "-ngl", "99"])
    assert est.swa_cells == 8192 + 512  # PAD(min(32768, 8192 + 512), 256)
    per_cell = 8 * 128 * 2 * 2
    assert est.devices["CUDA0"].kv == (12 * 32768 + 36 * 8704) * per_cell


def test_nkvo_and_partial_ngl_move_kv_not_weights(models: dict[str, Inventory]) -> None:
    inv = models["qwen3-30b-a3b"]
    base = mem(inv, ["-c", "8192", "-ngl", "99"])
    nkvo = mem(inv, ["-c", "8192", "-ngl", "99", "-nkvo"])
    assert nkvo.devices["CUDA0"].kv == 0 and nkvo.devices["CPU"].kv == base.devices["CUDA0"].kv
    assert nkvo.devices["CUDA0"].weights == base.devices["CUDA0"].weights
    part = mem(inv, ["-c", "8192", "-ngl", "11"])  # output + the last 10 blocks
    assert part.devices["CUDA0"].kv == 10 * 8192 * 4 * 128 * 2 * 2
    # -ot moves the experts' weights, never the KV cache of their layer
    ot = mem(inv, ["-c", "8192", "-ngl", "99", "-ot", "exps=CPU"])
    assert ot.devices["CUDA0"].kv == base.devices["CUDA0"].kv
    assert ot.devices["CPU"].weights > 16 * 1024 * MiB


def test_parallel_sequences_keep_the_total(models: dict[str, Inventory]) -> None:
    inv = models["qwen3-30b-a3b"]
    one = mem(inv, ["-c", "8192", "-ngl", "99"])
    four = mem(inv, ["-c", "8192", "-ngl", "99", "-np", "4"])
    assert four.kv_cells == 2048 and four.devices["CUDA0"].kv == one.devices["CUDA0"].kv


def test_env_forms_are_read(models: dict[str, Inventory]) -> None:
    inv = models["qwen3-30b-a3b"]
    env = {"LLAMA_ARG_CTX_SIZE": "32768", "LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_CACHE_TYPE_V": "q8_0",
           "LLAMA_ARG_N_GPU_LAYERS": "99"}
    assert mem(inv, [], env=env).devices["CUDA0"].kv == 1632 * MiB
    # the command line beats the env var
    assert mem(inv, ["-c", "16384"], env=env).devices["CUDA0"].kv == 816 * MiB


def test_compute_logits_live_on_the_output_device(models: dict[str, Inventory]) -> None:
    inv = models["qwen3-30b-a3b"]
    est = mem(inv, ["-c", "4096", "-ngl", "99", "-ub", "512"])
    logits = 151936 * 512 * 4
    assert est.devices["CUDA0"].compute >= logits
    # output.weight in host memory: a CUDA device takes the logits' MUL_MAT at a batch of 32 or more
    # (ggml-backend.cpp op offload, ggml-cuda.cu offload_op: get_op_batch_size >= op_offload_min_batch_size),
    # an RPC device does not (ggml-rpc.cpp: no offload_op), nor does CUDA with --no-op-offload
    moved = mem(inv, ["-c", "4096", "-ngl", "99", "-ub", "512", "-ot", r"^output\.weight=CPU"])
    assert moved.devices["CUDA0"].compute >= logits > moved.devices["CPU"].compute
    kept = mem(inv, ["-c", "4096", "-ngl", "99", "-ub", "512", "-ot", r"^output\.weight=CPU", "--no-op-offload"])
    assert kept.devices["CPU"].compute >= logits > kept.devices["CUDA0"].compute
    rpc = mem(inv, ["--rpc", "127.0.0.1:50052", "-c", "4096", "-ngl", "99", "-ub", "512", "-ot",
                    r"^output\.weight=CPU"], gpus=())
    assert rpc.devices["CPU"].compute >= logits > rpc.devices["RPC0[127.0.0.1:50052]"].compute
    # below the batch of 32 (-ub 16) the host keeps them on CUDA too
    small = mem(inv, ["-c", "4096", "-ngl", "99", "-ub", "16", "-ot", r"^output\.weight=CPU"])
    assert small.devices["CPU"].compute >= 151936 * 16 * 4 > small.devices["CUDA0"].compute - 151936 * 16 * 4
    # twice the ubatch, twice the compute
    big = mem(inv, ["-c", "4096", "-ngl", "99", "-ub", "1024"])
    assert big.devices["CUDA0"].compute == pytest.approx(2 * est.devices["CUDA0"].compute, rel=0.05)


def test_flash_attention_off_adds_the_kq_matrix(models: dict[str, Inventory]) -> None:
    inv = models["qwen3-30b-a3b"]
    argv = ["-c", "32768", "-ngl", "99", "-ot", r"^output\.weight=CPU"]
    on = mem(inv, argv).devices["CUDA0"].compute
    off = mem(inv, [*argv, "-fa", "off"]).devices["CUDA0"].compute
    assert off >= 32768 * 512 * 32 * 4 > on  # the KQ matrix: cells x ubatch x heads x f32


def test_cuda_only_terms_are_labelled_estimated(models: dict[str, Inventory]) -> None:
    est = mem(models["qwen3-30b-a3b"], ["-c", "8192", "-ngl", "99", "-ot", "exps=CPU", "-ctk", "q8_0",
                                        "-ctv", "q8_0"])
    labels = est.devices["CUDA0"].estimated
    assert any("op-offload" in x for x in labels) and any("f16 copy" in x for x in labels)
    assert est.devices["CUDA0"].reserve == 1024 * MiB and est.devices["CPU"].reserve == 0


def test_unknown_cache_type_is_a_problem(models: dict[str, Inventory]) -> None:
    est = mem(models["qwen3-30b-a3b"], ["-ctk", "q6_0"])
    assert any("does not accept cache type 'q6_0'" in p for p in est.problems)
    assert not mem(models["qwen3-30b-a3b"], ["-ctk", "q6_0"], eng="ik_llama.cpp").problems
    # ik's q8_KV as ik spells it, on ik only (ik's kv_cache_type_from_str refuses another case)
    assert not mem(models["qwen3-30b-a3b"], ["-ctv", "q8_KV"], eng="ik_llama.cpp").problems
    assert any("does not accept cache type 'Q8_kv'" in p
               for p in mem(models["qwen3-30b-a3b"], ["-ctv", "Q8_kv"], eng="ik_llama.cpp").problems)
    on_mainline = mem(models["qwen3-30b-a3b"], ["-ctv", "q8_KV"]).problems
    assert any("does not accept cache type 'q8_KV'" in p for p in on_mainline)


def test_version_1_manifest_warns_and_gives_weights_only(models: dict[str, Inventory], tmp_path: Path) -> None:
    data = json.loads((MODELS / "qwen3-30b-a3b.manifest.json").read_text())
    data["version"] = 1
    for k in ("key_length", "value_length", "key_length_mla", "value_length_mla", "kv_lora_rank", "q_lora_rank",
              "rope_dimension_count", "sliding_window", "sliding_window_pattern", "vocab_size", "hparams",
              "arch_keys", "floats"):
        data["metadata"].pop(k)
    p = tmp_path / "old.manifest.json"
    p.write_text(json.dumps(data))
    inv = load_inventory(p)
    assert any("manifest version 1" in w for w in inv.warnings)
    est = mem(inv, ["-c", "8192", "-ngl", "99"])
    assert not est.complete and est.devices["CUDA0"].kv == 0
    assert est.devices["CUDA0"].weights == mem(models["qwen3-30b-a3b"], ["-ngl", "99"]).devices["CUDA0"].weights
    # version 2 keys in a version 1 manifest are refused
    data["metadata"]["key_length"] = 128
    p.write_text(json.dumps(data))
    with pytest.raises(Exception, match="unknown key"):
        load_inventory(p)


@pytest.mark.parametrize(("model", "mib"), [
    # the engine's peak (an instrumented ggml-alloc: every allocation's offset): the FFN input, the
    # mask (8192 x 512 x 2), the attention result (n_head x head_v x ub x 4), the residual the
    # output projection allocated above it, then the copy 8 x n_embd x ub x 4 above the residual
    # (it does not fit in the hole the attention result left), 10 KiB more where the replay
    # (replay.moe_graph, now also with the output on the CPU) places the last small nodes.
    # llama-fit-params: 112.01 and 56.01
    ("glm-4.5-air", 8 + 8 + 24 + 8 + 8 * 8 + 10 / 1024),
    ("qwen3-30b-a3b", 4 + 8 + 8 + 4 + 8 * 4 + 10 / 1024),
])
def test_experts_output_returning_from_the_cpu_is_copied_into_the_gpu_buffer(
        models: dict[str, Inventory], model: str, mib: float) -> None:
    rpc = "RPC0[127.0.0.1:50052]"
    argv = ["--rpc", "127.0.0.1:50052", "-c", "8192", "-ngl", "999", "-ot", r"exps=CPU,^output\.weight=CPU"]
    est = mem(models[model], argv, gpus=())
    assert est.devices[rpc].compute == mib * MiB
    assert not est.devices[rpc].estimated  # RPC: no CUDA-only terms


# llama-fit-params -fitp on (sched_reserve's compute buffer size, MiB) for the RPC device, routed
# experts on the CPU; each figure is set by where ggml-alloc places the experts' returned output
@pytest.mark.parametrize(("model", "argv", "engine_mib"), [
    # a shared expert keeps the FFN input alive, so the experts' sum lands above the copy and the
    # logits above the residual it carries: 2 + 8 + 1 hidden states, router scratch, the logits
    ("glm-4.5-air", ["-c", "8192", "-ngl", "999", "-ot", "exps=CPU"], 384.28),
    # no shared expert: the sum takes the freed FFN input's hole, the logits sit low (4 + 296.75)
    ("qwen3-30b-a3b", ["-c", "8192", "-ngl", "999", "-ot", "exps=CPU"], 300.75),
    # absorbed MLA: the next layer's absorbed and concatenated queries (128 + 144 MiB) do not fit in
    # the hole the copy left, and go above the residual sitting above the copy
    ("deepseek-v3", ["-c", "4096", "-ngl", "999", "-ot", "exps=CPU"], 430.55),
    # layer 8 runs on the CPU: its experts' sum and residual add run on the first GPU, whose first
    # split starts with their copies, then the mask; later copies land above the mask
    ("qwen3-30b-a3b", ["-c", "8192", "-ngl", "40", "-ts", "1,1", "-ot", "exps=CPU"], 76.03),
])
def test_compute_where_the_allocator_places_the_returned_expert_output(
        models: dict[str, Inventory], model: str, argv: list[str], engine_mib: float) -> None:
    rpc = "RPC0[127.0.0.1:50052]"
    two = "-ts" in argv
    eps = "127.0.0.1:50052,127.0.0.1:50053" if two else "127.0.0.1:50052"
    est = mem(models[model], ["--rpc", eps, *argv], gpus=())
    ours = est.devices[rpc].compute / MiB
    # well inside the engine suite's 3%: leaving out any of the placements above misses by 9-36%
    assert abs(ours - engine_mib) <= 0.02 * engine_mib, (ours, engine_mib)


# llama-fit-params -fitp on, RPC devices (sched_reserve's compute buffer size, MiB): Llama 4's
# output device, given node by node by the engine's graph (moeconf/memory/graph). Its one routed expert's output
# lands in a hole of exactly n_embd x ub floats (the logits at 20 MiB) or 0.75 MiB of router scratch
# higher (at 40.75 MiB), depending on where earlier layers left the residual stream
@pytest.mark.parametrize(("argv", "engine_mib"), [
    (["-c", "32768", "-ngl", "999"], 435.38),  # every layer here
    (["-c", "8192", "-ngl", "999", "-ub", "1024"], 870.75),
    (["-c", "4096", "-ngl", "999", "-ub", "256"], 207.31),
    # layer 24 on the CPU: its residual ADD runs on the GPU, whose split starts with its sources
    (["-c", "8192", "-ngl", "24"], 414.62),
    (["-c", "16384", "-ngl", "10", "-ub", "2048"], 1658.50),
    # the layer before on another GPU, which runs this layer's first RMS_NORM (layer 38 dense, 33
    # MoE: copying the MoE layer's sources instead would put the logits 20.75 MiB higher)
    (["-c", "8192", "-ngl", "30", "-ts", "2,1"], 414.62),
    (["-c", "8192", "-ngl", "30", "-ts", "1,1"], 414.62),
])
def test_llama4_output_device_is_replayed(models: dict[str, Inventory], argv: list[str],
                                          engine_mib: float) -> None:
    two = "-ts" in argv
    eps = ["127.0.0.1:50052", "127.0.0.1:50053"] if two else ["127.0.0.1:50052"]
    est = mem(models["llama-4-maverick"], ["--rpc", ",".join(eps), *argv], gpus=())
    assert round(est.devices[f"RPC0[{eps[-1]}]"].compute / MiB, 2) == engine_mib


def test_allocator_takes_the_best_fitting_hole_and_merges_freed_neighbours() -> None:
    from moeconf.memory.graph.alloc import Allocator
    a = Allocator(32)
    x, y, z, w = a.alloc(100), a.alloc(64), a.alloc(64), a.alloc(32)
    assert (x, y, z, w) == (0, 128, 192, 256)  # sizes rounded up to the alignment
    a.free(x, 100)
    a.free(z, 64)
    assert a.alloc(64) == z  # the smallest hole that fits, not the first
    a.free(z, 64)
    assert a.alloc(200) == 288  # no hole fits: the end, and the buffer grows
    assert a.max_size == 512  # 200 rounded up to 224
    a.free(y, 64)  # merges with the holes on both sides: 0..256
    assert a.alloc(256) == 0
    b = Allocator(32)
    p, _, q, _ = b.alloc(64), b.alloc(32), b.alloc(64), b.alloc(32)
    b.free(p, 64)
    b.free(q, 64)
    assert b.alloc(64) == q  # equal holes: the later one


# llama-fit-params -fitp on (MiB: the RPC device's and the host's compute buffers): GLM-4.5-Air on
# one GPU, given by the engine's graph (moeconf/memory/graph). At -c 32768 the last layer
# frees its 32 MiB mask before the FFN and the experts' sum takes that hole: the logits sit 72 MiB
# lower than at -c 8192 to 24576; the host's peak depends on which freed inputs its copies fill
@pytest.mark.parametrize(("argv", "gpu_mib", "host_mib"), [
    (["-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0", "-ot", "exps=CPU"], 312.00, 148.09),
    (["-c", "24576", "-ot", "exps=CPU"], 384.28, 162.01),
    (["-c", "8192", "-ot", "exps=CPU"], 384.28, 146.26),
    # some layers' experts on the CPU, as `fit` writes them
    (["-c", "8192", "-ub", "256", "-ot", r"blk\.(2[0-9]|3[0-9]|4[0-5])\.ffn_.*_exps=CPU"], 192.14, 73.13),
    (["-c", "16384", "-ot", r"blk\.([1-9]|1[0-9])\.ffn_.*_exps=CPU"], 320.00, 154.01),
    (["-c", "8192"], 320.00, 24.01),
])
def test_glm_on_one_gpu_is_replayed(models: dict[str, Inventory], argv: list[str], gpu_mib: float,
                                    host_mib: float) -> None:
    est = mem(models["glm-4.5-air"], ["--rpc", "127.0.0.1:50052", "-ngl", "999", *argv], gpus=())
    assert round(est.devices["RPC0[127.0.0.1:50052]"].compute / MiB, 2) == gpu_mib
    assert abs(est.devices["CPU"].compute / MiB - host_mib) <= 0.1


# llama-fit-params -fitp on, the host's compute buffer (MiB) with routed experts on the CPU, by a
# replay of the host's share of the graph: the experts' splits fill the holes the graph inputs left
# once copied to the GPUs (the phase model was 14 to 28 MiB under on these)
@pytest.mark.parametrize(("model", "argv", "host_mib"), [
    ("deepseek-v3", ["-c", "4096", "-ub", "1024"], 480.02),
    ("deepseek-v3", ["-c", "4096"], 240.01),
    ("gpt-oss-20b", ["-c", "8192", "-ub", "2048"], 356.09),
    # two GPUs: the masks live until copied to the second, the experts' copies go above them
    ("glm-4.5-air", ["-c", "8192", "-ts", "1,1"], 154.26),
])
def test_host_compute_with_experts_on_the_cpu_is_replayed(models: dict[str, Inventory], model: str,
                                                          argv: list[str], host_mib: float) -> None:
    eps = "127.0.0.1:50052,127.0.0.1:50053" if "-ts" in argv else "127.0.0.1:50052"
    est = mem(models[model], ["--rpc", eps, "-ngl", "999", "-ot", "exps=CPU", *argv], gpus=())
    assert round(est.devices["CPU"].compute / MiB, 2) == host_mib


# llama-fit-params -fitp on (MiB, per RPC device): Qwen3-30B-A3B's GPUs replayed over their share
# of the graph. The middle GPU of a partial offload starts with the copies of the CPU layer's
# routed experts' output, weights and residual (its tail runs there), keeps the mask above them,
# and peaks on its experts above that (the phase model said 84.5); the last one holds the logits
@pytest.mark.parametrize(("argv", "mib"), [
    (["-c", "8192", "-ngl", "30", "-ts", "1,1"], {"127.0.0.1:50052": 100.03, "127.0.0.1:50053": 300.75}),
    (["-c", "16384", "-ngl", "40", "-ts", "1,1", "-ot", "exps=CPU", "-ub", "1024"],
     {"127.0.0.1:50052": 168.05, "127.0.0.1:50053": 601.5}),
    (["-c", "4096", "-ngl", "999"], {"127.0.0.1:50052": 300.75}),
    (["-c", "8192", "-ngl", "999", "-ctk", "bf16", "-ctv", "bf16", "-ub", "256"], {"127.0.0.1:50052": 150.38}),
])
def test_qwen3_gpus_are_replayed(models: dict[str, Inventory], argv: list[str], mib: dict[str, float]) -> None:
    est = mem(models["qwen3-30b-a3b"], ["--rpc", ",".join(mib), *argv], gpus=())
    assert {ep: round(est.devices[f"RPC0[{ep}]"].compute / MiB, 2) for ep in mib} == mib


@pytest.mark.parametrize(("ub", "offloads"), [("31", False), ("32", True)])
def test_cuda_op_offload_term_from_its_batch(models: dict[str, Inventory], ub: str, offloads: bool) -> None:
    """CUDA offloads host weights' ops from a batch of 32 (graph/sched.py `backend_for`): the estimated
    term appears from -ub 32 on, not below, and never with --no-op-offload."""
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-ub", ub, "-b", ub]
    terms = mem(models["qwen3-30b-a3b"], argv).devices["CUDA0"].estimated
    assert any("op-offload" in t for t in terms) == offloads, terms
    no_offload = mem(models["qwen3-30b-a3b"], [*argv, "--no-op-offload"]).devices["CUDA0"].estimated
    assert not any("op-offload" in t for t in no_offload)
