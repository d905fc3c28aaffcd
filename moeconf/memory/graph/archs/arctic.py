"""src/models/arctic.cpp: the classic attention, then a dense FFN with its residual, and beside it
the MoE on the layer's input (the attention's input, normed by ffn_norm_exps) added to that."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "arctic"
MEMORY = Memory(CHECKED + " (Snowflake-Arctic)")


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_in = g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k, v)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        ffn_out = c.add(cur, ffn_inp)
        cur = g.norm(res, w.layer(il, "ffn_norm_exps"), None, il)
        cur = g.moe_ffn(cur, il, gating="softmax", norm_w=True)  # its loader reads no expert_weights_scale
        inp = c.add(cur, ffn_out)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))
    del facts
