"""src/models/deepseek4.cpp: DeepSeek-V4, hyper-connection streams, attention over raw and compressed rows
(CSA, HCA), a MoE with hash-routed first layers (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from dataclasses import dataclass

from moeconf.memory.graph.archs._dsa import lightning_top_k
from moeconf.memory.graph.archs._hc import hc_pre, head_weights, weighted
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Swa, Traits, need
from moeconf.memory.graph.blocks import GraphContext, rotation_width
from moeconf.memory.graph.ggml import Tensor

ARCH = "deepseek4"
# every layer's raw rows in the sliding-window cache (set_swa_pattern(0)); the compressed rows in caches
# of their own (src/llama-kv-cache-dsv4.cpp)
TRAITS = Traits(swa=Swa())
MEMORY = Memory(CHECKED + " (DeepSeek-V4-Flash, DeepSeek-V4-Pro)", frozenset({
    "attention.compress_ratios", "attention.sliding_window", "attention.q_lora_rank", "attention.indexer.head_count",
    "attention.indexer.key_length", "attention.indexer.top_k", "attention.output_group_count",
    "attention.output_lora_rank", "hyper_connection.count", "hash_layer_count", "swiglu_clamp_exp",
    "swiglu_clamp_shexp", "nextn_predict_layers", "attention.compress_rope_freq_base", "hyper_connection.epsilon",
    "hyper_connection.sinkhorn_iterations"}))

CSA, HCA = 4, 128


@dataclass
class _Comp:
    """One compressed cache's graph inputs (llm_graph_input_dsv4::comp_input) and its cells."""

    state_pos: Tensor
    persist_src: Tensor
    persist_dst: Tensor
    read_idxs: Tensor
    write_idxs: Tensor
    write_pos: Tensor
    mask: Tensor
    k_rot: Tensor | None


