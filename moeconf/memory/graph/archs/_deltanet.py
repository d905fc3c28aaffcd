"""The gated delta-net layers (Qwen3-Next, Qwen3.5-MoE, Qwen4Exp) and what KDA's layers share (Kimi-Linear,
Ling 3.0, Kimi-K3, GLM-5.3-Flash) (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import conv_input
from moeconf.memory.graph.archs.common import Build, Facts, blocks_without, need
from moeconf.memory.graph.blocks import AttnInput, GraphContext, RsInput
from moeconf.memory.graph.ggml import Tensor

# Qwen3-Next's older conversions: one ssm_in projection (split into Q, K, V and Z by views) in place of attn_qkv
# and attn_gate, which its loader still takes (src/models/qwen3next.cpp, TENSOR_NOT_REQUIRED) and no recorded dump
# has (a composition's `Memory.unmodelled`)
older_qkvz = blocks_without("ssm_in", ("attn_qkv.weight",), "Qwen3-Next's older fused QKVZ projection, split "
                            "into Q, K, V and Z by views; the pinned converter writes attn_qkv and attn_gate")


def delta_net_hybrid(qwen35: bool) -> Build:
    def build(g: GraphContext, facts: Facts) -> None:
        c, w = g.ctx, g.w
        inp = g.inp_embd()
        attn_in = g.attn_inp_kv()
        rs_in = g.rs_inp()
        pos = g.inp_pos(4 if qwen35 else 1)
        g.inp_out_ids()
        for il in range(g.hp.n_layer):
            res = inp
            cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
            g.expand(cur)
            if il in g.rs:
                cur = delta_net_layer(g, rs_in, cur, il, repeat=not qwen35)
            else:
                cur = gated_attn_layer(g, attn_in, cur, pos, il, reshape=not qwen35)
            ffn_res, cur = g.ffn_input(il, cur, res, rows=False, norm="post_attention_norm")
            inp = c.add(gated_shexp_moe(g, cur, il), ffn_res)
        g.output(inp, rows="after")  # t_h_nextn

    return build


def gated_shexp_moe(g: GraphContext, cur: Tensor, il: int) -> Tensor:
    """The softmax-routed experts (weights normalised) plus, where the layer has one, the shared expert times
    a sigmoid gate of the input (ffn_gate_inp_shexp)."""
    c = g.ctx
    moe = g.moe_ffn(cur, il, gating="softmax", norm_w=True)
    if g.w.layer(il, "ffn_up_shexp") is None:
        return moe
    sh = g.layer_ffn(cur, il, part="_shexp")
    gate = c.unary(g.mm(need(g.w.layer(il, "ffn_gate_inp_shexp")), cur), "sigmoid")
    return c.add(moe, c.mul(sh, gate))


def mm_where(g: GraphContext, w: Tensor | None, x: Tensor) -> Tensor:
    """`x` projected by `w` where the layer has that weight, else `x` itself."""
    return x if w is None else g.mm(w, x)


def conv_state_at(g: GraphContext, rs_in: RsInput, conv_all: Tensor, x: Tensor, cols: int, channels: int) -> Tensor:
    """Qwen4Exp's build_conv_state_at: the row gathered whole, `x` appended along the tokens, the last `cols`
    columns copied back (one rollback slot)."""
    c = g.ctx
    n_seqs = rs_in.n_seqs
    rows = g.rs_states(rs_in, conv_all, conv_all.ne[0])
    conv_in = c.concat(c.reshape(rows, cols, channels, n_seqs), c.transpose(x), 0)
    tail = c.view(conv_in, (cols, channels, n_seqs), (conv_in.nb[1], conv_in.nb[2]), 4 * (conv_in.ne[0] - cols))
    g.expand(c.cpy(c.cont(tail), c.view(conv_all, (cols * channels, n_seqs), (conv_all.nb[1],), 0)))
    return conv_in


def short_conv(g: GraphContext, conv_all: Tensor, conv_state: Tensor, part: int, x: Tensor, proj: Tensor | None,
               kernel: Tensor, head_dim: int, n_head: int, n_seqs: int) -> Tensor:
    """KDA's causal_conv1d: Q, K or V (`part` 0, 1, 2) projected by `proj` (x itself where None), its slice of
    the conv state's rows prepended, the last d_conv - 1 columns copied back as the new state (one
    snapshot: no rollback), SSM_CONV, SiLU; per head."""
    c = g.ctx
    d_conv, d_inner = kernel.ne[0], head_dim * n_head
    T = x.ne[1] // n_seqs  # n_seq_tokens
    size, n_embd_r = (d_conv - 1) * d_inner, conv_all.ne[0]

    def own(t: Tensor) -> Tensor:
        return c.view(t, (d_conv - 1, d_inner, n_seqs), (4 * (d_conv - 1), 4 * n_embd_r), 4 * part * size)

    x3 = c.reshape(g.mm(proj, x) if proj is not None else x, d_inner, T, n_seqs)
    conv_x = c.concat(own(conv_state), c.transpose(x3), 0)
    last = c.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]), T * conv_x.nb[0])
    g.expand(c.cpy(last, own(conv_all)))
    out = c.ssm_conv(conv_x, c.reshape(kernel, d_conv, d_inner))
    out = c.unary(c.reshape(out, d_inner, T * n_seqs), "silu")
    return c.reshape(out, head_dim, n_head, T, n_seqs)


def delta_net(g: GraphContext, q: Tensor, k: Tensor, v: Tensor, gate: Tensor, beta: Tensor, state: Tensor,
              ssm_all: Tensor, flat: bool = False) -> Tensor:
    """The fused GATED_DELTA_NET op: its output (a view, per head, token and sequence) and its new
    state, copied back into the layer's state rows (`flat`: through a view of them as one run)."""
    c = g.ctx
    s_v, h_v, T, n_seqs = v.ne
    out = c.gated_delta_net(q, k, v, gate, beta, state)
    output = c.view(out, (s_v, h_v, T, n_seqs), (4 * s_v, 4 * s_v * h_v, 4 * s_v * h_v * T), 0)
    new_state = c.view(out, (s_v, s_v, h_v, n_seqs), (4 * s_v, 4 * s_v * s_v, 4 * s_v * s_v * h_v),
                       4 * s_v * h_v * T * n_seqs)
    rows = c.view(ssm_all, (ssm_all.ne[0] * n_seqs,), (), 0) if flat else \
        c.view(ssm_all, (ssm_all.ne[0], n_seqs), (ssm_all.nb[1],), 0)
    g.expand(c.cpy(new_state, rows))
    return output


