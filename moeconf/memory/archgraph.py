"""What the compute model needs to know about an architecture's graph, read from the tensors its
layers hold instead of from its name (issue 17), so that a new architecture whose layers
hold the same kinds of tensors as a modelled one gets the same model, and one that holds anything
else gets none of the node-by-node replays.

- `moe_replay_spec`: whether `replay.moe_graph` (llama.cpp's standard attention with an optional
  per-head or full-width Q/K norm, a router with an optional selection bias, SwiGLU routed experts,
  an optional shared expert, dense leading layers) is this model's graph on a GPU, and its flags.
- `host_replay_spec`: whether `replay.host_graph` is the host's share when GPUs run every layer and
  the CPU the routed experts of some: the routed experts are separate gate, up and down
  projections, and the graph inputs the GPUs' layers read are the standard attention's.
- `ffn_floats`: the phase model's live FFN set, where ggml-alloc (best fit among the free blocks,
  a tensor freed after its last consumer) puts the down projection's output into the hole the
  gate and up projections leave when it fits there (measured on MiniMax-M2 with routed experts on
  the CPU: 134 MiB where the four tensors side by side would be 158).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from moeconf.memory.geometry import Geometry
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

_HOST: Final = "CPU"

_ROUTED: Final = frozenset({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})

# a layer's tensors in llama.cpp's standard attention + MoE FFN graph (src/models/qwen3moe.cpp,
# glm4-moe.cpp, minimax-m2.cpp; build_attn and build_moe_ffn in src/llama-graph.cpp)
_STANDARD: Final = frozenset({
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
    "ffn_norm", "post_attention_norm", "ffn_gate_inp", "exp_probs_b",
    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
    "ffn_gate", "ffn_up", "ffn_down",
})
# tensors whose graph adds no graph input the host keeps for the GPUs: MLA projections, sinks,
# llama4's and gpt-oss's own (their inputs are handled where `_replayed_host` reads the arch)
_NO_INPUT: Final = _STANDARD | frozenset({
    "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa", "attn_kv_a_norm", "attn_kv_b", "attn_k_b",
    "attn_v_b", "attn_sinks",
})


def _layer_bases(inv: Inventory, n_layer: int) -> set[str]:
    return {t.base for t in inv.tensors if t.layer is not None and t.layer < n_layer}


def _routed_biases(inv: Inventory) -> bool:
    return any(t.base in _ROUTED and t.name.endswith(".bias") for t in inv.tensors)


def moe_replay_spec(inv: Inventory, geo: Geometry) -> tuple[bool, bool] | None:
    """(Q/K norms, selection bias) when `replay.moe_graph` is the model's graph; None otherwise."""
    n_layer = len(geo.layers)
    bases = _layer_bases(inv, n_layer)
    if geo.mla or geo.swa_type != "none" or not bases <= _STANDARD or not bases >= _ROUTED or _routed_biases(inv):
        return None
    return "attn_q_norm" in bases, "exp_probs_b" in bases


def host_replay_spec(inv: Inventory, geo: Geometry) -> bool | None:
    """Whether the routed experts carry biases (each applied in place) when `replay.host_graph`
    is the host's share; None when the layers hold tensors whose graph inputs it does not know."""
    bases = _layer_bases(inv, len(geo.layers))
    if not bases >= _ROUTED or not bases <= _NO_INPUT:
        return None
    return _routed_biases(inv)


def ffn_floats(moe_tensors: int, used: int, n_ff_exp: int, n_embd: int) -> int:
    """Floats per token alive at the routed experts' peak: gate, up, their gated product and the
    down projection's output, the latter in the hole gate and up left when it fits there."""
    ffe = used * n_ff_exp
    down = used * n_embd
    if moe_tensors == 3 and down <= 2 * ffe:
        return 3 * ffe
    return moe_tensors * ffe + down



def cpu_head(placement: Placement, runs: list[tuple[str, int, int]], i: int, n_layer: int,
             routed: Mapping[int, set[str | None]]) -> bool:
    """Whether run `i` (device, first layer, end) is the CPU running layers 0 to end - 1 whole
    (routed experts included) while GPUs run every later layer and the output (a partial -ngl):
    the host's buffer is then its share of `replay.moe_graph` plus the embeddings input, allocated
    and never read with token ids (measured: MiniMax-M2 -ngl 40 and -ngl 30 -ub 2048, exact)."""
    d, first, last = runs[i]
    if d != _HOST or first != 0 or last >= n_layer or any(r[0] == _HOST for r in runs[i + 1:]):
        return False
    if any(routed[il] - {_HOST} for il in range(last)):
        return False
    return placement.devices.get("token_embd.weight") == _HOST


# Architectures for which the engines force flash attention off whatever -fa says (llama.cpp
# src/llama-context.cpp and ik_llama.cpp src/llama.cpp, llama_init_from_model: "flash_attn is not
# compatible with Grok - forcing off"); both then refuse a quantized V cache.
FA_FORCED_OFF: Final = frozenset({"grok"})


def flash_attn_forced_off(arch: str) -> bool:
    return arch in FA_FORCED_OFF



def unmodelled_structure(inv: Inventory) -> list[str]:
    """Layer structures of a modelled architecture the model was not checked on: Grok-2
    style layers holding a dense FFN beside the routed experts (src/models/grok.cpp adds both,
    scaled), checked only on Grok-1's experts-only layers. A number of experts used that differs per
    layer (Nemotron-3 Puzzle's per-layer expert_used_count): the graph's build_moe_ffn takes one for
    every layer."""
    used = inv.metadata.hparam("expert_used_count")
    if isinstance(used, tuple) and len(set(used)) > 1:
        return [f"memory is not modelled for {inv.arch} with experts that differ per layer (a per-layer "
                "expert_used_count): measure this model with llama.cpp's llama-fit-params -fitp on"]
    if inv.arch != "grok":
        return []
    dense = {t.layer for t in inv.tensors if t.base == "ffn_up" and t.layer is not None}
    routed = {t.layer for t in inv.tensors if t.base == "ffn_up_exps" and t.layer is not None}
    if dense & routed:
        return ["memory is not modelled for grok layers with a dense FFN beside the routed experts (Grok-2 style; "
                "checked on Grok-1 only)"]
    return []
