"""Hy4 (src/models/hy-v4.cpp): independent hyper-connections, gated MLA with sinks, the DSA lightning indexer
(archs/_dsa.py, unrotated) (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import attention, inp_dsa
from moeconf.memory.graph.archs._hc import affine_part, concat, head_weights, stream, sublayer_mixes, weight, weighted
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, need, routed
from moeconf.memory.graph.blocks import GraphContext
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
    T = inp.ne[1]
    x = c.repeat(c.reshape(inp, hp.n_embd, 1, T), hp.n_embd, hc, T, 1)
    prev: Tensor | None = None
    for il in range(hp.n_layer):
        residual = x
        cur, post = _pre(g, x, il, "attn", hc)
        attn, prev = attention(g, facts, il, cur, pos, mla_in, lid_in, prev, None, None, w.layer(il, "attn_sinks"))
        attn = c.mul(attn, c.unary(c.mul_mat(need(w.layer(il, "attn_gate")), cur), "sigmoid"))  # gated
        x = _post(g, g.mm(need(w.layer(il, "attn_output")), attn), residual, post, hc)
        residual = x
        cur, post = _pre(g, x, il, "ffn", hc)
        if g.dense(il):
            cur = g.layer_ffn(cur, il)
        else:
            act = "silu_clamp" if facts.above("swiglu_clamp_exp", il) else "silu"
            cur = g.add_shexp(routed(g, facts, cur, il, "sigmoid", act=act), cur, il)
        x = _post(g, cur, residual, post, hc)
    x = c.reshape(c.get_rows(c.reshape(x, hp.n_embd * hc, T), out_ids), hp.n_embd, hc, g.cp.n_outputs)
    g.output(_reduce(g, x, head_weights(g, x, hc), hc))


def _pre(g: GraphContext, x: Tensor, il: int, part: str, hc: int) -> tuple[Tensor, Tensor]:
    """build_hc_pre: the streams reduced by the pre weights and normed by {part}_norm, and the post weights
    (docs/memory.md, "What the larger compositions build")."""
    c = g.ctx
    mixes, scale, base = sublayer_mixes(g, x, il, part, hc)
    pre = c.scale(c.unary(affine_part(g, mixes, scale, base, 0, 0, hc), "sigmoid"))
    post = c.scale(c.scale(c.unary(affine_part(g, mixes, scale, base, 1, hc, hc), "sigmoid")))
    return g.norm(_reduce(g, x, pre, hc), g.w.layer(il, f"{part}_norm"), None, il), post


def _reduce(g: GraphContext, x: Tensor, pre: Tensor, hc: int) -> Tensor:
    """hy_v4_hc_reduce: the streams cast to F32, weighted and summed, cast back."""
    return g.ctx.cast(weighted(g, g.ctx.cast(x, "F32"), pre, hc), x.type)


def _post(g: GraphContext, out: Tensor, residual: Tensor, post: Tensor, hc: int) -> Tensor:
    """build_hc_post: in F32, each stream's residual plus the sublayer's output times its post weight,
    the streams concatenated, cast back to the residual's type."""
    c = g.ctx
    n_embd, T = out.ne[0], out.ne[1]
    xf, pf, rf = c.cast(out, "F32"), c.cast(post, "F32"), c.cast(residual, "F32")
    streams = (c.reshape(c.add(stream(g, rf, i), c.mul(xf, weight(g, pf, i))), n_embd, 1, T) for i in range(hc))
    return c.cast(concat(g, streams), residual.type)
