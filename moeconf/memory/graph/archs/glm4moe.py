"""GLM-4.5/4.6/4.7 (src/models/glm4-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import Decoder, decoder

ARCH = "glm4moe"
build = decoder(Decoder(qk_norm="head", ffn_norm="post_attention_norm", gating="sigmoid", gating_key=True,
                      norm_w=False, norm_w_key=True))
# Memory: not yet. Its tests hold GLM-4.5-Air's figures on the example manifest, which names
# expert_weights_scale without its value, so the graph keeps build_moe_ffn's scale of the weights (the
# engine skips it at 1.0) and its GPU is 0.02 MiB over the engine's 384.28 at -c 8192 -ot exps=CPU (on
# the GGUF, scale 1.0, the graph gives 384.28): the older replay keeps its compute
