"""src/models/glm5-next.cpp: GLM-5.3-Flash, KDA layers beside nope-only MLA layers through a k-pool lightning
indexer, the residual kept as hyper-connection streams (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from moeconf.memory.graph.archs._deltanet import kda_layer
from moeconf.memory.graph.archs._hc import fused, hc_post, hc_pre, stream
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, need, probs_bias
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor, row_size
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS
from moeconf.memory.recurrent import KDA_KEYS

if TYPE_CHECKING:
    from moeconf.model.inventory import Inventory

ARCH = "glm5-next"
# -nkvo with routed experts on the host: the engine's figures, tests/data/glm5next_memory_oracle.json
TRAITS = Traits(nkvo_host_experts=True, indexer="kpool")
GATHER_MAX_UB = 16  # build_inp_kpool: the gather path's largest ubatch
# the sizes the loader requires (load_arch_hparams) that the graph's shapes do not carry
_SIZES = ("attention.q_lora_rank", "attention.indexer.head_count", "attention.indexer.key_length",
          "attention.indexer.top_k", "attention.indexer.kpool", "hyper_connection.count",
          "hyper_connection.sinkhorn_iterations")


def _refuses(n_tokens: int, n_stream: int) -> str:
    if n_tokens <= GATHER_MAX_UB:
        return (f"compute is not modelled for glm5-next with a ubatch of {GATHER_MAX_UB} tokens or fewer: its "
                "attention gathers the selected latents (build_inp_kpool's gather path), which no recorded figure "
                f"checked; use -ub {GATHER_MAX_UB + 1} or more")
    return ""


def _unmodelled(inv: Inventory) -> list[str]:
    """The files the engine refuses (a size missing, an invalid k-pool, hc_mult other than 4) or whose
    graph no recorded figure checked (the softplus decay gate, a selection without the tail cells)."""
    md = inv.metadata
    keys = set(md.arch_keys or ())
    why = []
    if "kda.gate_lower_bound" not in keys:
        why.append("glm5-next without kda.gate_lower_bound (the softplus decay gate) is not checked against the engine")
    if "attention.indexer.kpool_select_tail" not in keys or md.hparam("attention.indexer.kpool_select_tail") == 0:
        why.append("glm5-next without attention.indexer.kpool_select_tail (no tail cells in the selection) is not "
                   "checked against the engine")
    missing = [k for k in _SIZES if not isinstance(md.hparam(k), int)]
    if missing:
        names = ", ".join(f"glm5-next.{k}" for k in missing)
        why.append(f"memory is not modelled for this glm5-next file: it lacks {names} (the engine needs them)")
    kpool, top_k = md.hparam("attention.indexer.kpool"), md.hparam("attention.indexer.top_k")
    if not isinstance(kpool, int) or not isinstance(top_k, int) or kpool < 2 or top_k % kpool:
        why.append("glm5-next's attention.indexer.kpool/top_k are missing or invalid: the engine refuses the file")
    if md.hparam("hyper_connection.count") != 4:
        why.append("glm5-next with hyper_connection.count other than 4: the engine refuses the file")
    return why


# the KDA state (memory/recurrent.py), the MLA latent and the k-pool indexer cache (memory/indexer.py), the
# k-pool, the mHC streams and the decay gate's bound; the experts' clamp is the fused clamped SwiGLU, one op
# as wide as the SwiGLU (checked with the key)
MEMORY = Memory(CHECKED + " (GLM-5.3-Flash)", KDA_KEYS | MLA_KEYS | DSA_KEYS | {
    "attention.indexer.kpool", "attention.indexer.kpool_select_tail", "hyper_connection.count",
    "hyper_connection.epsilon", "hyper_connection.sinkhorn_iterations", "kda.gate_lower_bound",
    "swiglu_clamp_exp", "swiglu_clamp_shexp"}, refuses=_refuses, unmodelled=_unmodelled)


@dataclass
class _Kpool:
    """llm_graph_input_kpool on the reserve's sizes."""

    k_idxs: Tensor
    pool_cells: Tensor
    pool_idxs: Tensor
    pool_mask: Tensor
    tail_idxs: Tensor
    gather_mask: Tensor
    new_pool_idxs: Tensor
    new_pool_rep: Tensor
    n_top: int  # the pools kept per token
    n_sel: int
    gather: bool
    kpool: int
    width: int  # attention.indexer.key_length


