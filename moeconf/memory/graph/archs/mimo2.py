"""MiMo-V2 (src/models/mimo2.cpp): iSWA with sinks (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits
from moeconf.memory.graph.blocks import GraphContext

# the pattern an array the loader requires (get_arr)
TRAITS = Traits(swa=Swa())


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, pos, full, swa = g.inputs(iswa=True)
    v_scale = "attention.value_scale" in facts.floats
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(g.attn_inp(il, full, swa), il, w.layer(il, "attn_output"), None, q, k, v,
                     sinks=w.layer(il, "attn_sinks"), iswa=True)
        if v_scale:
            cur = c.scale(cur)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.moe_ffn(cur, il, gating="sigmoid", norm_w=True,
                                                                  probs_bias=w.layer(il, "exp_probs_b", "bias"))
        inp = c.add(cur, ffn_inp)
    g.output(inp)


MEMORY = Memory(CHECKED + " (MiMo-V2-Flash)", SWA_KEYS | {"attention.value_scale", "nextn_predict_layers"})
