"""What the refusals and the graph need to know about a model's layers, read from the tensors they hold
instead of from its name where they can (issue 17): whether they are the standard attention + MoE
layer, on which a setting family was checked (`standard_moe_layers`, memory/families.py), the
layer structures the model was not checked on (`unmodelled_structure`), where the logits are computed
(`output_device`: a tied output's second copy of `token_embd`, engines/tied.py) and the graph's input width."""

from __future__ import annotations

from typing import Final

from moeconf.engines import HOST
from moeconf.memory.geometry import Geometry
from moeconf.memory.keys import int_key
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

_ROUTED: Final = frozenset({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
# a layer's tensors in llama.cpp's standard attention + MoE FFN graph (src/models/qwen3moe.cpp,
# glm4-moe.cpp, minimax-m2.cpp; build_attn and build_moe_ffn in src/llama-graph.cpp)
_STANDARD: Final = frozenset({
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
    "ffn_norm", "post_attention_norm", "ffn_gate_inp", "exp_probs_b",
    "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
    "ffn_gate", "ffn_up", "ffn_down",
})


def standard_moe_layers(inv: Inventory, geo: Geometry) -> bool:
    """Whether every layer is the standard attention + MoE layer (separate Q, K, V; optional Q/K norms, selection
    bias, shared expert, dense leading layers; routed experts without biases; no sliding window, no MLA): the
    layers whose figures with routed experts and the output on the CPU over several GPUs were checked
    (Qwen3-30B-A3B, GLM-4.5-Air, MiniMax-M2 at -ub 512 to 4096: memory/families.py)."""
    bases = {t.base for t in inv.tensors if t.layer is not None and t.layer < len(geo.layers)}
    biased = any(t.base in _ROUTED and t.name.endswith(".bias") for t in inv.tensors)
    return not (geo.mla or geo.swa_type != "none" or biased) and _ROUTED <= bases <= _STANDARD


def unmodelled_structure(inv: Inventory) -> list[str]:
    """Layer structures of a modelled architecture the model was not checked on
    (docs/memory.md, "What the estimate follows of the engines")."""
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


def output_device(placement: Placement) -> str:
    """The device that computes the logits: the one holding the output matrix (for a tied output,
    the engine's second copy of `token_embd`, or `token_embd` itself where no copy is made)."""
    devices = placement.devices
    return placement.tied_output() or devices.get("output.weight") or devices.get("token_embd.weight") or HOST


def input_width(inv: Inventory, n_embd: int) -> int:
    """The graph's input embedding width (llama_hparams::n_embd_inp): Qwen3-VL's deepstack adds
    n_embd per deepstack layer (the vision features the first layers add back)."""
    return n_embd * (1 + (int_key(inv, "n_deepstack_layers") or 0))
