"""src/models/jamba.cpp: every layer a Mamba-1 layer (`_mamba.mamba_layer`, its dt, B and C RMS-normed)
or an attention layer without RoPE; the residual added (the layer's input first), the FFN norm, a
dense SwiGLU FFN or a softmax-routed MoE whose chosen weights are not normalised, the residual added."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import mamba_layer
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "jamba"
# Mamba-1: its loader reads no ssm.group_count
TRAITS = Traits(recurrent="mamba")
MEMORY = Memory(CHECKED + " (Jamba-Mini-1.5)",
                keys=frozenset({"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank"}))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    rs_in = g.rs_inp(seqs=True)
    attn_in = g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    w_scale = "expert_weights_scale" in facts.floats
    g.groups = facts.groups  # read for every architecture (llama-model.cpp)
    for il in range(hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = mamba_layer(g, rs_in, cur, il)
        else:
            q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k, v)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            inp = c.get_rows(inp, out_ids)
        ffn_inp = c.add(inp, cur)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        else:
            cur = g.moe_ffn(cur, il, gating="softmax", norm_w=False, w_scale=2.0 if w_scale else 0.0,
                            groups=g.groups)
        inp = c.add(ffn_inp, cur)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))
