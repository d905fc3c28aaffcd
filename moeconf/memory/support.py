"""What the memory model covers, as data: per architecture, the GGUF keys whose memory effect it
models, the engines it was checked against, and the cases it refuses.

Memory is only ever printed as a number when the model's architecture is in `MODELLED` and every
`{arch}.*` key of the file is one it models (`keys`) or one with no effect on any device's memory
(`NO_MEMORY_EFFECT`). Anything else makes the estimate incomplete with a note naming the
architecture or the key (`unmodelled`): `explain` prints the note, `fit` and fill rules refuse.
A clear "not modelled for X" beats a confident wrong number: a new architecture's recurrent
state, indexer cache or tied output would otherwise be silently left out.

Adding an architecture: model what its memory classes allocate (`llama-memory-*.cpp`, its
`src/models/<arch>.cpp` graph), check it against `llama-fit-params -fitp on` on a sparse
full-size layout of a real model (tests/engine/test_memory_oracle.py), then list it here with
the keys it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from moeconf.memory import ikarchs as _ikarchs
from moeconf.memory import recurrent as _recurrent
from moeconf.memory.classic import CLASSIC_MODELLED, CLASSIC_REFUSED
from moeconf.model.inventory import Inventory

# `{arch}.*` keys (after `{arch}.`) that change no device's memory in either engine: rope
# frequencies and scaling, norm epsilons, routing weights and functions, logit and activation
# scales (pinned llama.cpp src/llama-arch.cpp LLM_KV_* names; their uses in src/llama-model.cpp
# are all scalar hyperparameters of the graph). Softcapping is NOT here: Grok's forces flash
# attention off (llama-context.cpp), which changes compute.
NO_MEMORY_EFFECT: Final[frozenset[str]] = frozenset({
    "rope.freq_base", "rope.freq_base_swa", "rope.scale_linear", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.alpha", "rope.scaling.attn_factor", "rope.scaling.original_context_length",
    "rope.scaling.finetuned", "rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    "attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon",
    "expert_gating_func", "expert_weights_scale", "expert_weights_norm",
    "attention.scale", "attention.output_scale", "attention.value_scale", "attention.temperature_length",
    "attention.temperature_scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
    "swiglu_clamp_exp", "swiglu_clamp_shexp",
    # sizes the model reads from the tensors' shapes instead
    "feed_forward_length", "expert_feed_forward_length", "expert_shared_feed_forward_length",
    # what every modelled architecture reads
    "block_count", "context_length", "embedding_length", "vocab_size", "expert_count", "expert_used_count",
    "expert_shared_count", "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "rope.dimension_count",
})

_MLA: Final = frozenset({"attention.key_length_mla", "attention.value_length_mla", "attention.kv_lora_rank",
                         "attention.q_lora_rank"})
_SWA: Final = frozenset({"attention.sliding_window", "attention.sliding_window_pattern"})

# gated delta-net hybrids (moeconf/memory/recurrent.py)
_RECURRENT: Final = _recurrent.KEYS
_MAINLINE: Final = frozenset({"llama.cpp"})
_BOTH: Final = frozenset({"llama.cpp", "ik_llama.cpp"})
_CHECKED = "llama-fit-params -fitp on (llama.cpp 0.3.36) on sparse full-size layouts"


@dataclass(frozen=True)
class ArchMemory:
    """An architecture whose memory is modelled: the keys (beyond `NO_MEMORY_EFFECT`) it reads,
    the engines it is modelled for, and what it was checked against."""

    keys: frozenset[str]
    engines: frozenset[str]
    checked: str


MODELLED: Final[dict[str, ArchMemory]] = {
    "qwen3moe": ArchMemory(frozenset(), _BOTH, _CHECKED + " (Qwen3-30B-A3B, Qwen3-235B-A22B)"),
    "glm4moe": ArchMemory(frozenset({"leading_dense_block_count", "nextn_predict_layers"}), _BOTH,
                          _CHECKED + " (GLM-4.5-Air, GLM-4.5)"),
    "deepseek2": ArchMemory(_MLA | {"leading_dense_block_count"}, _BOTH,
                            _CHECKED + " (DeepSeek-V3, Kimi-K2)"),
    "gpt-oss": ArchMemory(_SWA, _BOTH, _CHECKED + " (gpt-oss-20b, gpt-oss-120b)"),
    "llama4": ArchMemory(_SWA | {"interleave_moe_layer_step"}, _BOTH, _CHECKED + " (Llama-4-Maverick)"),
    "qwen35moe": ArchMemory(_RECURRENT, _MAINLINE, _CHECKED + " (Qwen3.5-397B-A17B, Qwen3.5-35B-A3B)"),
    "qwen3next": ArchMemory(_RECURRENT, _MAINLINE, _CHECKED + " (Qwen3-Next-80B-A3B)"),
    # checked on llama.cpp only (ik_llama.cpp's graphs for them not compared)
    "minimax-m2": ArchMemory(frozenset(), frozenset({"llama.cpp"}), _CHECKED + " (MiniMax-M2)"),
    # Grok's attention and router softcapping run whatever their values (src/llama-graph.cpp builds
    # Grok's tanh unconditionally); final_logit_softcapping adds ops on the logits: not read
    "grok": ArchMemory(frozenset({"attn_logit_softcapping", "router_logit_softcapping"}), frozenset({"llama.cpp"}),
                       _CHECKED + " (Grok-1; flash attention forced off)"),
}
# the classic MoEs checked within tolerance (memory/classic.py)
MODELLED.update({a: ArchMemory(*spec) for a, spec in CLASSIC_MODELLED.items()})


# Architectures measured or read and refused, with the whole reason `unmodelled` gives: what the
# engine allocates that moeconf does not model (memory/classic.py, memory/recurrent.py)
REFUSED: Final[dict[str, str]] = {
    **CLASSIC_REFUSED,
    **{arch: (f"memory is not modelled for the {arch!r} architecture: {detail}. KV cache and compute are not "
              "computed, and weights are only the file's tensors as placed")
       for arch, detail in _recurrent.NOT_MODELLED.items()},
    # DSA: KV cache modelled (memory/indexer.py), the indexer's compute not
    **{arch: (f"memory is not modelled for {arch!r}: its KV cache is (the MLA latent and the lightning indexer's K "
              "cache, moeconf.memory.indexer), but the compute of the DSA indexer (its scores, the sparse-attention "
              "mask built from the top-k, measured 200-2,700 MiB over the MLA graph) is not: KV cache and compute "
              "are not computed")
       for arch in ("deepseek32", "glm-dsa")},
}


def unmodelled(inv: Inventory, engine: str) -> list[str]:
    """Why this model's memory on `engine` is not modelled (empty: it is): its architecture, or
    each `{arch}.*` key of the file the model does not read and that may change memory."""
    arch = inv.arch
    # --- ik_llama.cpp on the newer architectures: weights and KV modelled, compute not (the
    # estimate leaves compute "?" with memory/ikarchs.py's note, and fit refuses) ---
    if _ikarchs.kv_only(arch, engine):
        from moeconf.memory.archgraph import unmodelled_structure as _structure
        return _ikarchs.unmodelled(inv, NO_MEMORY_EFFECT) + _structure(inv)
    # ---
    spec = MODELLED.get(arch)
    if spec is None:
        if arch in REFUSED:
            return [REFUSED[arch]]
        return [f"memory is not modelled for the {arch!r} architecture (modelled: {', '.join(sorted(MODELLED))}): "
                "KV cache and compute are not computed, and weights are only the file's tensors as placed"]
    if engine not in spec.engines:
        return [f"memory is not modelled for {arch!r} on {engine}"]
    keys = inv.metadata.arch_keys or ()
    unknown = [k for k in keys if k not in NO_MEMORY_EFFECT and k not in spec.keys]
    if unknown:
        return [f"memory is not modelled for {arch}.{k} (a key moeconf does not read for {arch})" for k in unknown]
    from moeconf.memory.archgraph import unmodelled_structure
    return unmodelled_structure(inv)