def _inp_kpool(g: GraphContext, facts: Facts) -> _Kpool:
    c, cp, T = g.ctx, g.cp, g.n_tokens
    kpool, top_k = facts.hparam("attention.indexer.kpool"), facts.hparam("attention.indexer.top_k")
    n_pool_real = cp.n_kv // kpool * cp.n_seq  # the cache's cells per stream
    n_pool = max(64, -(-(n_pool_real + 1) // 64) * 64)
    n_new = max(n_pool_real, 1)
    k_idxs = c.input("I64", T, name="attn_inp_k_idxs")
    pool_cells, pool_idxs = c.input("I32", n_pool, name=""), c.input("I32", kpool, n_pool, name="")
    pool_mask = c.input("F16", n_pool, T, name="")  # the fused indexer's (never turned off: model.FUSED_PROBES)
    tail_idxs = c.input("I32", kpool - 1, T, name="")
    for t in (pool_cells, pool_idxs, pool_mask, tail_idxs):
        g.expand(t)
    n_top = min(n_pool, top_k // kpool)
    n_sel = kpool * n_top + (kpool - 1 if facts.hparam("attention.indexer.kpool_select_tail") else 0)
    gather_mask = c.input("F32", n_sel, 1, 1, T, name="")
    g.expand(gather_mask)
    return _Kpool(k_idxs, pool_cells, pool_idxs, pool_mask, tail_idxs, gather_mask,
                  c.input("I32", kpool, n_new, name=""), c.input("I64", n_new, name=""), n_top, n_sel,
                  T <= GATHER_MAX_UB and cp.n_kv > n_sel, kpool, facts.hparam("attention.indexer.key_length"))


def build(g: GraphContext, facts: Facts) -> None:
    c, hp = g.ctx, g.hp
    hc = facts.hparam("hyper_connection.count")
    iters = facts.hparam("hyper_connection.sinkhorn_iterations")
    decay = "bounded" if "kda.gate_lower_bound" in facts.floats | facts.units else "softplus"
    sh_clamp = "swiglu_clamp_shexp" if "swiglu_clamp_shexp" in facts.floats | facts.units else "swiglu_clamp_exp"
    for il, kc in g.lid.items():  # llama_memory_hybrid_idx's indexer cache, created with the prefix "idx_"
        kc.name = f"cache_idx_k_l{il}"
    inp = g.inp_embd()
    rs_in = g.rs_inp()
    attn_in = g.attn_inp_k()
    kp = _inp_kpool(g, facts)
    out_ids = g.inp_out_ids()
    T = g.n_tokens
    x = c.repeat(c.reshape(inp, hp.n_embd, 1, T), hp.n_embd, hc, T, 1)
    prev: Tensor | None = None
    for il in range(hp.n_layer):
        residual = x
        cur, post, comb = hc_pre(g, x, il, "attn", hc, iters)
        g.expand(cur)
        if il in g.rs:
            cur = kda_layer(g, rs_in, cur, il, decay)
        else:
            cur, prev = _dsa_layer(g, attn_in, kp, cur, il, prev)
        x = hc_post(g, cur, residual, post, comb, hc, il)
        residual = x
        cur, post, comb = hc_pre(g, x, il, "ffn", hc, iters)
        sh_act = "silu_clamp" if facts.above(sh_clamp, il) else "silu"
        if g.dense(il):
            cur = g.layer_ffn(cur, il, act=sh_act)
        else:
            moe = g.moe_ffn(cur, il, gating="sigmoid" if facts.gating in (None, 0, 2) else "softmax",
                            norm_w=bool(facts.norm_w), w_scale=facts.w_scale,
                            act="silu_clamp" if facts.above("swiglu_clamp_exp", il) else "silu",
                            probs_bias=probs_bias(g, il))
            cur = g.add_shexp(moe, cur, il, act=sh_act)  # the loader requires the shared expert
        x = hc_post(g, cur, residual, post, comb, hc, il)
    flat = c.get_rows(c.reshape(x, hp.n_embd * hc, T), out_ids)
    x = c.reshape(flat, hp.n_embd, hc, g.cp.n_outputs)
    g.output(c.scale(reduce(c.add, (stream(g, x, s) for s in range(hc)))))


def _kpool_select(g: GraphContext, kp: _Kpool, cur: Tensor, qr: Tensor, mask: Tensor, il: int) -> Tensor:
    """build_kpool_select: the selected cells' indices (gather) or the sparse mask (scatter)."""
    c, lw = g.ctx, g.w.layer
    kc, width = g.lid[il], kp.width
    assert kc.ne[0] == 3 * width, "the indexer cache row is key | gate | pooled (llama_memory_hybrid_idx)"
    n_ih = need(lw(il, "indexer.proj")).ne[1]
    T, kpool, n_top = cur.ne[1], kp.kpool, kp.n_top
    n_pool, n_new = kp.pool_cells.ne[0], kp.new_pool_idxs.ne[1]
    iq = c.reshape(g.mm(need(lw(il, "indexer.attn_q_b")), qr), width, n_ih, T)
    ik = g.mm(need(lw(il, "indexer.attn_k")), cur)
    ik = g.norm(ik, lw(il, "indexer.k_norm"), lw(il, "indexer.k_norm", "bias"), il, rms=False)
    ig = g.mm(need(lw(il, "indexer_compressor_gate")), cur)
    pzero = c.fill(c.new("F32", width, T))
    packed = c.reshape(c.concat(c.concat(ik, ig, 0), pzero, 0), 3 * width, 1, T)
    g.expand(g._cpy_k(kc, packed, kp.k_idxs))
    cells = kc.ne[1] * kc.ne[2]
    key_gate = c.view(kc, (2 * width, cells), (kc.nb[1],), 0)
    pooled_all = c.view(kc, (width, cells), (kc.nb[1],), row_size(kc.type, 2 * width))
    rows = c.reshape(c.get_rows(key_gate, c.reshape(kp.new_pool_idxs, kpool * n_new)), 2 * width, kpool, n_new)
    pk, pg = (c.view(rows, (width, kpool, n_new), (rows.nb[1], rows.nb[2]), offset)
              for offset in (0, row_size(rows.type, width)))
    logits = c.cont(c.permute(c.add(pg, need(lw(il, "indexer_compressor_ape"))), 1, 0, 2, 3))
    probs = c.reshape(c.soft_max(c.reshape(logits, kpool, width * n_new)), kpool, width, n_new)
    pk = c.cont(c.permute(pk, 1, 0, 2, 3))
    pooled_new = c.reshape(c.sum_rows(c.mul(probs, pk)), width, n_new)
    g.expand(c.set_rows(pooled_all, pooled_new, kp.new_pool_rep))  # cache_safe on a fresh cache
    pooled = c.reshape(c.get_rows(pooled_all, kp.pool_cells), width, 1, n_pool)
    weights = c.scale(g.mm(need(lw(il, "indexer.proj")), cur))
    # fused on every placement (docs/memory.md, "What the larger compositions build")
    score = fused(g, "LIGHTNING_INDEXER", c.lightning_indexer(iq, pooled, weights, kp.pool_mask), il)
    top = c.top_k(score, n_top)
    sel_score = c.get_rows(c.reshape(score, 1, n_pool, T), top)
    order = c.argsort(c.reshape(sel_score, n_top, T))
    top = c.get_rows(c.reshape(c.cast(top, "F32"), 1, n_top, T), order)
    top = c.cast(c.cont(c.reshape(top, n_top, T)), "I32")
    sel_idx = c.reshape(c.get_rows(kp.pool_idxs, c.reshape(top, n_top * T)), kpool * n_top, T)
    if kp.tail_idxs.ne[0] and kp.n_sel > kpool * n_top:
        sel_idx = c.concat(sel_idx, kp.tail_idxs, 0)
    n_sel = sel_idx.ne[0]
    if kp.gather:
        return sel_idx
    n_kv = mask.ne[0]
    seed = c.cast(c.view(sel_idx, (1,), (), 0), "F32")
    mask_seed = seed if mask.type == "F32" else c.cast(seed, mask.type)
    mask_all = c.reshape(c.repeat(c.fill(mask_seed), 1, n_kv + n_sel, T, 1), 1, n_kv + n_sel, T)
    zeros = c.reshape(c.repeat(c.fill(seed), 1, n_sel, T, 1), 1, n_sel, T)
    live = c.unary(c.reshape(kp.gather_mask, n_sel, T), "exp")
    dump = c.arange(n_sel)
    idx_f = c.cast(sel_idx, "F32")
    sel_idx = c.cast(c.add(c.mul(c.sub(idx_f, dump), live), dump), "I32")  # a dead slot to its dump row
    sel = c.set_rows(mask_all, zeros, c.reshape(sel_idx, n_sel, T, 1))
    sel = c.view(sel, (n_kv, T), (sel.nb[2],), 0)
    return c.add(sel, c.reshape(mask, n_kv, T))


def _dsa_layer(g: GraphContext, attn_in: AttnInput, kp: _Kpool, cur: Tensor, il: int,
               prev: Tensor | None) -> tuple[Tensor, Tensor]:
    """build_dsa_layer: the nope-only absorbed MLA over the indexer's selection."""
    c, lw = g.ctx, g.w.layer
    T, n_head = cur.ne[1], g.hp.n_head[il]
    qr = g.norm(g.mm(need(lw(il, "attn_q_a")), cur), lw(il, "attn_q_a_norm"), None, il)
    q = c.reshape(g.mm(need(lw(il, "attn_q_b")), qr), g.mla.head_k, n_head, T)
    kv = g.norm(g.mm(need(lw(il, "attn_kv_a_mqa")), cur), lw(il, "attn_kv_a_norm"), None, il)
    kv = c.reshape(kv, g.mla.kv_lora_rank, 1, T)
    absorbed = c.permute(g.mm(need(lw(il, "attn_k_b")), c.permute(q, 0, 2, 1, 3)), 0, 2, 1, 3)
    mask = attn_in.mask
    sel = _kpool_select(g, kp, cur, qr, mask, il) if il in g.lid else prev
    assert sel is not None, "a shared indexer layer follows a full one (the engine asserts it)"
    if not kp.gather:  # the latent both K and V, through the selection's mask
        return g.attn_k(attn_in, il, need(lw(il, "attn_output")), absorbed, kv, kv, lw(il, "attn_v_b"),
                        c.reshape(sel, *mask.ne)), sel
    return g.mm(need(lw(il, "attn_output")), _gathered(g, attn_in, kv, sel, absorbed, kp, il)), sel


def _gathered(g: GraphContext, attn_in: AttnInput, kv: Tensor, sel_idx: Tensor, absorbed: Tensor, kp: _Kpool,
              il: int) -> Tensor:
    """The gather path: the latent `kv` stored, the selected latents gathered per token (gather_mla_rows), KQ
    with the slot mask, the softmax, the latents' transposed copy, KQV, decompressed by attn_v_b."""
    c = g.ctx
    g.expand(absorbed)
    g.expand(kv)
    kc, _ = g.kv[il]
    g.expand(g._cpy_k(kc, kv, attn_in.k_idxs))
    g.expand(attn_in.mask)
    n_sel, T, rank = sel_idx.ne[0], sel_idx.ne[1], kc.ne[0]
    rows = c.view(kc, (rank, kc.ne[1] * kc.ne[2]), (kc.nb[1],), 0)
    k_g = c.reshape(c.get_rows(rows, c.reshape(sel_idx, n_sel * T)), rank, n_sel, 1, T)
    q_g = c.permute(absorbed, 0, 2, 3, 1)
    kq = c.soft_max(c.mul_mat(k_g, q_g), kp.gather_mask)
    v_t = c.cont(c.transpose(k_g))
    kqv = g.mm(need(g.w.layer(il, "attn_v_b")), c.mul_mat(v_t, kq))
    out = c.cont(c.permute(kqv, 0, 2, 1, 3))
    return c.reshape(out, kqv.ne[0] * absorbed.ne[1], T)  # its heads
