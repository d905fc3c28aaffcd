"""src/models/granite-hybrid.cpp (Granite-4.0-H): every layer a Mamba-2 layer (`_mamba.mamba2_layer`)
or an attention layer with RoPE, then Granite's FFN block: the residual scaled and added, the FFN norm,
a dense SwiGLU FFN or a softmax-routed MoE with a gated shared expert, scaled again and added; the
embeddings and the logits scaled where the model has their scales."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import mamba2_layer, unbiased_conv
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits
from moeconf.memory.graph.blocks import GraphContext

ARCH = "granitehybrid"
TRAITS = Traits(recurrent="mamba")
MEMORY = Memory(CHECKED + " (Granite-4.0-H-Small)", unmodelled=unbiased_conv,
                keys=frozenset({"ssm.conv_kernel", "ssm.group_count", "ssm.inner_size", "ssm.state_size",
                                "ssm.time_step_rank"}))


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp = g.inp_embd()
    rs_in = g.rs_inp()
    attn_in = g.attn_inp_kv()
    g.inp_out_ids()
    pos = g.inp_pos()
    res_scale = facts.nonzero("residual_scale")  # Granite scales whenever the value is not 0
    g.groups = facts.groups  # read for every architecture (llama-model.cpp)
    for il in range(g.hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = mamba2_layer(g, rs_in, cur, il)
        else:
            q, k, v = g.qkv(il, cur)
            freqs = w.copy("rope_freqs.weight", il)
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        cur, res = g.out_rows(il, cur, res)
        if res_scale:
            cur = c.scale(cur)
        ffn_inp, cur = g.ffn_input(il, cur, res, rows=False)
        if g.dense(il):
            cur = g.layer_ffn(cur, il)
        else:
            cur = g.add_shexp(g.moe_ffn(cur, il, gating="softmax", norm_w=True, w_scale=facts.w_scale), cur, il)
        if res_scale:
            cur = c.scale(cur)
        inp = c.add(cur, ffn_inp)
    g.output(inp, scale=facts.nonzero("logit_scale"))
