"""GGUF metadata keys by their effect on memory (a leaf: settings and support both read it): those
below are modelled for every architecture among the keys its loader reads (the generated
moeconf/engines/archkeys.py); docs/memory-architectures.md, "Keys each architecture's loader reads"."""

from __future__ import annotations

from typing import Final

from moeconf.engines import archkeys
from moeconf.model.inventory import Inventory

# `{arch}.*` keys (after `{arch}.`) that change no device's memory in either engine (see the module's docs section)
SCALARS_ONLY: Final[frozenset[str]] = frozenset({
    "rope.freq_base", "rope.freq_base_swa", "rope.scale_linear", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.alpha", "rope.scaling.attn_factor", "rope.scaling.original_context_length",
    "rope.scaling.finetuned", "rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    "attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon",
    "expert_gating_func", "expert_weights_scale", "expert_weights_norm",
    "attention.scale", "attention.output_scale", "attention.value_scale", "attention.temperature_length",
    "attention.temperature_scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
})
# group-limited routing: llama.cpp reads the groups for every architecture and builds the group selection in
# build_moe_ffn only when expert_group_count > 1 (the graph's `_compose` sets them on every composition)
GROUPS: Final = frozenset({"expert_group_count", "expert_group_used_count"})
# `{arch}.*` keys the memory model handles for every architecture: the scalars above, the expert groups, and the
# sizes it reads
NO_MEMORY_EFFECT: Final[frozenset[str]] = SCALARS_ONLY | GROUPS | frozenset({
    # sizes the model reads from the tensors' shapes instead
    "feed_forward_length", "expert_feed_forward_length", "expert_shared_feed_forward_length",
    # what every modelled architecture reads
    "block_count", "context_length", "embedding_length", "vocab_size", "expert_count", "expert_used_count",
    "expert_shared_count", "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "rope.dimension_count",
})
# what the architectures with MLA attention read beyond them (support.MODELLED, ikarchs.KV_ONLY)
MLA_KEYS: Final = frozenset({"attention.key_length_mla", "attention.value_length_mla", "attention.kv_lora_rank",
                             "attention.q_lora_rank"})
# Grok's softcapping: it changes compute only, and forces flash attention off (support.MODELLED)
SOFTCAPPING: Final = frozenset({"attn_logit_softcapping", "router_logit_softcapping", "final_logit_softcapping"})


def read_by_loader(arch: str, engine: str) -> frozenset[str] | None:
    """The `{arch}.*` keys the pinned engine's loader reads for `arch` (None: no table, so every key counts as read)."""
    return (archkeys.MAINLINE if engine == "llama.cpp" else archkeys.IK).get(arch)


def int_key(inv: Inventory, key: str) -> int | None:
    """The file's `{arch}.key` when it is one integer (None: absent, or a per-layer array)."""
    v = inv.metadata.hparam(key)
    return v if isinstance(v, int) else None


def neutral(key: str, inv: Inventory) -> bool:
    """Whether the file's `{arch}.key` makes the engine build nothing more (see the module's docs section)."""
    return (key in ("nextn_predict_layers", "attention.shared_kv_layers", "embedding_length_per_layer_input")
            and int_key(inv, key) == 0)
