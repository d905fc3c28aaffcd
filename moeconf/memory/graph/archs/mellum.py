"""Mellum (src/models/mellum.cpp): the classic decoder layer with per-head Q/K norms before RoPE and a
softmax-routed MoE whose chosen weights are normalised (scaled where expert_weights_scale is present),
no shared expert. With an attention.sliding_window key the loader sets standard sliding-window attention
(every fourth layer full unless the GGUF's pattern says otherwise) and the graph attends through the
sliding-window cache pair; without it, one KV cache (the template's other instance)."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Facts, Memory, Swa, Traits, decoder
from moeconf.memory.graph.blocks import GraphContext

ARCH = "mellum"
TRAITS = Traits(swa=Swa(pattern=4))
MEMORY = Memory(CHECKED + " (Mellum2-12B-A2.5B)",
                keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern"}))
_ISWA = decoder(Decoder(qk_norm="head", iswa=True))
_KV = decoder(Decoder(qk_norm="head"))


def build(g: GraphContext, facts: Facts) -> None:
    (_ISWA if g.cp.n_kv_swa else _KV)(g, facts)
