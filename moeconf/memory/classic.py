"""Memory facts of the "classic" MoE architectures beyond the first five (issue 17, h17classic):
the tied output's second copy of `token_embd` (engines/tied.py), where the logits are computed,
and the graph shape the allocator replays are keyed by (what a layer's graph holds, read from
the model's tensors and keys, never from the architecture's name)."""

from __future__ import annotations

from dataclasses import dataclass

from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

HOST = "CPU"


def output_device(placement: Placement) -> str:
    """The device that computes the logits: the one holding the output matrix (for a tied output,
    the engine's second copy of `token_embd`, or `token_embd` itself where no copy is made)."""
    tied = placement.tied_output()
    if tied is not None:
        return tied
    return placement.devices.get("output.weight") or placement.devices.get("token_embd.weight") or HOST


def tied_output_bytes(placement: Placement) -> tuple[str, int] | None:
    """(device, bytes) of the tied output's second copy, as the model buffer holds it."""
    tied = placement.tied_output()
    if tied is None:
        return None
    return tied, placement.inventory.by_name["token_embd.weight"].nbytes


@dataclass(frozen=True)
class GraphShape:
    """What the allocator replays depend on in a MoE layer's graph (llama-graph.cpp build_moe_ffn
    and the architectures' src/models/<arch>.cpp): per-head Q and K norms before RoPE, a selection
    bias added to the router's probabilities (`exp_probs_b`), the gating function (softmax or
    sigmoid), a fused QKV projection. Architectures whose layers have the same shape build the
    same graph node for node and share a replay."""

    qk_norm: bool
    biased: bool
    sigmoid: bool
    fused_qkv: bool
    wide_input: bool  # the input embedding is wider than n_embd (Qwen3-VL's deepstack)


# the gating function each architecture's graph passes to build_moe_ffn where the file has no
# {arch}.expert_gating_func key (src/models/<arch>.cpp): softmax unless listed
_SIGMOID_DEFAULT = frozenset({"glm4moe", "deepseek2", "dots1"})
_SOFTMAX_FIXED = frozenset({"ernie4_5-moe", "qwen3moe", "qwen3vlmoe", "hunyuan-moe"})


def graph_shape(inv: Inventory) -> GraphShape:
    bases = {t.base for t in inv.tensors}
    gating = inv.metadata.hparam("expert_gating_func")
    if inv.arch in _SOFTMAX_FIXED:
        sigmoid = False
    elif isinstance(gating, int):
        sigmoid = gating == 2
    else:
        sigmoid = inv.arch in _SIGMOID_DEFAULT
    deep = inv.metadata.hparam("n_deepstack_layers")
    return GraphShape(qk_norm="attn_q_norm" in bases, biased="exp_probs_b" in bases, sigmoid=sigmoid,
                      fused_qkv="attn_qkv" in bases, wide_input=isinstance(deep, int) and deep > 0)



_CHECKED = "llama-fit-params -fitp on (llama.cpp 0.3.36) on sparse full-size layouts"
_MAINLINE = frozenset({"llama.cpp"})

# architectures whose memory is modelled (added to support.MODELLED): the `{arch}.*` keys read
# beyond support.NO_MEMORY_EFFECT, the engines, and what they were checked against
CLASSIC_MODELLED: dict[str, tuple[frozenset[str], frozenset[str], str]] = {
    "ernie4_5-moe": (frozenset({"leading_dense_block_count", "interleave_moe_layer_step"}), _MAINLINE,
                     _CHECKED + " (ERNIE-4.5-21B-A3B)"),
    "hunyuan-moe": (frozenset(), _MAINLINE, _CHECKED + " (Hunyuan-A13B)"),
    "bailingmoe2": (frozenset({"leading_dense_block_count", "nextn_predict_layers"}), _MAINLINE,
                    _CHECKED + " (Ling-mini-2.0)"),
    "dots1": (frozenset({"leading_dense_block_count"}), _MAINLINE, _CHECKED + " (dots.llm1)"),
    "qwen3vlmoe": (frozenset({"n_deepstack_layers", "rope.dimension_sections"}), _MAINLINE,
                   _CHECKED + " (Qwen3-VL-30B-A3B)"),
}
