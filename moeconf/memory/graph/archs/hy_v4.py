"""Hy4 (src/models/hy-v4.cpp): the residual kept as hc streams (independent hyper-connections: each
sublayer's input the streams weighted by the sigmoid "pre" mix and summed, its output spread back by the
"post" mix, a magnitude times a sigmoid, onto each stream's residual; no comb matrix; the weighting in F32
between casts), gated MLA (absorbed, one latent KV head, per-head sinks, the decompressed output times a
sigmoid gate of the layer's input, then attn_output), the DSA lightning indexer (archs/_dsa.py, without
the Hadamard rotation) on the layers attention.indexer.types marks full, the others reusing the last full
layer's top-k; one dense leading FFN, then a sigmoid-routed MoE with its selection bias (its SwiGLU the
fused SWIGLU_CLAMP where swiglu_clamp_exp is above 0) and an unclamped shared expert. The output rows are
taken from the streams, which the head's own mix collapses before the final norm."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import indexer_top_k, inp_dsa
from moeconf.memory.graph.archs._hc import affine, hc_mixes, head_weights, weighted
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, need, routed
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor
from moeconf.model.inventory import Inventory

ARCH = "hy_v4"
# an indexer K cache on the layers the per-layer attention.indexer.types marks full (memory/indexer.py)
TRAITS = Traits(indexer="typed")


def _unmodelled(inv: Inventory) -> list[str]:
    """Hy4 without the DSA indexer (the all-full-attention checkpoints: a plain MLA cache, build_attn_inp_k)
    is not composed, nor indexer types other than one per layer; without them the loader refuses the file."""
    md = inv.metadata
    top_k, types = md.hparam("attention.indexer.top_k"), md.hparam("attention.indexer.types")
    if not isinstance(top_k, int) or top_k == 0:
        return ["memory is not modelled for hy_v4 without the DSA indexer (attention.indexer.top_k absent or 0: "
                "the engine's full-attention graph, which moeconf's graph does not build)"]
    if "attention.indexer.types" not in (md.arch_keys or ()):
        return ["hy_v4.attention.indexer.types is missing: the engine refuses the file (layer 0 must own an "
                "indexer)"]
    if not isinstance(types, tuple) or len(types) != md.block_count or not types[0]:
        return ["memory is not modelled for a hy_v4.attention.indexer.types that is not one value per layer with "
                "the first layer full (write one per layer, as the converter does)"]
    return []


MEMORY = Memory(CHECKED + " (Hy4-preview)", keys=frozenset({
    "attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
    "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
    "attention.indexer.types", "leading_dense_block_count", "swiglu_clamp_exp", "hyper_connection.count",
    "hyper_connection.epsilon", "hyper_connection.magnitude"}), unmodelled=_unmodelled)


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    hc = facts.hparam("hyper_connection.count")
    inp = g.inp_embd()
    pos = g.inp_pos()
    mla_in, lid_in = inp_dsa(g)
    out_ids = g.inp_out_ids()
    g.groups = facts.groups
    T = inp.ne[1]
    x = c.repeat(c.reshape(inp, hp.n_embd, 1, T), hp.n_embd, hc, T, 1)
    prev: Tensor | None = None
    for il in range(hp.n_layer):
        residual = x
        cur, post = _pre(g, x, il, "attn", hc)
        cur = g.norm(cur, w.layer(il, "attn_norm"), None, il)
        cur, prev = _attention(g, facts, cur, pos, mla_in, lid_in, prev, il)
        x = _post(g, cur, residual, post, hc)
        residual = x
        cur, post = _pre(g, x, il, "ffn", hc)
        cur = g.norm(cur, w.layer(il, "ffn_norm"), None, il)
        if g.dense(il):
            cur = g.layer_ffn(cur, il)
        else:
            act = "silu_clamp" if facts.above("swiglu_clamp_exp", il) else "silu"
            cur = g.add_shexp(routed(g, facts, cur, il, "sigmoid", act=act), cur, il)
        x = _post(g, cur, residual, post, hc)
    x = c.reshape(c.get_rows(c.reshape(x, hp.n_embd * hc, T), out_ids), hp.n_embd, hc, g.cp.n_outputs)
    g.output(_reduce(g, x, head_weights(g, x, hc), hc))


def _attention(g: GraphContext, facts: Facts, cur: Tensor, pos: Tensor, mla_in: AttnInput, lid_in: AttnInput,
               prev: Tensor | None, il: int) -> tuple[Tensor, Tensor]:
    """build_attention_dsa: the Q-LoRA, the layer's own indexer top-k where it is full (else `prev`), the
    absorbed MLA through the top-k mask with sinks, gated; and the top-k the next shared layer reuses."""
    c, w = g.ctx, g.w
    qr = g.norm(c.mul_mat(need(w.layer(il, "attn_q_a")), cur), w.layer(il, "attn_q_a_norm"), None, il)
    top_k = indexer_top_k(g, il, cur, qr, pos, None, lid_in.k_idxs, lid_in.mask, g.lid[il],
                          facts.hparam("attention.indexer.top_k")) if il in g.lid else prev
    assert top_k is not None, "a shared indexer layer follows a full one (the loader requires layer 0 full)"
    q_nope, q_pe = g.mla_q_parts(c.mul_mat(need(w.layer(il, "attn_q_b")), qr), g.hp.n_head[il])
    kv_cmpr, k_pe = g.mla_kv(il, cur)
    q_cur, k_cur, kv_cmpr = g.mla_absorbed(il, q_nope, c.rope(q_pe, pos), kv_cmpr, c.rope(k_pe, pos))
    attn = g.attn_k(mla_in, il, None, q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"),
                    g.top_k_mask(mla_in.mask, top_k), sinks=w.layer(il, "attn_sinks"))
    attn = c.mul(attn, c.unary(c.mul_mat(need(w.layer(il, "attn_gate")), cur), "sigmoid"))
    return g.mm(need(w.layer(il, "attn_output")), attn), top_k


def _pre(g: GraphContext, x: Tensor, il: int, part: str, hc: int) -> tuple[Tensor, Tensor]:
    """build_hc_pre: the mixes (the streams RMS-normed, projected to 2 x hc), the pre weights (a sigmoid
    of their affine part, eps added) reducing the streams, and the post weights (magnitude times a
    sigmoid, eps added)."""
    c, w = g.ctx, g.w
    fn, scale, base = (need(w.layer(il, f"hc_{part}_{k}")) for k in ("fn", "scale", "base"))
    mixes = hc_mixes(g, x, fn, hc)

    def mix(i: int) -> Tensor:
        return affine(g, c.view(mixes, (hc, x.ne[2]), (mixes.nb[1],), 4 * hc * i), c.view(scale, (1,), (), 4 * i),
                      c.view(base, (hc,), (), 4 * hc * i))

    pre = c.scale(c.unary(mix(0), "sigmoid"))
    post = c.scale(c.scale(c.unary(mix(1), "sigmoid")))
    return _reduce(g, x, pre, hc), post


def _reduce(g: GraphContext, x: Tensor, pre: Tensor, hc: int) -> Tensor:
    """hy_v4_hc_reduce: the streams cast to F32, weighted and summed, cast back."""
    return g.ctx.cast(weighted(g, g.ctx.cast(x, "F32"), pre, hc), x.type)


def _post(g: GraphContext, out: Tensor, residual: Tensor, post: Tensor, hc: int) -> Tensor:
    """build_hc_post: in F32, each stream's residual plus the sublayer's output times its post weight,
    the streams concatenated, cast back to the residual's type."""
    c = g.ctx
    n_embd, T = out.ne[0], out.ne[1]
    xf, pf, rf = c.cast(out, "F32"), c.cast(post, "F32"), c.cast(residual, "F32")
    res: Tensor | None = None
    for i in range(hc):
        r = c.view(rf, (n_embd, T), (rf.nb[2],), i * rf.nb[1])
        cur = c.reshape(c.add(r, c.mul(xf, c.view(pf, (1, T), (pf.nb[1],), i * pf.nb[0]))), n_embd, 1, T)
        res = cur if res is None else c.concat(res, cur, 1)
    assert res is not None
    return c.cast(res, residual.type)
