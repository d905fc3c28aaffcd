"""src/models/kimi-linear.cpp: KDA layers (Kimi delta attention: Q, K and V each projected and run
through its own causal conv with its slice of the conv state, the per-channel decay gate g1 and the
beta from their projections, the L2-normed Q and K through the fused gated delta-net op, its new
state copied back, the output RMS-normed and gated by a sigmoid of g2) and MLA layers without RoPE
(absorbed against the latent K-only cache where the GGUF has key_length_mla, else decompressed
heads through a full KV cache); dense leading layers, then a MoE with a selection bias and an
ungated shared expert."""

from __future__ import annotations

from moeconf.memory.graph.archs._deltanet import delta_net, short_conv
from moeconf.memory.graph.archs.common import REPLAYED, Facts, Traits, need, routed
from moeconf.memory.graph.blocks import AttnInput, GraphContext, RsInput
from moeconf.memory.graph.ggml import Tensor

ARCH = "kimi-linear"
TRAITS = Traits(recurrent="kda")
MEMORY = REPLAYED


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd()
    rs_in = g.rs_inp()  # build_inp_mem_hybrid(_k): the states' indices, then the cache's inputs
    attn_in = g.attn_inp_k() if g.mla.absorbed else g.attn_inp_kv()
    g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        g.expand(cur)
        cur = _kda(g, rs_in, cur, il) if il in g.rs else _mla(g, attn_in, cur, il)
        ffn_inp, cur = g.ffn_input(il, cur, res)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il, norm_w=True), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)


def _kda(g: GraphContext, rs_in: RsInput, cur: Tensor, il: int) -> Tensor:
    """The KDA layer (the fused gated delta-net op, no rollback snapshots)."""
    c, w, hp = g.ctx, g.w, g.hp
    n_head, n_seqs = hp.n_head[il], rs_in.n_seqs
    T = cur.ne[1] // n_seqs
    o_norm = need(w.layer(il, "ssm_norm"))
    head_dim = o_norm.ne[0]
    d_inner = head_dim * n_head
    conv_all, ssm_all = g.rs[il]
    g.cb(conv_all, "conv_states_all", il)  # the engine names the cache's own tensor
    conv_state = g.rs_states(rs_in, conv_all, conv_all.ne[0])
    qkv_in: list[tuple[Tensor, Tensor | None]] = [(cur, w.layer(il, b)) for b in ("attn_q", "attn_k", "attn_v")]
    wqkv = w.layer(il, "attn_qkv")
    if wqkv is not None:
        qkv = c.mul_mat(wqkv, cur)
        qkv_in = [(c.cont(c.view(qkv, (d_inner, cur.ne[1]), (qkv.nb[1],), i * d_inner * 4)), None) for i in range(3)]
    q, k, v = (short_conv(g, conv_all, conv_state, i, x, proj, need(w.layer(il, f"ssm_conv1d_{n}")), head_dim,
                            n_head, n_seqs)
               for i, ((x, proj), n) in enumerate(zip(qkv_in, "qkv", strict=True)))
    g1 = c.mul_mat(need(w.layer(il, "ssm_f_b")), c.mul_mat(need(w.layer(il, "ssm_f_a")), cur))
    g1 = c.reshape(c.unary(c.add(g1, need(w.layer(il, "ssm_dt", "bias"))), "softplus"), head_dim, n_head, cur.ne[1])
    g1 = c.mul(g1, c.reshape(need(w.get(f"blk.{il}.ssm_a")), 1, n_head, 1))
    g1 = c.reshape(g1, head_dim, n_head, T, n_seqs)
    beta = c.reshape(c.mul_mat(need(w.layer(il, "ssm_beta")), cur), 1, n_head, T, n_seqs)
    beta = c.unary(beta, "sigmoid")
    cur3 = c.reshape(cur, cur.ne[0], T, n_seqs)
    state = c.reshape(g.rs_states(rs_in, ssm_all, ssm_all.ne[0]), head_dim, head_dim, n_head, n_seqs)
    q, k = c.scale(c.rms_norm(q)), c.scale(c.rms_norm(k))  # build_gdn_l2_norm
    output = c.cont(delta_net(g, q, k, v, g1, beta, state, ssm_all, flat=True))
    cur2 = c.reshape(cur3, cur3.ne[0], T * n_seqs)
    g2 = c.mul_mat(need(w.layer(il, "ssm_g_b")), c.mul_mat(need(w.layer(il, "ssm_g_a")), cur2))
    g2 = c.reshape(g2, head_dim, n_head, T * n_seqs)
    normed = g.norm(c.reshape(output, head_dim, n_head, T * n_seqs), o_norm, None, il)
    gated = c.cont(c.mul(normed, c.unary(g2, "sigmoid")), d_inner, T * n_seqs)
    return c.mul_mat(need(w.layer(il, "attn_output")), gated)


def _mla(g: GraphContext, attn_in: AttnInput, cur: Tensor, il: int) -> Tensor:
    """The MLA layer, no RoPE on either side."""
    c, w, hp = g.ctx, g.w, g.hp
    d = g.mla
    T, n_head = cur.ne[1], hp.n_head[il]
    nope = d.head_k - d.rope
    q = c.mul_mat(need(w.layer(il, "attn_q")), cur)
    kv_cmpr, k_pe = g.mla_kv(il, cur)
    if d.absorbed:
        q_cur, k_cur, kv_cmpr = g.mla_absorbed(il, *g.mla_q_parts(q, n_head), kv_cmpr, k_pe)
        return g.attn_k(attn_in, il, w.layer(il, "attn_output"), q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"))
    q = c.reshape(q, d.head_k, n_head, T)
    kv = c.mul_mat(need(w.layer(il, "attn_kv_b")), kv_cmpr)
    step = 4 * (nope + d.head_v)
    k_nope = c.view(kv, (nope, n_head, T), (step, step * n_head), 0)
    v_cur = c.cont(c.view(kv, (d.head_v, n_head, T), (step, step * n_head), 4 * nope))
    k_cur = c.concat(c.repeat(k_pe, d.rope, n_head, T), k_nope, 0)
    return g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k_cur, v_cur)
