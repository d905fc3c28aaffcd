"""Traffic per command (moeconf/traffic.py) against figures computed by hand from the shipped manifests'
tensor lists (read here as plain JSON) and the engine's rules written out independently: a generated
token reads every always-active weight once, k of E slices of each routed-expert tensor, one row of
token_embd, its layers' KV rows up to the depth (a window layer's up to the window), the recurrent
state; the hidden state crosses at each device boundary; a prompt ubatch of at least 32 tokens copies
each host expert tensor of the layers it runs to the GPU (CUDA's op offload), the share of experts its
tokens select (uniform routing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moeconf import load_inventory
from moeconf.cli import main
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.traffic import Traffic, TrafficUnmodelled, traffic
from tests.conftest import EXAMPLES

F16 = 2
F32 = 4
I32 = 4
I64 = 8


def manifest(name: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    path = str(EXAMPLES / "models" / f"{name}.manifest.json")
    with open(path) as f:
        data = json.load(f)
    return path, data["metadata"], data["tensors"]


def run(name: str, argv: list[str], depth: int | None = None, eng: str = "llama.cpp") -> Traffic:
    path, _, _ = manifest(name)
    e = engine(eng)
    ex = explain(load_inventory(path), e, argv)
    return traffic(ex.placement, read_settings(argv, e, {}), depth)


def layer(t: dict[str, Any]) -> int | None:
    parts = t["name"].split(".")
    return int(parts[1]) if parts[0] == "blk" else None


def routed(t: dict[str, Any]) -> bool:
    return "_exps." in t["name"]


def pad256(n: int) -> int:
    return max(256, -(-n // 256) * 256)


def copies(tr: Traffic, per: str) -> dict[tuple[str, str], dict[str, int]]:
    cs = tr.token_copies if per == "token" else tr.ubatch_copies
    return {(c.src, c.dst): {"weights": c.weights, "activations": c.activations, "inputs": c.inputs,
                             "tensors": c.tensors} for c in cs}


def test_qwen3_30b_experts_on_the_cpu_per_generated_token() -> None:
    _, md, tensors = manifest("qwen3-30b-a3b")
    depth = 3000
    tr = run("qwen3-30b-a3b", ["-c", "4096", "-ot", "exps=CPU"], depth)
    k, E, n_layer, n_embd = md["expert_used_count"], md["expert_count"], md["block_count"], md["embedding_length"]
    emb = next(t for t in tensors if t["name"] == "token_embd.weight")
    experts = sum(t["nbytes"] for t in tensors if routed(t)) * k // E
    always = sum(t["nbytes"] for t in tensors if not routed(t) and t["name"] != "token_embd.weight")
    kv = n_layer * depth * md["head_count_kv"] * md["key_length"] * 2 * F16  # K and V rows, f16
    assert tr.reads["CPU"].json() == {"weights": emb["nbytes"] // md["vocab_size"], "experts": experts, "kv": 0,
                                      "recurrent": 0, "total": emb["nbytes"] // md["vocab_size"] + experts}
    assert tr.reads["CUDA0"].json() == {"weights": always, "experts": 0, "kv": kv, "recurrent": 0,
                                        "total": always + kv}
    # per layer the GPU sends the normed hidden state and the k expert ids to the host's expert ops, which
    # send back the k experts' outputs (weighted and summed on the GPU); the embedding row goes up once;
    # the graph's inputs: the position, the K and V cell indices, the mask of the viewed cells, out_ids
    c = copies(tr, "token")
    assert c[("CUDA0", "CPU")] == {"weights": 0, "activations": n_layer * (n_embd * F32 + k * I32), "inputs": 0,
                                   "tensors": 0}
    assert c[("CPU", "CUDA0")] == {"weights": 0, "activations": n_embd * F32 + n_layer * n_embd * k * F32,
                                   "inputs": I32 + 2 * I64 + pad256(depth + 1) * F16 + I32, "tensors": 0}
    assert tr.json()["generation"]["pcie_bytes"] == sum(sum(v for kk, v in x.items() if kk != "tensors")
                                                        for x in c.values())


@pytest.mark.parametrize("ub", [512, 32, 31, 16])
def test_qwen3_30b_op_offload_per_prompt_ubatch(ub: int) -> None:
    """CUDA takes the host experts' ops from a batch of 32 tokens; the last layer runs its FFN on the
    output token only (a batch of one), so its experts stay on the host."""
    _, md, tensors = manifest("qwen3-30b-a3b")
    tr = run("qwen3-30b-a3b", ["-c", "4096", "-ub", str(ub), "-ot", "exps=CPU"], 4096)
    k, E, n_layer = md["expert_used_count"], md["expert_count"], md["block_count"]
    offloaded = [t for t in tensors if routed(t) and layer(t) != n_layer - 1]
    c = copies(tr, "ubatch")[("CPU", "CUDA0")]
    assert tr.n_ubatch == ub
    if ub < 32:
        assert c["weights"] == c["tensors"] == 0
        return
    share = 1 - (1 - k / E) ** ub  # the expected share of the E experts that T tokens picking k each select
    assert c["tensors"] == len(offloaded) == 3 * (n_layer - 1)
    # rounded per tensor
    assert c["weights"] == pytest.approx(sum(t["nbytes"] for t in offloaded) * share, abs=len(offloaded))
    prompt = tr.json()["prompt"]
    assert prompt["op_offload_bytes"] == c["weights"]
    # the bounds: every token selecting the same k experts (zero weights: the routers tie), every expert
    assert prompt["op_offload_bytes_same_experts"] == sum(t["nbytes"] * k // E for t in offloaded)
    assert prompt["op_offload_bytes_all_experts"] == sum(t["nbytes"] for t in offloaded)


def test_two_gpus_one_crossing() -> None:
    """-ts 1,1: the layers split over two GPUs; the residual stream crosses once, n_embd F32 per token."""
    _, md, _ = manifest("qwen3-30b-a3b")
    tr = run("qwen3-30b-a3b", ["-c", "4096", "-ngl", "99", "-ts", "1,1"], 1000)
    n_embd = md["embedding_length"]
    assert copies(tr, "token")[("CUDA0", "CUDA1")]["activations"] == n_embd * F32
    assert copies(tr, "ubatch")[("CUDA0", "CUDA1")]["activations"] == n_embd * F32 * 512
    assert ("CUDA1", "CUDA0") not in copies(tr, "token")


def test_dense_layer_and_shared_experts_glm45_air() -> None:
    """GLM-4.5-Air: a dense first layer and a shared expert per MoE layer, read whole per token; the
    nextn block is not run (nor created on llama.cpp)."""
    _, md, tensors = manifest("glm-4.5-air")
    depth = 2048
    tr = run("glm-4.5-air", ["-c", "4096", "-ot", "exps=CPU"], depth)
    k, E = md["expert_used_count"], md["expert_count"]
    trunk = md["block_count"] - md["nextn_predict_layers"]
    run_tensors = [t for t in tensors if layer(t) is None or layer(t) < trunk]  # type: ignore[operator]
    assert any(t["name"] == "blk.0.ffn_up.weight" for t in run_tensors)
    assert any(t["name"].endswith("ffn_up_shexp.weight") for t in run_tensors)
    always = sum(t["nbytes"] for t in run_tensors if not routed(t) and t["name"] != "token_embd.weight")
    experts = sum(t["nbytes"] for t in run_tensors if routed(t)) * k // E
    kv = trunk * depth * md["head_count_kv"] * md["key_length"] * 2 * F16
    assert tr.reads["CUDA0"].weights == always
    assert tr.reads["CUDA0"].kv == kv
    assert tr.reads["CPU"].experts == experts


@pytest.mark.parametrize("depth", [100, 4096])
def test_sliding_window_gpt_oss_20b(depth: int) -> None:
    """gpt-oss: every other layer attends to a window of 128 tokens; expert biases are read for the
    selected experts only, like their matrices."""
    _, md, tensors = manifest("gpt-oss-20b")
    tr = run("gpt-oss-20b", ["-c", "8192", "-ngl", "99"], depth)
    k, E, n_layer = md["expert_used_count"], md["expert_count"], md["block_count"]
    row = md["head_count_kv"] * md["key_length"] * F16 * 2
    window = md["sliding_window"]
    kv = (n_layer // 2) * depth * row + (n_layer // 2) * min(depth, window) * row
    always = sum(t["nbytes"] for t in tensors if not routed(t) and t["name"] != "token_embd.weight")
    assert tr.reads["CUDA0"].json() == {"weights": always, "experts": sum(t["nbytes"] for t in tensors if routed(t))
                                        * k // E, "kv": kv, "recurrent": 0, "total": tr.reads["CUDA0"].total}
    assert copies(tr, "token").keys() == {("CPU", "CUDA0")}  # the embedding row and the inputs, nothing back


def test_recurrent_state_qwen3_next() -> None:
    """Qwen3-Next: three of four layers are gated delta-net layers, each reading its F32 conv and
    delta-net state per token; the fourth attends (KV)."""
    _, md, tensors = manifest("qwen3-next-80b-a3b")
    depth = 1024
    tr = run("qwen3-next-80b-a3b", ["-c", "4096", "-ot", "exps=CPU"], depth)
    hp = md["hparams"]
    n_layer, interval = md["block_count"], hp["full_attention_interval"]
    n_rec = sum(1 for il in range(n_layer) if (il + 1) % interval)
    d_conv, d_inner, d_state, n_group = hp["ssm.conv_kernel"], hp["ssm.inner_size"], hp["ssm.state_size"], \
        hp["ssm.group_count"]
    state = ((d_conv - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner) * F32
    kv = (n_layer - n_rec) * depth * md["head_count_kv"] * md["key_length"] * 2 * F16
    assert (n_rec, state) == (36, 2_195_456)
    assert tr.reads["CUDA0"].recurrent == n_rec * state
    assert tr.reads["CUDA0"].kv == kv
    assert tr.reads["CPU"].experts == sum(t["nbytes"] for t in tensors if routed(t)) * md["expert_used_count"] \
        // md["expert_count"]


def test_kv_in_host_memory_is_read_by_the_cpu() -> None:
    tr = run("qwen3-30b-a3b", ["-c", "4096", "-ngl", "99", "-nkvo"], 4096)
    assert tr.reads["CUDA0"].kv == 0 and tr.reads["CPU"].kv > 0


def test_ik_llama_cpp_is_not_modelled() -> None:
    with pytest.raises(TrafficUnmodelled, match=r"llama\.cpp only"):
        run("qwen3-30b-a3b", ["-c", "4096"], eng="ik_llama.cpp")


def test_depth_beyond_the_context_is_refused() -> None:
    with pytest.raises(ValueError, match="from 0 to the context"):
        run("qwen3-30b-a3b", ["-c", "4096"], 5000)


def test_explain_traffic_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    path, _, _ = manifest("qwen3-30b-a3b")
    argv = ["--", "-c", "4096", "-ot", "exps=CPU"]
    assert main(["explain", path, *argv]) == 0
    assert "traffic" not in capsys.readouterr().out  # only when asked
    assert main(["explain", path, "--traffic", *argv]) == 0
    out = capsys.readouterr().out
    assert "traffic (MiB) per generated token at depth 4,096 (one sequence)" in out
    assert "copied per prompt ubatch of 512 tokens" in out
    assert main(["explain", path, "--json", "--depth", "1000", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["traffic"]["depth"] == 1000
    assert data["traffic"]["prompt"]["op_offload_tensors"] == 141
    assert main(["explain", path, "--depth", "9999", *argv]) == 2
    assert "--depth" in capsys.readouterr().err


def test_a_file_whose_graph_branch_no_dump_checked_has_no_traffic() -> None:
    """Traffic comes from the same graph as compute: a file the graph refuses (here an NVFP4 conversion's
    per-tensor `.scale`, which no recorded dump checked) gets no traffic either (traffic built it before)."""
    import dataclasses

    from moeconf.traffic import unmodelled

    e = engine("llama.cpp")
    argv = ["-c", "4096", "-ngl", "99", "-ot", "exps=CPU"]
    inv = load_inventory(manifest("qwen3-30b-a3b")[0])
    assert unmodelled(explain(inv, e, argv).placement, read_settings(argv, e, {})) is None
    scale = dataclasses.replace(inv.by_name["output_norm.weight"], name="blk.2.ffn_up_exps.scale", layer=2)
    scaled = dataclasses.replace(inv, tensors=(*inv.tensors, scale))
    with pytest.raises(TrafficUnmodelled, match=r"traffic: .*per-tensor scales \(ffn_up_exps"):
        traffic(explain(scaled, e, argv).placement, read_settings(argv, e, {}))


def test_a_fused_op_the_engine_turns_off_unchecked_has_no_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the engine's probe turns off a fused op whose unfused graph no dump checked (fed: DeepSeek-V3.2's
    lightning indexer turned off), compute is refused and so is traffic; with the probe left alone both are given."""
    from moeconf.memory.estimate import estimate
    from moeconf.memory.graph import model

    e = engine("llama.cpp")
    argv = ["-c", "4096", "-ngl", "99", "-ot", "exps=CPU"]
    placement = explain(load_inventory(manifest("deepseek-v3.2")[0]), e, argv).placement
    settings = read_settings(argv, e, {})
    assert traffic(placement, settings).reads and estimate(placement, settings).complete
    monkeypatch.setattr(model, "fused_off", lambda *a: frozenset({"LIGHTNING_INDEXER"}))
    assert not estimate(placement, settings).complete
    with pytest.raises(TrafficUnmodelled, match=r"traffic not modelled for this deepseek32 placement: llama.cpp turns "
                                                r"off its fused LIGHTNING_INDEXER"):
        traffic(placement, settings)


def test_a_norm_without_its_weight_has_no_traffic(tmp_path: Path) -> None:
    """A file lacking a norm weight the graph reads (fed: the tiny Qwen3-Next without blk.1.attn_q_norm, which
    the required-tensor table does not read as required) built build_norm's weightless branch, which no dump
    checked: compute is refused (test_memory_support) and so is traffic."""
    import dataclasses

    from moeconf.fixtures.graphmodels import write_graph_model

    e = engine("llama.cpp")
    argv = ["-c", "4096", "-ngl", "99"]
    inv = load_inventory(write_graph_model("qwen3next", "a", tmp_path / "q3n.gguf"))
    settings = read_settings(argv, e, {})
    assert traffic(explain(inv, e, argv).placement, settings).reads
    lacking = dataclasses.replace(inv, tensors=tuple(t for t in inv.tensors if t.name != "blk.1.attn_q_norm.weight"))
    with pytest.raises(TrafficUnmodelled, match=r"traffic not modelled for this qwen3next file: it lacks a norm weight "
                                                r"the graph reads \(block 1\)"):
        traffic(explain(lacking, e, argv).placement, settings)
