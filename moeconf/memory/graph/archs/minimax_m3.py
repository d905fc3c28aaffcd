"""MiniMax-M3 (src/models/minimax-m3.cpp): MiniMax-M2's attention and MoE with MiniMax Sparse Attention
(MSA) on the MoE layers (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from dataclasses import dataclass

from moeconf.memory.graph.archs._hc import concat
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, need, routed
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor, is_contiguous

ARCH = "minimax-m3"


@dataclass
class _Msa:
    """llm_graph_input_msa and the sizes every sparse layer shares."""

    k_idxs: Tensor  # the indexer cache's store indices
    bias: Tensor  # [blocks, tokens] the local blocks' forcing
    pos_mask: Tensor  # [positions, tokens]
    pos_slot: Tensor  # [positions, streams] position -> cell
    cell_blk: Tensor  # [cells, streams] cell -> position block
    mask_f32: Tensor  # the causal mask cast to F32
    blk: int
    n_ps: int
    top_k: int


def _msa_input(g: GraphContext, attn_in: AttnInput, facts: Facts) -> _Msa:
    c = g.ctx
    blk = facts.hparam("attention.indexer.block_size", 1)
    n_ps = -(-256 // blk) * blk  # get_n_pos of an empty cache (256), padded to whole blocks
    mask, T = attn_in.mask, g.n_tokens
    n_kv, n_tps, ns = mask.ne[0], mask.ne[1], mask.ne[3]
    assert n_tps > 1, _refuses(T, ns)
    return _Msa(c.input("I64", T, name="attn_inp_k_idxs"), c.input("F32", n_ps // blk, T, name=""),
                c.input("F32", n_ps, T, name=""), c.input("I32", n_ps, ns, name=""), c.input("I32", n_kv, ns, name=""),
                c.cast(mask, "F32"), blk, n_ps, facts.hparam("attention.indexer.top_k"))


def _fa(g: GraphContext, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, gp: int) -> Tensor:
    """build_attn_msa_fa: every head group (and stream) on flash attention's sequence axis."""
    c = g.ctx
    d, hq, t, ch = q.ne[0], q.ne[1], q.ne[2], k.ne[3]
    r = hq * t // (gp * ch)
    q = c.permute(c.reshape(q, d, gp, ch, r), 0, 2, 3, 1)
    o = c.permute(c.flash_attn_ext(q, k, v, mask), 0, 1, 3, 2)
    if not is_contiguous(o):
        o = c.cont(o)
    return c.reshape(o, d * hq, t)


