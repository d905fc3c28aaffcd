"""src/models/deepseek2.cpp: the low-rank Q (or a plain Q on the lite models) and the compressed
KV; with MLA (key_length_mla in the GGUF) the absorbed queries against the latent K-only cache
(V a view of it, decompressed by wv_b), else the decompressed heads through a full KV cache; then
dense leading layers or the MoE with its shared expert."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import GATING, REPLAYED, Decoder, Facts, moe_shared, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "deepseek2"
MEMORY = REPLAYED


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    d = g.mla
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_in = g.attn_inp_k() if d.absorbed else g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    gating = GATING.get(facts.gating or 0, "softmax")
    g.groups = facts.groups
    nope = d.head_k - d.rope
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        T, n_head = cur.ne[1], hp.n_head[il]
        if w.layer(il, "attn_q") is None:
            q = c.mul_mat(need(w.layer(il, "attn_q_a")), cur)
            q = g.norm(q, w.layer(il, "attn_q_a_norm"), None, il)
            q = c.mul_mat(need(w.layer(il, "attn_q_b")), q)
        else:
            q = c.mul_mat(need(w.layer(il, "attn_q")), cur)
        q = c.reshape(q, d.head_k, n_head, T)
        kv_pe = c.mul_mat(need(w.layer(il, "attn_kv_a_mqa")), cur)
        row = kv_pe.nb[1]
        kv_cmpr = c.view(kv_pe, (d.kv_lora_rank, T), (row,), 0)
        k_pe = c.view(kv_pe, (d.rope, 1, T), (row, row), 4 * d.kv_lora_rank)
        k_pe = c.rope(k_pe, pos)
        kv_cmpr = g.norm(kv_cmpr, w.layer(il, "attn_kv_a_norm"), None, il)
        if d.absorbed:
            q_nope = c.view(q, (nope, n_head, T), (q.nb[1], q.nb[2]), 0)
            q_pe = c.rope(c.view(q, (d.rope, n_head, T), (q.nb[1], q.nb[2]), 4 * nope), pos)
            absorbed = c.permute(c.mul_mat(need(w.layer(il, "attn_k_b")), c.permute(q_nope, 0, 2, 1, 3)), 0, 2, 1, 3)
            q_cur = c.concat(absorbed, q_pe, 0)
            kv_cmpr = c.reshape(kv_cmpr, d.kv_lora_rank, 1, T)
            k_cur = c.concat(kv_cmpr, k_pe, 0)
            cur = g.attn_k(attn_in, il, w.layer(il, "attn_output"), q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"))
        else:
            kv = c.mul_mat(need(w.layer(il, "attn_kv_b")), kv_cmpr)
            step = 4 * (nope + d.head_v)
            k_nope = c.view(kv, (nope, n_head, T), (step, step * n_head), 0)
            v_cur = c.cont(c.view(kv, (d.head_v, n_head, T), (step, step * n_head), 4 * nope))
            q_cur = c.rope(q, pos)
            k_cur = c.concat(k_nope, c.repeat(k_pe, d.rope, n_head, T, 1), 0)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q_cur, k_cur, v_cur)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        else:
            cur = moe_shared(g, Decoder(), il, cur, gating, bool(facts.norm_w), "expert_weights_scale" in facts.floats)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, c.mul_mat(need(w.get("output.weight")), cur))
