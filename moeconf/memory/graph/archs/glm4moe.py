"""GLM-4.5/4.6/4.7 (src/models/glm4-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(qk_norm="head", ffn_norm="post_attention_norm", gating="sigmoid", gating_key=True,
                      norm_w=False, norm_w_key=True))
MEMORY = Memory(CHECKED + " (GLM-4.5-Air, GLM-4.5, GLM-4.7)",
                frozenset({"leading_dense_block_count", "nextn_predict_layers"}))
