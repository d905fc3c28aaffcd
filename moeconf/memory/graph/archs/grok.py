"""Grok (src/models/grok.cpp): softcapped, GELU MoE (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.keys import SOFTCAPPING

MEMORY = Memory(CHECKED + " (Grok-1; flash attention forced off)", SOFTCAPPING)
# llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"
TRAITS = Traits(flash_attn=False)


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    g.kq_softcap = True
    inp, pos, attn_in, _ = g.inputs(scale="embedding_scale" not in facts.units)
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        cur, res = g.out_rows(il, cur, inp)
        cur = g.norm(cur, w.layer(il, "attn_output_norm"), None, il)
        ffn_inp, cur = g.ffn_input(il, cur, res, rows=False)
        moe = g.moe_ffn(cur, il, gating="softmax", norm_w=True, act="gelu")  # no expert_weights_scale read
        if w.layer(il, "ffn_up") is not None:
            moe = c.scale(c.add(g.layer_ffn(cur, il, act="gelu"), moe))
        post = w.layer(il, "layer_output_norm") or w.layer(il, "post_ffw_norm")
        cur = g.norm(moe, post, None, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp, scale=True, softcap="final_logit_softcapping" in facts.floats)
