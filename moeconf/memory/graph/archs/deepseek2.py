"""src/models/deepseek2.cpp: MLA or decompressed heads, MoE (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, mla_forms, need, routed
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.keys import MLA_KEYS

MEMORY = Memory(CHECKED + " (DeepSeek-V3, Kimi-K2, Kimi-K2.5)", MLA_KEYS | {"leading_dense_block_count"},
                loader_refuses=mla_forms)


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp, d = g.ctx, g.w, g.hp, g.mla
    inp = g.inp_embd()
    pos = g.inp_pos()
    attn_in = g.attn_inp_k() if d.absorbed else g.attn_inp_kv()
    g.inp_out_ids()
    nope = d.head_k - d.rope
    for il in range(hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        T, n_head = cur.ne[1], hp.n_head[il]
        q = c.reshape(g.mla_q(il, cur), d.head_k, n_head, T)
        kv_cmpr, k_pe = g.mla_kv(il, cur)
        k_pe = c.rope(k_pe, pos)
        if d.absorbed:
            q_nope = c.view(q, (nope, n_head, T), (q.nb[1], q.nb[2]), 0)
            q_pe = c.rope(c.view(q, (d.rope, n_head, T), (q.nb[1], q.nb[2]), 4 * nope), pos)
            q_cur, k_cur, kv_cmpr = g.mla_absorbed(il, q_nope, q_pe, kv_cmpr, k_pe)
            cur = g.attn_k(attn_in, il, w.layer(il, "attn_output"), q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"))
        else:
            kv = c.mul_mat(need(w.layer(il, "attn_kv_b")), kv_cmpr)
            step = 4 * (nope + d.head_v)
            k_nope = c.view(kv, (nope, n_head, T), (step, step * n_head), 0)
            v_cur = c.cont(c.view(kv, (d.head_v, n_head, T), (step, step * n_head), 4 * nope))
            q_cur = c.rope(q, pos)
            k_cur = c.concat(k_nope, c.repeat(k_pe, d.rope, n_head, T, 1), 0)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q_cur, k_cur, v_cur)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)
