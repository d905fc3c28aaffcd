"""DeepSeek Sparse Attention (src/models/deepseek32.cpp, glm-dsa.cpp): deepseek2's absorbed MLA whose
mask keeps, per query token, only the cached positions the lightning indexer ranks highest.

The indexer: its keys (a projection of the layer's input, a layer norm with bias, RoPE, the Hadamard
rotation) go into their own K cache (llama_kv_cache_dsa's second cache, one head); its queries (from
the normed Q-LoRA), rotated likewise, score every cached key through the fused LIGHTNING_INDEXER
against the indexer's own f16 mask, weighted per head; TOP_K of the scores. build_attn (its DSA form,
src/llama-graph.cpp) fills a copy of the MLA mask with -inf, sets the chosen cells to zero (SET_ROWS
of a filled zero tensor), adds the MLA mask and attends through the latent cache as deepseek2 does.
GLM-5's "shared" layers (no indexer cache: `GraphContext.lid` lacks them) reuse the top-k of the last
layer that ran its indexer."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import Facts, need, routed
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor, row_size


def _inp_dsa(g: GraphContext) -> tuple[AttnInput, AttnInput]:
    """build_attn_inp_k_dsa: the latent cache's indices and mask, then the indexer cache's indices, its
    f16 mask (the fused indexer's) and its rotation."""
    mla = g.attn_inp_k()
    k_idxs = g.ctx.input("I64", g.n_tokens, name="attn_inp_k_idxs")
    mask = g.kq_mask(g.cp.n_kv, f16=True)
    return mla, AttnInput(k_idxs, k_idxs, mask, g.rot_input(g.lid_rot), None, g.cp.n_kv)


def _indexer(g: GraphContext, il: int, inp: AttnInput, cur: Tensor, qr: Tensor, pos: Tensor, top_k: int) -> Tensor:
    """The lightning indexer's top-k cells per query token."""
    c, w = g.ctx, g.w
    rot = need(inp.k_rot)
    proj = need(w.layer(il, "indexer.proj"))
    n_ih, T = proj.ne[1], cur.ne[1]
    kc = g.lid[il]
    width = kc.ne[0]
    iq = c.mul_mat(need(w.layer(il, "indexer.attn_q_b")), qr)
    iq = c.rope(c.reshape(iq, width, n_ih, T), pos)
    ik = c.mul_mat(need(w.layer(il, "indexer.attn_k")), cur)
    ik = g.norm(ik, w.layer(il, "indexer.k_norm"), w.layer(il, "indexer.k_norm", "bias"), il, rms=False)
    ik = c.rope(c.reshape(ik, width, 1, T), pos)
    iq = c.mul_mat(rot, iq)
    ik = c.mul_mat(rot, ik)
    g.expand(g._cpy_k(kc, ik, inp.k_idxs))
    iw = c.mul_mat(proj, cur)
    rs = row_size(kc.type, width)
    keys = c.view(kc, (width, 1, inp.n_kv, kc.ne[2]), (rs, rs, rs * kc.ne[1]), 0)
    ns = keys.ne[3]
    iq = c.view(iq, (iq.ne[0], iq.ne[1], iq.ne[2] // ns, ns), (iq.nb[1], iq.nb[2], iq.nb[3] // ns), 0)
    iw = c.view(iw, (iw.ne[0], iw.ne[1] // ns, iw.ne[2], ns), (iw.nb[1], iw.nb[2] // ns, iw.nb[3] // ns), 0)
    score = c.lightning_indexer(iq, keys, c.scale(iw), inp.mask)
    return c.cont(c.top_k(score, min(score.ne[0], top_k)))


def _attn_dsa(g: GraphContext, inp: AttnInput, il: int, wo: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
              v_mla: Tensor | None, top_k: Tensor) -> Tensor:
    """build_attn with the DSA input: the latent cache's mask opened only at the top-k cells."""
    c = g.ctx
    for t in (q, v, k):
        g.expand(t)
    kc, _ = g.kv[il]
    g.expand(g._cpy_k(kc, k, inp.k_idxs))
    m = inp.mask
    every = c.fill(m)
    every = c.view(every, (1, every.ne[0], every.ne[1], every.ne[3]), (every.nb[0], every.nb[1], every.nb[2]), 0)
    t = top_k
    tk = c.view(t, (t.ne[0], t.ne[1], t.ne[3], 1), (t.nb[1], t.nb[2], t.ne[3] * t.nb[3]), 0)
    zeros = c.fill(c.new("F32", 1, tk.ne[0], tk.ne[1], tk.ne[2]))
    sparse = c.set_rows(every, zeros, tk)
    s = sparse
    sparse = c.view(s, (s.ne[1], s.ne[2], 1, s.ne[3]), (s.nb[2], s.nb[3], s.nb[3]), 0)
    sparse = c.add(sparse, m)
    kview = g._get_k(kc, il, inp.n_kv)
    vview = c.view(kview, (v.ne[0], kview.ne[1], kview.ne[2], kview.ne[3]), (kview.nb[1], kview.nb[2], kview.nb[3]), 0)
    cur = g.attn_mha(q, kview, vview, sparse, None, v_mla)
    if wo is not None:
        cur = g.mm(wo, cur)
    return cur


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd()
    pos = g.inp_pos()
    mla_in, lid_in = _inp_dsa(g)
    g.inp_out_ids()
    g.groups = facts.groups
    prev: Tensor | None = None
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        qr = c.mul_mat(need(w.layer(il, "attn_q_a")), cur)
        qr = g.norm(qr, w.layer(il, "attn_q_a_norm"), None, il)
        top_k = _indexer(g, il, lid_in, cur, qr, pos, g.lid_top_k) if il in g.lid else prev
        assert top_k is not None, "a shared indexer layer follows a full one (the engine asserts it)"
        prev = top_k
        q_nope, q_pe = g.mla_q_parts(c.mul_mat(need(w.layer(il, "attn_q_b")), qr), hp.n_head[il])
        kv_cmpr, k_pe = g.mla_kv(il, cur)
        q_pe = c.rope(q_pe, pos)
        k_pe = c.rope(k_pe, pos)
        kv_cmpr = g.norm(kv_cmpr, w.layer(il, "attn_kv_a_norm"), None, il)
        q_cur, k_cur, kv_cmpr = g.mla_absorbed(il, q_nope, q_pe, kv_cmpr, k_pe)
        cur = _attn_dsa(g, mla_in, il, w.layer(il, "attn_output"), q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"),
                        top_k)
        ffn_inp, cur = g.ffn_input(il, cur, res)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)
