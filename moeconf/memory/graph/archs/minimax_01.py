"""MiniMax-Text-01 (src/models/minimax-01.cpp): lightning (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, hybrid_inputs, need
from moeconf.memory.graph.blocks import GraphContext, RsInput
from moeconf.memory.graph.ggml import Tensor

ARCH = "minimax-01"
TRAITS = Traits(recurrent="lightning")  # memory/recurrent.py: the layer map and the state's size
MEMORY = Memory(CHECKED + " (MiniMax-Text-01)", keys=frozenset({"residual_scale"}))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    cur, rs_in, attn_in = hybrid_inputs(g)
    pos = g.inp_pos()
    g.inp_out_ids()
    n_head, T = hp.n_head[0], g.n_tokens // rs_in.n_seqs
    # llm_graph_input_la: the slopes, the Q and K decays per token, the diagonal decay per pair of tokens
    decays = (c.input("F32", n_head, name="slopes"),
              c.input("F32", 1, n_head, T, rs_in.n_seqs, name="q_decay_exp"),
              c.input("F32", 1, n_head, T, rs_in.n_seqs, name="k_decay_exp"),
              c.input("F32", T, T, n_head, rs_in.n_seqs, name="diag_decay_exp"))
    for il in range(hp.n_layer):
        cur = g.norm(cur, w.layer(il, "attn_norm"), None, il)
        res = cur
        if il in g.rs:
            cur = _lightning(g, rs_in, decays, cur, il)
        else:
            q, k, v = g.qkv(il, cur)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, c.rope(q, pos), c.rope(k, pos), v)
        cur, res = g.out_rows(il, cur, res)
        cur = g.norm(c.add(cur, c.scale(res)), w.layer(il, "ffn_norm"), None, il)
        cur = c.add(g.moe_ffn(cur, il, gating="softmax", norm_w=True, w_scale=facts.w_scale), c.scale(cur))
    g.output(cur)


def _lightning(g: GraphContext, rs_in: RsInput, decays: tuple[Tensor, ...], cur: Tensor, il: int) -> Tensor:
    c, w, rec = g.ctx, g.w, g.rec
    assert rec is not None
    slopes, q_exp, k_exp, diag_exp = decays
    n_seqs, hd, n_head = rs_in.n_seqs, rec.d_state, rec.n_v_heads
    T = cur.ne[1] // n_seqs
    conv_all, s_all = g.rs[il]
    g.expand(g.rs_states(rs_in, conv_all, rec.n_embd_r))  # the empty conv state, read all the same
    slope_rate = c.scale(slopes)
    cur = c.reshape(cur, cur.ne[0], T, 1, n_seqs)
    qkv = c.reshape(c.unary(g.mm(need(w.layer(il, "attn_qkv")), cur), "silu"), hd * 3, n_head, T, n_seqs)
    q, k, v = (c.view(qkv, (hd, n_head, T, n_seqs), (qkv.nb[1], qkv.nb[2], qkv.nb[3]), i * 4 * hd) for i in range(3))
    kv_old = c.reshape(g.rs_states(rs_in, s_all, rec.n_embd_s), hd, hd, n_head, n_seqs)
    q_decay, k_decay, diag_decay = (c.unary(c.scale(x), "exp") for x in (q_exp, k_exp, diag_exp))
    none_diag = c.mul_mat(kv_old, c.permute(c.mul(q, q_decay), 0, 2, 1, 3))
    qk = c.mul(c.mul_mat(c.permute(k, 0, 2, 1, 3), c.permute(q, 0, 2, 1, 3)), diag_decay)
    v_trans = c.cont(c.permute(v, 1, 2, 0, 3))
    out = c.add(none_diag, c.mul_mat(v_trans, qk))
    g.expand(out)
    block_decay = c.reshape(c.unary(c.scale(slope_rate), "exp"), 1, 1, n_head)
    kv_old_s = c.mul(kv_old, block_decay)
    kv_cur = c.mul_mat(c.cont(c.permute(c.mul(k, k_decay), 1, 2, 0, 3)), v_trans)
    g.expand(c.cpy(c.add(kv_old_s, kv_cur), c.view(s_all, (rec.n_embd_s * n_seqs,), (), 0)))
    out = c.reshape(c.cont(c.permute(out, 0, 2, 1, 3)), hd * n_head, T, 1, n_seqs)
    out = g.norm(out, w.layer(il, "attn_norm_2"), None, il)
    out = c.mul(c.unary(g.mm(need(w.layer(il, "attn_gate")), cur), "sigmoid"), out)
    out = g.mm(need(w.layer(il, "attn_output")), out)
    return c.reshape(out, out.ne[0], T * n_seqs)
