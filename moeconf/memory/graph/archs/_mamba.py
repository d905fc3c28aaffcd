"""Mamba's layers (llm_build_mamba_base, src/models/mamba-base.cpp): Mamba-2 (Nemotron-H, Granite-4.0-H) and
Mamba-1 (Jamba) (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import blocks_without, need
from moeconf.memory.graph.blocks import GraphContext, RsInput
from moeconf.memory.graph.ggml import Tensor

# the refusal of Mamba-2 blocks without their convolution's bias (the Mamba-2 loaders make ssm_conv1d.bias optional;
# the converters write it for Granite-4.0-H and Nemotron-H)
unbiased_conv = blocks_without("ssm_in", ("ssm_conv1d.bias",), "the engine then adds no bias after the convolution")


def conv_input(g: GraphContext, rs_in: RsInput, conv_all: Tensor, xbc: Tensor, kernel: Tensor, channels: int,
               n_seq_tokens: int, flat: bool = False) -> Tensor:
    """The conv state's columns before the ubatch's (the convolution's input), the last d_conv - 1 of them
    copied back as the next state (into the state's rows per sequence, or `flat` as one run)."""
    c, rec = g.ctx, g.rec
    assert rec is not None
    n_seqs = rs_in.n_seqs
    d_conv = kernel.ne[0]
    conv = c.reshape(g.rs_states(rs_in, conv_all, rec.n_embd_r), d_conv - 1, channels, n_seqs)
    conv_x = c.concat(conv, c.transpose(xbc), 0)
    last = c.view(conv_x, (d_conv - 1, channels, n_seqs), (conv_x.nb[1], conv_x.nb[2]), n_seq_tokens * conv_x.nb[0])
    rows = (d_conv - 1) * channels
    dst = c.view(conv_all, (rows * n_seqs,), (), 0) if flat else c.view(conv_all, (rows, n_seqs), (conv_all.nb[1],), 0)
    g.expand(c.cpy(last, dst))
    return conv_x


def _conv(g: GraphContext, rs_in: RsInput, conv_all: Tensor, x: Tensor, kernel: Tensor, channels: int,
          n_seq_tokens: int, il: int, flat: bool = False) -> Tensor:
    """SSM_CONV over the conv state's columns and `x` (`conv_input`), plus the layer's conv bias, SiLU."""
    c = g.ctx
    out = c.ssm_conv(conv_input(g, rs_in, conv_all, x, kernel, channels, n_seq_tokens, flat), kernel)
    b = g.w.layer(il, "ssm_conv1d", "bias")
    return c.unary(out if b is None else c.add(out, b), "silu")


def mamba2_layer(g: GraphContext, rs_in: RsInput, cur: Tensor, il: int) -> Tensor:
    """build_mamba2_layer (docs/memory.md, "What the larger compositions build")."""
    c, w, rec = g.ctx, g.w, g.rec
    assert rec is not None
    conv_all, ssm_all = g.rs[il]
    d_inner, d_state, n_head, n_group = rec.d_inner, rec.d_state, rec.n_v_heads, rec.n_group
    head_dim = d_inner // n_head
    channels = d_inner + 2 * n_group * d_state
    n_seqs = rs_in.n_seqs
    T = cur.ne[1] // n_seqs
    zxbcdt = g.mm(need(w.layer(il, "ssm_in")), cur)
    zxbcdt = c.reshape(zxbcdt, zxbcdt.ne[0], T, n_seqs)
    nb1, nb2 = zxbcdt.nb[1], zxbcdt.nb[2]
    z = c.view(zxbcdt, (head_dim, n_head, T, n_seqs), (head_dim * 4, nb1, nb2), 0)
    xbc = c.view(zxbcdt, (channels, T, n_seqs), (nb1, nb2), d_inner * 4)
    dt = c.view(zxbcdt, (n_head, T, n_seqs), (nb1, nb2), (2 * d_inner + 2 * n_group * d_state) * 4)
    kernel = need(w.layer(il, "ssm_conv1d"))
    xbc = _conv(g, rs_in, conv_all, xbc, kernel, channels, T, il)
    x = c.view(xbc, (head_dim, n_head, T, n_seqs), (head_dim * 4, xbc.nb[1], xbc.nb[2]), 0)
    B, C = (c.view(xbc, (d_state, n_group, T, n_seqs), (d_state * 4, xbc.nb[1], xbc.nb[2]), 4 * first)
            for first in (d_inner, d_inner + n_group * d_state))
    dt = c.add(c.cont(dt), need(w.layer(il, "ssm_dt", "bias")))
    A = need(w.get(f"blk.{il}.ssm_a"))
    slots = ssm_all.ne[1]

    def scan(states: Tensor, ids: Tensor) -> Tensor:
        return c.ssm_scan(c.reshape(states, d_state, head_dim, n_head, slots), x, dt, A, B, C, ids)

    y_ssm = g.rs_states(rs_in, ssm_all, rec.n_embd_s, scan)
    D = d_state * d_inner
    g.expand(c.cpy(c.view(y_ssm, (D, n_seqs, 1), (D * 4, D * 4 * n_seqs), x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3] * 4),
                   c.view(ssm_all, (D, n_seqs, 1), (ssm_all.nb[1], slots * D * 4), 0)))
    y = c.view(y_ssm, (head_dim, n_head, T, n_seqs), (x.nb[1], n_head * x.nb[1], T * n_head * x.nb[1]), 0)
    y = c.add(y, c.mul(x, need(w.get(f"blk.{il}.ssm_d"))))
    y = c.glu_split(c.cont(z), y, "swiglu")
    norm = w.layer(il, "ssm_norm")
    if norm is not None:
        y = g.norm(c.reshape(y, d_inner // n_group, n_group, T, n_seqs), norm, None, il)
    y = c.reshape(y, d_inner, T * n_seqs)
    return g.mm(need(w.layer(il, "ssm_out")), y)


def mamba_layer(g: GraphContext, rs_in: RsInput, cur: Tensor, il: int) -> Tensor:
    """build_mamba_layer (docs/memory.md, "What the larger compositions build")."""
    c, w, rec = g.ctx, g.w, g.rec
    assert rec is not None
    conv_all, ssm_all = g.rs[il]
    d_inner, d_state, dt_rank = rec.d_inner, rec.d_state, rec.n_v_heads
    n_seqs = rs_in.n_seqs
    T = cur.ne[1] // n_seqs
    kernel = need(w.layer(il, "ssm_conv1d"))
    cur = c.reshape(cur, cur.ne[0], T, n_seqs)
    xz = g.mm(need(w.layer(il, "ssm_in")), cur)
    x, z = (c.view(xz, (d_inner, xz.ne[1], xz.ne[2]), (xz.nb[1], xz.nb[2]), offset) for offset in (0, d_inner * 4))
    x = _conv(g, rs_in, conv_all, x, kernel, d_inner, T, il, flat=True)
    x_db = g.mm(need(w.layer(il, "ssm_x")), x)
    nb1, nb2 = x_db.nb[1], x_db.nb[2]
    dt = c.view(x_db, (dt_rank, T, n_seqs), (nb1, nb2), 0)
    B, C = (c.view(x_db, (d_state, 1, T, n_seqs), (d_state * 4, nb1, nb2), 4 * first)
            for first in (dt_rank, dt_rank + d_state))
    dt_norm, b_norm, c_norm = w.layer(il, "ssm_dt_norm"), w.layer(il, "ssm_b_norm"), w.layer(il, "ssm_c_norm")
    if dt_norm is not None and b_norm is not None and c_norm is not None:
        dt, B, C = (g.norm(t, t_norm, None, il) for t, t_norm in ((dt, dt_norm), (B, b_norm), (C, c_norm)))
    else:
        dt = c.cont(dt)
    dt = c.add(g.mm(need(w.layer(il, "ssm_dt")), dt), need(w.layer(il, "ssm_dt", "bias")))
    skip = x
    x = c.reshape(x, 1, d_inner, T, n_seqs)
    A = need(w.get(f"blk.{il}.ssm_a"))
    slots = ssm_all.ne[1]

    def scan(states: Tensor, ids: Tensor) -> Tensor:
        return c.ssm_scan(c.reshape(states, d_state, 1, d_inner, slots), x, dt, A, B, C, ids)

    y_ssm = g.rs_states(rs_in, ssm_all, rec.n_embd_s, scan)
    n = d_state * d_inner * n_seqs
    g.expand(c.cpy(c.view(y_ssm, (n,), (), x.nb[3] * x.ne[3]), c.view(ssm_all, (n,), (), 0)))
    y = c.view(y_ssm, (d_inner, T, n_seqs), (x.nb[2], x.nb[3]), 0)
    y = c.add(y, c.mul(skip, need(w.get(f"blk.{il}.ssm_d"))))
    y = c.glu_split(c.cont(z), y, "swiglu")
    cur = g.mm(need(w.layer(il, "ssm_out")), y)
    return c.reshape(cur, cur.ne[0], T * n_seqs)
