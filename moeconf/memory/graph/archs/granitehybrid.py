"""src/models/granite-hybrid.cpp (Granite-4.0-H): every layer a Mamba-2 layer (`_mamba.mamba2_layer`)
or an attention layer with RoPE, then Granite's FFN block: the residual scaled and added, the FFN norm,
a dense SwiGLU FFN or a softmax-routed MoE with a gated shared expert, scaled again and added; the
embeddings and the logits scaled where the model has their scales."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import mamba2_layer
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "granitehybrid"
TRAITS = Traits(recurrent="mamba")
MEMORY = Memory(CHECKED + " (Granite-4.0-H-Small)",
                keys=frozenset({"ssm.conv_kernel", "ssm.group_count", "ssm.inner_size", "ssm.state_size",
                                "ssm.time_step_rank"}))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    rs_in = g.rs_inp(seqs=True)
    attn_in = g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    pos = g.inp_pos()
    res_scale = facts.nonzero("residual_scale")  # Granite scales whenever the value is not 0
    w_scale = "expert_weights_scale" in facts.floats
    g.groups = facts.groups  # read for every architecture (llama-model.cpp)
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = mamba2_layer(g, rs_in, cur, il)
        else:
            q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
            freqs = w.copy("rope_freqs.weight", il)
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        if res_scale:
            cur = c.scale(cur)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il,
                        up_b=w.layer(il, "ffn_up", "bias"), gate_b=w.layer(il, "ffn_gate", "bias"),
                        down_b=w.layer(il, "ffn_down", "bias"))
        else:
            moe = g.moe_ffn(cur, il, gating="softmax", norm_w=True, w_scale=2.0 if w_scale else 0.0, groups=g.groups)
            if w.layer(il, "ffn_up_shexp") is not None:
                moe = c.add(moe, g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"),
                                       w.layer(il, "ffn_down_shexp"), il))
            cur = moe
        if res_scale:
            cur = c.scale(cur)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    logits = g.mm(need(w.get("output.weight")), cur)
    if facts.nonzero("logit_scale"):
        logits = c.scale(logits)
    g.finish(cur, logits)
