"""Cohere2-MoE (src/models/cohere2moe.cpp): the parallel block (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits, routed
from moeconf.memory.graph.blocks import GraphContext

TRAITS = Traits(swa=Swa(pattern=4, dense_first=True))
MEMORY = Memory(CHECKED + " (a Cohere2-MoE 30B-A3B layout)", SWA_KEYS | {"leading_dense_block_count"})


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    rms = "attention.layer_norm_rms_epsilon" in facts.floats
    inp, pos, full, swa = g.inputs(iswa=True)
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il, rms)
        ffn_in = cur
        q, k, v = g.qkv(il, cur)
        if g.swa_layers.get(il) or g.dense(il):  # the dense leading layers take RoPE too
            freqs = w.copy("rope_freqs.weight", il)
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
        attn_out = g.attn(g.attn_inp(il, full, swa), il, w.layer(il, "attn_output"),
                          w.layer(il, "attn_output", "bias"), q, k, v, iswa=True)
        if g.dense(il):
            cur = g.layer_ffn(ffn_in, il)
        else:
            cur = routed(g, facts, ffn_in, il, "sigmoid")
            if w.layer(il, "ffn_up_shexp") is not None:
                cur = c.scale(g.add_shexp(cur, ffn_in, il))
        inp = c.add(c.add(cur, inp), attn_out)
    g.output(inp, rows="after", rms=rms, scale="logit_scale" in facts.floats)  # t_h_nextn