def gated_attn_layer(g: GraphContext, attn_in: AttnInput, cur: Tensor, pos: Tensor, il: int, reshape: bool) -> Tensor:
    """build_layer_attn: Q and its output gate from one projection, per-head Q/K norms, RoPE, the attention,
    the sigmoid gate, attn_output (`reshape`: Qwen3-Next's Q reshaped per head before the views)."""
    c, w, hp = g.ctx, g.w, g.hp
    n_head, n_kv, hd, T = hp.n_head[il], hp.n_head_kv[il], hp.head_k, cur.ne[1]
    q_full, k, v = g.qkv(il, cur, n_head, n_kv, 2 * hd, hd, reshape=False)
    ne: tuple[int, ...] = (hd, n_head, T)
    nb: tuple[int, ...] = (4 * 2 * hd, 4 * 2 * hd * n_head)
    if reshape:
        q_full = c.reshape(q_full, 2 * hd, n_head, T, 1)
        ne, nb = (*ne, 1), q_full.nb[1:]
    q, gate = (c.view(q_full, ne, nb, offset) for offset in (0, hd * 4))
    k, v = (c.reshape(t, hd, n_kv, T) for t in (k, v))
    q, k = g.qk_norm(il, q, k)
    q, k = c.rope(q, pos), c.rope(k, pos)
    cur = g.attn(attn_in, il, None, None, q, k, v)
    gate = c.unary(c.cont(gate, hd * n_head, T), "sigmoid")
    return g.mm(need(w.layer(il, "attn_output")), c.mul(cur, gate))


