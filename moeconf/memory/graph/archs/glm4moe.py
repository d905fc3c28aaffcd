"""GLM-4.5/4.6/4.7 (src/models/glm4-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import REPLAYED, Decoder, decoder

ARCH = "glm4moe"
build = decoder(Decoder(qk_norm="head", ffn_norm="post_attention_norm", gating="sigmoid", gating_key=True,
                      norm_w=False, norm_w_key=True))
MEMORY = REPLAYED
