"""DeepSeek Sparse Attention (src/models/deepseek32.cpp, glm-dsa.cpp): deepseek2's absorbed MLA through the
lightning indexer's top-k mask (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import Facts, need, routed
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor


def inp_dsa(g: GraphContext) -> tuple[AttnInput, AttnInput]:
    """build_attn_inp_k_dsa: the latent cache's indices and mask, then the indexer cache's indices, its
    f16 mask (the fused indexer's) and its rotation."""
    mla = g.attn_inp_k()
    k_idxs = g.ctx.input("I64", g.n_tokens, name="attn_inp_k_idxs")
    mask = g.kq_mask(g.cp.n_kv, f16=True)
    return mla, AttnInput(k_idxs, k_idxs, mask, g.rot_input(g.lid_rot), None, g.cp.n_kv)


def indexer_top_k(g: GraphContext, il: int, cur: Tensor, qr: Tensor, pos: Tensor, rot: Tensor | None,
                  idxs: Tensor, mask: Tensor, kc: Tensor, top_k: int | None) -> Tensor:
    """The lightning indexer's top-k cells per query token: its keys stored in its one-head cache `kc` at
    `idxs`, its queries scored against every cached key through `mask`, the `top_k` best (None: all).
    `rot`: the Hadamard rotation of Q and K (None: not rotated, Hy4's indexer)."""
    c, w = g.ctx, g.w
    q_b = need(w.layer(il, "indexer.attn_q_b"))
    width, T = kc.ne[0], cur.ne[1]
    iq = c.rope(c.reshape(g.mm(q_b, qr), width, q_b.ne[1] // width, T), pos)
    ik = g.mm(need(w.layer(il, "indexer.attn_k")), cur)
    ik = g.norm(ik, w.layer(il, "indexer.k_norm"), w.layer(il, "indexer.k_norm", "bias"), il, rms=False)
    ik = c.rope(c.reshape(ik, width, 1, T), pos)
    if rot is not None:
        iq, ik = c.mul_mat(rot, iq), c.mul_mat(rot, ik)
    g.expand(g._cpy_k(kc, ik, idxs))
    iw = g.mm(need(w.layer(il, "indexer.proj")), cur)
    return lightning_top_k(g, iq, g.get_k_one(kc, g.cp.n_kv), iw, mask, top_k, True)


def lightning_top_k(g: GraphContext, q: Tensor, keys: Tensor, w: Tensor, mask: Tensor, top_k: int | None,
                    scale_views: bool) -> Tensor:
    """The fused LIGHTNING_INDEXER's scores of the queries `q` [width, heads, tokens] against each stream's
    `keys`, weighted per head by `w` [heads, tokens] (scaled; `scale_views`: its per-stream view scaled, else
    `w` is so already), and the `top_k` best cells per token (None: all)."""
    c, ns = g.ctx, keys.ne[3]
    q = c.view(q, (q.ne[0], q.ne[1], q.ne[2] // ns, ns), (q.nb[1], q.nb[2], q.nb[3] // ns), 0)
    w = c.view(w, (w.ne[0], w.ne[1] // ns, w.ne[2], ns), (w.nb[1], w.nb[2] // ns, w.nb[3] // ns), 0)
    score = c.lightning_indexer(q, keys, c.scale(w) if scale_views else w, mask)
    return c.cont(c.top_k(score, score.ne[0] if top_k is None else min(score.ne[0], top_k)))


def attention(g: GraphContext, facts: Facts, il: int, cur: Tensor, pos: Tensor, mla_in: AttnInput, lid_in: AttnInput,
              prev: Tensor | None, rot: Tensor | None, wo: Tensor | None,
              sinks: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The DSA attention (deepseek32's, Hy4's build_attention_dsa): the Q-LoRA, the layer's own indexer top-k
    where it runs its indexer (`rot` its rotation), else `prev`; the absorbed MLA through the top-k mask,
    with `sinks` where given, projected by `wo` where given; and the top-k the next shared layer reuses."""
    c, w = g.ctx, g.w
    qr = g.norm(c.mul_mat(need(w.layer(il, "attn_q_a")), cur), w.layer(il, "attn_q_a_norm"), None, il)
    top_k = indexer_top_k(g, il, cur, qr, pos, rot, lid_in.k_idxs, lid_in.mask, g.lid[il],
                          facts.hparam("attention.indexer.top_k")) if il in g.lid else prev
    assert top_k is not None, "a shared indexer layer follows a full one (the engine asserts it; Hy4's loader " \
        "requires layer 0 full)"
    q_nope, q_pe = g.mla_q_parts(c.mul_mat(need(w.layer(il, "attn_q_b")), qr), g.hp.n_head[il])
    kv_cmpr, k_pe = g.mla_kv(il, cur)
    q_cur, k_cur, kv_cmpr = g.mla_absorbed(il, q_nope, c.rope(q_pe, pos), kv_cmpr, c.rope(k_pe, pos))
    return g.attn_k(mla_in, il, wo, q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"), g.top_k_mask(mla_in.mask, top_k),
                    sinks=sinks), top_k


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd()
    pos = g.inp_pos()
    mla_in, lid_in = inp_dsa(g)
    g.inp_out_ids()
    prev: Tensor | None = None
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        cur, prev = attention(g, facts, il, cur, pos, mla_in, lid_in, prev, lid_in.k_rot,
                              w.layer(il, "attn_output"))
        ffn_inp, cur = g.ffn_input(il, cur, res)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)