def delta_net_layer(g: GraphContext, rs_in: RsInput, cur: Tensor, il: int, repeat: bool, square_v: bool = False,
                    z_act: str = "silu", conv_at: bool = False) -> Tensor:
    """build_layer_attn_linear with llm_build_delta_net_base's conv state and recurrent attention (the
    fused op, no rollback snapshots). Qwen4Exp builds the same layer with V heads as wide as K's
    (`square_v`; else d_inner / the V heads), its output gate through a sigmoid (`z_act`) and its own
    gather of the conv state (`conv_at`: `conv_state_at`)."""
    c, w, hp = g.ctx, g.w, g.hp
    rec = g.rec
    assert rec is not None
    n_seqs = rs_in.n_seqs
    T = cur.ne[1] // n_seqs  # n_seq_tokens
    hk, nk, nv = rec.d_state, rec.n_group, rec.n_v_heads
    hv = hk if square_v else rec.d_inner // nv
    channels = hk * nk * 2 + hv * nv
    # the older conversions' single ssm_in in its place is refused before (`older_qkvz`)
    qkv = c.reshape(g.mm(need(w.layer(il, "attn_qkv")), cur), channels, T, n_seqs)
    z = g.mm(need(w.layer(il, "attn_gate")), cur)
    w_beta = w.layer(il, "ssm_beta")
    if w_beta is not None:  # Qwen3.5: separate beta and alpha projections
        beta = c.unary(c.reshape(g.mm(w_beta, cur), 1, nv, T, n_seqs), "sigmoid")
        alpha = c.reshape(g.mm(need(w.layer(il, "ssm_alpha")), cur), nv, T, n_seqs)
    else:
        ba = c.reshape(g.mm(need(w.layer(il, "ssm_ba")), cur), 2 * nv // nk, nk, T, n_seqs)
        per = nv // nk
        b, a = (c.view(ba, (per, nk, T, n_seqs), ba.nb[1:], offset) for offset in (0, per * 4))
        beta = c.reshape(c.unary(c.cont(b), "sigmoid"), 1, nv, T, n_seqs)
        alpha = c.cont(a, nv, T, n_seqs)
    alpha = c.unary(c.add(alpha, need(w.layer(il, "ssm_dt", "bias"))), "softplus")
    gate = c.mul(alpha, need(w.get(f"blk.{il}.ssm_a")))
    gate = c.reshape(gate, 1, nv, T, n_seqs)
    conv_all, ssm_all = g.rs[il]
    kernel = need(w.layer(il, "ssm_conv1d"))
    if conv_at:
        conv_in = conv_state_at(g, rs_in, conv_all, qkv, kernel.ne[0] - 1, channels)
    else:
        conv_in = conv_input(g, rs_in, conv_all, qkv, kernel, channels, T)  # build_conv_state
    state = c.reshape(g.rs_states(rs_in, ssm_all, rec.n_embd_s), hv, hv, nv, n_seqs)
    mix = c.unary(c.ssm_conv(conv_in, kernel), "silu")
    row = 4 * channels
    q, k = (c.view(mix, (hk, nk, T, n_seqs), (4 * hk, row, row * T), offset) for offset in (0, 4 * hk * nk))
    v = c.view(mix, (hv, nv, T, n_seqs), (4 * hv, row, row * T), 4 * 2 * hk * nk)
    q, k = c.scale(c.rms_norm(q)), c.scale(c.rms_norm(k))  # build_gdn_l2_norm
    if nk != nv and repeat:
        rep, n = nv // nk, T * n_seqs
        q, k = (c.reshape(c.repeat(c.reshape(t, hk, 1, nk, n), hk, rep, nk, n), hk, nk * rep, T, n_seqs)
                for t in (q, k))
    output = delta_net(g, q, k, v, gate, beta, state, ssm_all)
    z2 = c.reshape(z, hv, nv, T, n_seqs)
    normed = g.norm(output, w.layer(il, "ssm_norm"), None, il)
    cur = c.mul(normed, c.unary(z2, z_act))
    cur = c.reshape(cur, hv * nv, T, n_seqs)
    cur = g.mm(need(w.layer(il, "ssm_out")), cur)
    return c.reshape(cur, hp.n_embd, T * n_seqs)


def kda_layer(g: GraphContext, rs_in: RsInput, cur: Tensor, il: int, decay: str = "softplus", gate_rows: bool = False,
              flat: bool = False) -> Tensor:
    """build_kda_layer (docs/memory.md, "What the larger compositions build"): `decay` "softplus", "bounded"
    or "sigmoid" (Ling 3.0); `flat`: the state copied back through one run of the rows (Kimi-Linear); `gate_rows`:
    the output gate on the per-sequence rows."""
    c, w = g.ctx, g.w
    conv_all, ssm_all = g.rs[il]
    head_dim, n_head = need(w.layer(il, "ssm_norm")).ne[0], need(w.layer(il, "ssm_beta")).ne[1]
    d_inner = head_dim * n_head
    T, n_seqs = cur.ne[1], rs_in.n_seqs
    n_seq_tokens = T // n_seqs
    conv_state = g.rs_states(rs_in, conv_all, conv_all.ne[0])
    qkv_in: list[tuple[Tensor, Tensor | None]] = [(cur, w.layer(il, f"attn_{p}")) for p in "qkv"]
    wqkv = w.layer(il, "attn_qkv")
    if wqkv is not None:
        qkv = g.mm(wqkv, cur)
        qkv_in = [(c.cont(c.view(qkv, (d_inner, T), (qkv.nb[1],), i * d_inner * 4)), None) for i in range(3)]
    q, k, v = (short_conv(g, conv_all, conv_state, i, x, proj, need(w.layer(il, f"ssm_conv1d_{p}")), head_dim,
                          n_head, n_seqs)
               for i, ((x, proj), p) in enumerate(zip(qkv_in, "qkv", strict=True)))
    g1 = mm_where(g, w.layer(il, "ssm_f_b"), g.mm(need(w.layer(il, "ssm_f_a")), cur))
    g1 = c.add(g1, need(w.layer(il, "ssm_dt", "bias")))
    a3 = c.reshape(need(w.get(f"blk.{il}.ssm_a")), 1, n_head, 1)
    if decay == "softplus":
        g1 = c.mul(c.reshape(c.unary(g1, "softplus"), head_dim, n_head, T), a3)
    else:
        g1 = c.mul(c.reshape(g1, head_dim, n_head, T), a3)
        g1 = c.scale(c.unary(c.scale(g1) if decay == "bounded" else g1, "sigmoid"))
    g1 = c.reshape(g1, head_dim, n_head, n_seq_tokens, n_seqs)
    beta = c.unary(c.reshape(g.mm(need(w.layer(il, "ssm_beta")), cur), 1, n_head, n_seq_tokens, n_seqs), "sigmoid")
    state = c.reshape(g.rs_states(rs_in, ssm_all, ssm_all.ne[0]), head_dim, head_dim, n_head, n_seqs)
    q, k = c.scale(c.rms_norm(q)), c.scale(c.rms_norm(k))  # build_gdn_l2_norm
    output = c.cont(delta_net(g, q, k, v, g1, beta, state, ssm_all, flat))
    x = c.reshape(c.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs), cur.ne[0], T) if gate_rows else cur
    gate = mm_where(g, w.layer(il, "ssm_g_b"), g.mm(w.layer(il, "ssm_g") or need(w.layer(il, "ssm_g_a")), x))
    gate = c.reshape(gate, head_dim, n_head, T)
    normed = g.norm(c.reshape(output, head_dim, n_head, T), w.layer(il, "ssm_norm"), None, il)
    gated = c.mul(normed, c.unary(gate, "sigmoid"))
    return g.mm(need(w.layer(il, "attn_output")), c.cont(gated, d_inner, T))