def _sparse(g: GraphContext, m: _Msa, attn_in: AttnInput, il: int, cur: Tensor, pos: Tensor, q: Tensor, k: Tensor,
            v: Tensor) -> Tensor:
    c, w, hp = g.ctx, g.w, g.hp
    T = g.n_tokens
    kq_w, kk_w = need(w.layer(il, "indexer.q_proj")), need(w.layer(il, "indexer.k_proj"))
    d_idx = kk_w.ne[1]
    hd = kq_w.ne[1] // d_idx
    iq = c.reshape(g.mm(kq_w, cur), d_idx, hd, T)
    ik = c.reshape(g.mm(kk_w, cur), d_idx, 1, T)
    iq = c.rope(g.norm(iq, w.layer(il, "indexer.q_norm"), None, il), pos)
    ik = c.rope(g.norm(ik, w.layer(il, "indexer.k_norm"), None, il), pos)
    kc = g.kv[il][0]
    cells, ns = kc.ne[1], kc.ne[2]
    assert kc.buffer is not None
    ic = c.cache(f"cache_k_l{il}", kc.type, (d_idx, cells, ns), kc.buffer)  # the indexer cache: one key head
    g.expand(g._cpy_k(ic, ik, m.k_idxs))
    ik_kv = g.get_k_one(ic, attn_in.n_kv)
    q, kv_k, kv_v = g.store_kv(attn_in, il, q, k, v, iswa=True)  # K before V, as the engine's MSA form
    d, hkv, n_kv = kv_k.ne[0], kv_k.ne[1], kv_k.ne[2]
    n_head, n_tps = hp.n_head[il], T // ns
    nblk = m.n_ps // m.blk
    top = min(m.top_k, nblk)
    outs = []
    pm, mf, b = m.pos_mask, m.mask_f32, m.bias
    for st in range(ns):
        iq_s = c.view(iq, (d_idx, hd, n_tps), (iq.nb[1], iq.nb[2]), st * n_tps * iq.nb[2])
        ik_s = c.view(ik_kv, (d_idx, n_kv), (ik_kv.nb[2],), st * ik_kv.nb[3])
        psl_s = c.view(m.pos_slot, (m.n_ps,), (), st * m.pos_slot.nb[1])
        pm_s = c.view(pm, (m.n_ps, 1, n_tps), (pm.nb[1], pm.nb[1]), st * n_tps * pm.nb[1])
        cb_s = c.view(m.cell_blk, (n_kv,), (), st * m.cell_blk.nb[1])
        mf_s = c.view(mf, (n_kv, n_tps, 1), (mf.nb[1], mf.nb[3]), st * mf.nb[3])
        bias_s = c.view(b, (nblk, 1, n_tps), (b.nb[1], b.nb[1]), st * n_tps * b.nb[1])
        q_s = c.view(q, (d, n_head, n_tps), (q.nb[1], q.nb[2]), st * n_tps * q.nb[2])
        k_s, v_s = (c.view(t, (d, hkv, n_kv, 1), t.nb[1:], st * t.nb[3]) for t in (kv_k, kv_v))
        # the block scores, the local blocks forced, the top blocks
        ikp = c.get_rows(ik_s, psl_s)
        sc = c.reshape(c.mul_mat(ikp, c.reshape(iq_s, d_idx, hd * n_tps)), m.n_ps, hd, n_tps)
        sc = c.inplace("ADD", sc, pm_s)
        bsf = c.add(c.pool_2d(sc, m.blk, 1, m.blk, 1), bias_s)
        idx = c.top_k(bsf, top)
        # the block mask: -inf but at the chosen blocks, per head, spread to the cells, plus the causal mask
        ninf = c.repeat(c.cast(c.scale(bias_s), "F16"), nblk, hd, n_tps, 1)
        zero = c.scale(c.cast(idx, "F32"))
        bm = c.set_rows(c.reshape(ninf, 1, nblk, hd * n_tps), c.reshape(zero, 1, top, hd * n_tps),
                        c.reshape(idx, top, hd * n_tps))
        bm = c.cont(c.permute(c.reshape(bm, nblk, hd, n_tps), 0, 2, 1, 3))
        bm2 = c.cont(c.transpose(c.reshape(bm, nblk, n_tps * hd)))
        bmx = c.reshape(c.cont(c.transpose(c.get_rows(bm2, cb_s))), n_kv, n_tps, hd)
        mask4 = c.cast(c.reshape(c.inplace("ADD", bmx, mf_s), n_kv, n_tps, 1, hd), "F16")
        outs.append(_fa(g, q_s, c.permute(k_s, 0, 3, 1, 2), c.permute(v_s, 0, 3, 1, 2), mask4, n_head // hkv))
    out = concat(g, outs)
    if attn_in.v_rot is not None:
        out = g._hadamard(out, attn_in.v_rot)
    return g.mm(need(w.layer(il, "attn_output")), out)


def build(g: GraphContext, facts: Facts) -> None:
    c, w, cp = g.ctx, g.w, g.cp
    inp = g.inp_embd()
    pos = g.inp_pos()
    # MSA needs flash attention and no unified cache shared by several sequences
    msa_on = cp.flash_attn and (cp.n_seq == 1 or cp.n_stream > 1)
    attn_in = g.attn_inp_kv()
    m = _msa_input(g, attn_in, facts) if msa_on else None
    g.inp_out_ids()
    for il in range(g.hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q = c.rope(g.norm(q, w.layer(il, "attn_q_norm"), None, il), pos)
        k = c.rope(g.norm(k, w.layer(il, "attn_k_norm"), None, il), pos)
        if m is not None and w.layer(il, "indexer.k_proj") is not None:  # the loader's sparse layers
            cur = _sparse(g, m, attn_in, il, cur, pos, q, k, v)
        else:
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k, v)
        ffn_inp, cur = g.ffn_input(il, cur, res)
        if g.dense(il):
            cur = g.layer_ffn(cur, il, act="swiglu_oai")
        else:
            cur = g.add_shexp(routed(g, facts, cur, il, act="swiglu_oai"), cur, il, act="swiglu_oai")
        inp = c.add(cur, ffn_inp)
    g.output(inp)


def _refuses(n_tokens: int, n_stream: int) -> str:
    """MSA's decode form (one token per stream: a gather of the chosen blocks' keys) is not composed, and
    its per-stream form (several sequences without a unified cache) no recorded dump checked."""
    if n_tokens // n_stream == 1:
        return ("compute is not modelled for MiniMax-M3's sparse attention at one token per stream (its decode "
                "form): use a ubatch of more tokens than sequences (-ub), or measure with llama-fit-params -fitp on")
    if n_stream > 1:
        return ("compute is not modelled for MiniMax-M3's sparse attention over several streams (--no-kv-unified "
                "with -np above 1): use one sequence or a unified cache, or measure with llama-fit-params -fitp on")
    return ""


MEMORY = Memory(CHECKED + " (MiniMax-M3)", refuses=_refuses, keys=frozenset({
    "leading_dense_block_count", "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
    "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
    "attention.indexer.block_size", "attention.indexer.local_blocks"}))
