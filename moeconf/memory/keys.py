"""GGUF metadata keys by their effect on memory (a leaf: settings and support both read it)."""

from __future__ import annotations

from typing import Final

# `{arch}.*` keys (after `{arch}.`) that change no device's memory in either engine: rope
# frequencies and scaling, norm epsilons, routing weights and functions, logit and activation
# scales (pinned llama.cpp src/llama-arch.cpp LLM_KV_* names; their uses in src/llama-model.cpp
# are all scalar hyperparameters of the graph). Softcapping is NOT here: Grok's forces flash
# attention off (llama-context.cpp), which changes compute.
SCALARS_ONLY: Final[frozenset[str]] = frozenset({
    "rope.freq_base", "rope.freq_base_swa", "rope.scale_linear", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.alpha", "rope.scaling.attn_factor", "rope.scaling.original_context_length",
    "rope.scaling.finetuned", "rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    "attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon",
    "expert_gating_func", "expert_weights_scale", "expert_weights_norm",
    "attention.scale", "attention.output_scale", "attention.value_scale", "attention.temperature_length",
    "attention.temperature_scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
    "swiglu_clamp_exp", "swiglu_clamp_shexp",
})
