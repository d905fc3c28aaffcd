"""LFM2-MoE (src/models/lfm2moe.cpp): short convolutions (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, hybrid_inputs, need
from moeconf.memory.graph.blocks import GraphContext, RsInput
from moeconf.memory.graph.ggml import Tensor

MEMORY = Memory(CHECKED + " (LFM2-8B-A1B)", keys=frozenset({"shortconv.l_cache", "leading_dense_block_count"}))


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    cur, rs_in, attn_in = hybrid_inputs(g)
    pos = g.inp_pos()
    g.inp_out_ids()
    for il in range(g.hp.n_layer):
        prev = cur
        cur = g.norm(cur, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = _shortconv(g, rs_in, cur, il)
        else:
            q, k, v = g.qkv(il, cur)
            q, k = g.qk_norm(il, q, k)
            q, k = c.rope(q, pos), c.rope(k, pos)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k, v)
        cur, prev = g.out_rows(il, cur, prev)
        cur = c.add(prev, cur)
        ffn_in = g.norm(cur, w.layer(il, "ffn_norm"), None, il)
        if g.dense(il):
            out = g.layer_ffn(ffn_in, il)
        else:
            out = g.moe_ffn(ffn_in, il, gating=facts.gating_or("softmax"), norm_w=True,
                            probs_bias=w.layer(il, "exp_probs_b", "bias"))
        cur = c.add(cur, out)
    g.output(cur, norm="token_embd_norm")  # OUTPUT_NORM_LFM2


def _shortconv(g: GraphContext, rs_in: RsInput, cur: Tensor, il: int) -> Tensor:
    """build_shortconv_block (causal; no rollback snapshots: one conv state written)."""
    c, w, hp, rec = g.ctx, g.w, g.hp, g.rec
    assert rec is not None
    n_seqs = rs_in.n_seqs
    T = cur.ne[1] // n_seqs
    d_conv = rec.d_conv - 1
    cur = c.reshape(cur, cur.ne[0], T, n_seqs)
    bcx = g.mm(need(w.layer(il, "shortconv.in_proj")), cur)
    chunk = bcx.ne[0] // 3
    b, cc, x = (c.view(bcx, (chunk, bcx.ne[1], bcx.ne[2]), (bcx.nb[1], bcx.nb[2]), i * chunk * 4) for i in range(3))
    bx = c.transpose(c.mul(b, x))
    conv_all, _ = g.rs[il]
    conv = c.reshape(g.rs_states(rs_in, conv_all, rec.n_embd_r), d_conv, hp.n_embd, n_seqs)
    bx = c.concat(conv, bx, 0)
    snap = c.view(bx, (d_conv, bx.ne[1], bx.ne[2]), (bx.nb[1], bx.nb[2]), (bx.ne[0] - d_conv) * 4)
    g.expand(c.cpy(snap, c.view(conv_all, (d_conv * hp.n_embd, n_seqs), (conv_all.nb[1],), 0)))
    out = c.ssm_conv(bx, need(w.layer(il, "shortconv.conv")))
    y = g.mm(need(w.layer(il, "shortconv.out_proj")), c.mul(cc, out))
    return c.reshape(y, y.ne[0], T * n_seqs)