def _pad(n: int, to: int = 256) -> int:
    return -(-n // to) * to


def _comp_inputs(g: GraphContext, name: str, ratio: int, overlap: bool, state_rows: int, n_kv: int,
                 mask_f16: bool, rot: int) -> _Comp:
    """dsv4_build_comp_inputs on the reserve plan."""
    c = g.ctx
    T, ns = g.n_tokens, g.cp.n_stream
    n_blocks = T // ratio + ns
    n_persist = min(T, state_rows * ns)
    p = f"dsv4_{name}_"
    return _Comp(c.input("I32", T, name=p + "state_pos"), c.input("I32", n_persist, name=p + "state_persist_src_idxs"),
                 c.input("I32", n_persist, name=p + "state_persist_dst_idxs"),
                 c.input("I32", (2 if overlap else 1) * ratio * n_blocks, name=p + "state_read_idxs"),
                 c.input("I64", n_blocks, name=p + "state_write_idxs"),
                 c.input("I32", n_blocks, name=p + "state_write_pos"),
                 c.input("F16" if mask_f16 else "F32", n_kv, T // ns, 1, ns, name=p + "kq_mask"),
                 g.rot_input(rot))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp, cp = g.ctx, g.w, g.hp, g.cp
    hc = facts.hparam("hyper_connection.count")
    n_hash = facts.hparam("hash_layer_count")
    idx_head = facts.hparam("attention.indexer.key_length")
    head = hp.head_k
    inp = g.inp_embd()
    pos = g.inp_pos()
    out_ids = g.inp_out_ids()
    # build_inp_dsv4: the raw rows' indices and mask, then the three compressed caches' inputs
    T = g.n_tokens
    n_raw = cp.n_kv_swa or cp.n_kv
    k_idxs = c.input("I64", T, name="")
    raw_mask = g.kq_mask(n_raw)
    # the caches rotate K where it is quantized, and always at the indexer's head width (llama_kv_cache)
    rot = rotation_width(head) if cp.rot_k or head == idx_head else 0
    raw_rot = g.rot_input(rot)
    n_comp4, n_comp128 = _pad(max(1, -(-cp.n_kv // CSA))), _pad(max(1, -(-cp.n_kv // HCA)))
    csa = _comp_inputs(g, "csa", CSA, True, 2 * CSA, n_comp4, cp.flash_attn, rot)
    hca = _comp_inputs(g, "hca", HCA, False, HCA, n_comp128, cp.flash_attn, rot)
    lid = _comp_inputs(g, "lid", CSA, True, 2 * CSA, n_comp4, True, rotation_width(idx_head))
    g.expand(raw_mask)
    x = c.repeat(c.reshape(inp, hp.n_embd, 1, T), hp.n_embd, hc, T, 1)
    gating = "sqrt_softplus" if facts.gating == 4 else {1: "softmax", 2: "sigmoid"}.get(facts.gating or 0, "softmax")
    act = "silu_clamp" if "swiglu_clamp_exp" in facts.floats else "silu"
    for il in range(hp.n_layer):
        residual = x
        cur, post, comb = hc_pre(g, x, il, "attn", hc, 0, record=False)
        cur = _attention(g, facts, cur, pos, il, k_idxs, raw_mask, raw_rot, csa, hca, lid)
        x = c.dsv4_hc_post(cur, residual, post, comb)
        residual = x
        cur, post, comb = hc_pre(g, x, il, "ffn", hc, 0, record=False)
        for t in (residual, post, comb):
            g.expand(t)
        hashed = il < n_hash  # the experts chosen by token id (ffn_gate_tid2eid), no selection bias
        selected = c.get_rows(need(w.layer(il, "ffn_gate_tid2eid")), need(g.t_inp_tokens)) if hashed else None
        bias = None if hashed else w.layer(il, "exp_probs_b", "bias")
        moe = g.moe_ffn(cur, il, gating=gating, norm_w=bool(facts.norm_w), w_scale=facts.w_scale, act=act,
                        probs_bias=bias, selected=selected)
        x = c.dsv4_hc_post(g.add_shexp(moe, cur, il, act=act), residual, post, comb)
    flat = c.get_rows(c.reshape(x, hp.n_embd * hc, T), out_ids)
    x = c.reshape(flat, hp.n_embd, hc, cp.n_outputs)
    g.output(weighted(g, x, head_weights(g, x, hc), hc))  # build_hc_head: weighted and summed by hand


def _comp_cache(g: GraphContext, il: int, name: str, width: int, cells: int, type_name: str = "") -> Tensor:
    """A compressed cache (in the K cache's type) or a compressor state (`type_name`) on the layer's device."""
    kc = g.kv[il][0]
    return g.ctx.cache(name, type_name or kc.type, (width, cells, g.cp.n_stream), kc.buffer or "CPU")


def _get_k(g: GraphContext, kc: Tensor, n_kv: int) -> Tensor:
    """llama_kv_cache::get_k of a K-only cache of one head."""
    width, size = kc.ne[0], kc.ne[1]
    t = g.ctx.view(kc, (width, 1, size, kc.ne[2]), (kc.nb[1], kc.nb[1], kc.nb[2]), 0)
    return g.ctx.view(t, (width, 1, n_kv, t.ne[3]), (t.nb[1], t.nb[2], t.nb[3]), 0)


def _compressed(g: GraphContext, il: int, cur: Tensor, inp: _Comp, ratio: int, width: int, prefix: str,
                cache: Tensor, name: str) -> None:
    """The compressor, its states made here (`name`'s) (docs/memory.md, "What the larger compositions build")."""
    c, lw = g.ctx, g.w.layer
    overlap = ratio == CSA
    state_kv, state_score = (_comp_cache(g, il, f"dsv4_{name}_state_{k}_l{il}", 2 * width if overlap else width,
                                         2 * ratio if overlap else ratio, "F32") for k in ("kv", "score"))
    kv = g.mm(need(lw(il, f"{prefix}_kv")), cur)
    score = c.add(g.mm(need(lw(il, f"{prefix}_gate")), cur), c.get_rows(need(lw(il, f"{prefix}_ape")), inp.state_pos))
    rows = state_kv.ne[1] * state_kv.ne[2]

    def source(state: Tensor, new: Tensor) -> Tensor:
        all_rows = c.view(state, (state.ne[0], rows), (state.nb[1],), 0)  # get_kv_all
        return c.concat(c.view(all_rows, (all_rows.ne[0], rows), (all_rows.nb[1],), 0), new, 1)

    src_kv, src_score = source(state_kv, kv), source(state_score, score)
    n_blocks = inp.write_pos.ne[0]
    n_read = ratio * n_blocks

    def blocks(src: Tensor) -> Tensor:
        """The blocks' rows, [ratio (twice that overlapped), width, blocks]; overlapped, read past a zero row
        appended (the first row scaled)."""
        if not overlap:
            return c.cont(c.permute(c.reshape(c.get_rows(src, inp.read_idxs), width, ratio, n_blocks), 1, 0, 2, 3))
        zero = c.reshape(c.scale(c.view(src, (src.ne[0],), (), 0)), src.ne[0], 1)
        r = c.get_rows(c.concat(src, zero, 1), inp.read_idxs)
        prev, now = (c.reshape(c.cont(c.view(r, (width, n_read), (r.nb[1],), offset)), width, ratio, n_blocks)
                     for offset in (0, n_read * r.nb[1] + 4 * width))
        return c.cont(c.permute(c.concat(prev, now, 1), 1, 0, 2, 3))

    comp = c.sum_rows(c.mul(blocks(src_kv), c.soft_max(blocks(src_score))))
    comp = c.cont(c.permute(comp, 1, 0, 2, 3))
    comp = g.norm(comp, lw(il, f"{prefix}_norm"), None, il)
    comp = c.rope(comp, inp.write_pos)
    if inp.k_rot is not None:
        comp = g._hadamard(comp, inp.k_rot)
    g.expand(g._cpy_k(cache, comp, inp.write_idxs))
    for state, new in ((state_kv, kv), (state_score, score)):
        persisted = c.get_rows(new, inp.persist_src)
        dst = c.view(state, (state.ne[0], rows), (state.nb[1],), 0)
        g.expand(c.set_rows(dst, persisted, inp.persist_dst))


def _attention(g: GraphContext, facts: Facts, cur: Tensor, pos: Tensor, il: int, k_idxs: Tensor, raw_mask: Tensor,
               raw_rot: Tensor | None, csa: _Comp, hca: _Comp, lid: _Comp) -> Tensor:
    c, lw, hp = g.ctx, g.w.layer, g.hp
    T, n_head, head = cur.ne[1], hp.n_head[il], hp.head_k
    idx_head = facts.hparam("attention.indexer.key_length")
    ratios = facts.ints_of("attention.compress_ratios")
    ratio = ratios[il] if il < len(ratios) else 0
    comp = {CSA: csa, HCA: hca}.get(ratio)  # none at ratio 0 (the raw rows only)
    if comp is not None:
        cache = _comp_cache(g, il, f"cache_k_l{il}", head, comp.mask.ne[0])
        lid_cache = _comp_cache(g, il, f"cache_k_l{il}", idx_head, lid.mask.ne[0]) if comp is csa else None
        _compressed(g, il, cur, comp, ratio, head, "attn_compressor", cache, "csa" if comp is csa else "hca")
        if lid_cache is not None:
            _compressed(g, il, cur, lid, CSA, idx_head, "indexer_compressor", lid_cache, "lid")
    qr = g.norm(g.mm(need(lw(il, "attn_q_a")), cur), lw(il, "attn_q_a_norm"), None, il)
    q = c.rope(c.rms_norm(c.reshape(g.mm(need(lw(il, "attn_q_b")), qr), head, n_head, T)), pos)
    kv = g.norm(g.mm(need(lw(il, "attn_kv")), cur), lw(il, "attn_kv_a_norm"), None, il)
    kv = c.rope(c.reshape(kv, head, 1, T), pos)
    if raw_rot is not None:
        q, kv = g._hadamard(q, raw_rot), g._hadamard(kv, raw_rot)
    g.expand(q)
    g.expand(kv)
    raw_cache = g.kv[il][0]
    g.expand(g._cpy_k(raw_cache, kv, k_idxs))
    raw_k = g._get_k(raw_cache, il, raw_mask.ne[0])
    k_all, mask = raw_k, raw_mask
    if comp is not None:  # CSA's compressed rows through the indexer's top-k, HCA's all visible
        top = _lid_top_k(g, facts, il, qr, cur, pos, lid, lid_cache) if lid_cache is not None else None
        k_all = c.concat(raw_k, _get_k(g, cache, comp.mask.ne[0]), 2)
        sparse = comp.mask if top is None else g.top_k_mask(comp.mask, top, "F16" if g.cp.flash_attn else "F32")
        mask = c.concat(raw_mask, sparse, 0)
    out = g.attn_mha(q, k_all, k_all, mask, lw(il, "attn_sinks"))
    if raw_rot is not None:
        out = g._hadamard(out, raw_rot)
    out = c.rope_back(c.reshape(out, head, n_head, T), pos)
    wo_a = need(lw(il, "attn_output_a"))
    groups = facts.hparam("attention.output_group_count", 1)
    # the loader creates wo_a 3-D, one slice per group (TENSOR_ALLOW_RESHAPE)
    wo_a = c.weight(wo_a.name, wo_a.type, (wo_a.ne[0], wo_a.ne[1] // groups, groups), wo_a.buffer or "CPU", il)
    out = c.permute(c.reshape(out, head * n_head // groups, groups, T), 0, 2, 1, 3)
    oa = c.permute(g.mm(wo_a, out), 0, 2, 1, 3)
    oa = c.cont(oa, oa.ne[0] * oa.ne[1], T)
    return g.mm(need(lw(il, "attn_output_b")), oa)


def _lid_top_k(g: GraphContext, facts: Facts, il: int, qr: Tensor, cur: Tensor, pos: Tensor, lid: _Comp,
               cache: Tensor) -> Tensor:
    """build_lid_top_k: the indexer's queries (RoPE'd, rotated) scored against its compressed keys by
    the fused LIGHTNING_INDEXER, weighted per head; the top-k compressed rows per token."""
    c, lw = g.ctx, g.w.layer
    T, idx_head = cur.ne[1], cache.ne[0]
    q = g.mm(need(lw(il, "indexer.attn_q_b")), qr)
    q = c.rope(c.reshape(q, idx_head, q.ne[0] // idx_head, T), pos)
    assert lid.k_rot is not None
    q = g._hadamard(q, lid.k_rot)
    weights = c.scale(g.mm(need(lw(il, "indexer.proj")), cur))
    return lightning_top_k(g, q, _get_k(g, cache, lid.mask.ne[0]), weights, lid.mask,
                           facts.hparam("attention.indexer.top_k"), False)
