"""src/models/qwen4exp.cpp: Qwen3.5's gated delta net and gated attention with low-rank hyper-connections,
the QSA indexer and the PLE n-gram module (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from dataclasses import replace
from functools import reduce

from moeconf.memory.graph.archs._deltanet import conv_state_at, delta_net_layer, gated_attn_layer, gated_shexp_moe
from moeconf.memory.graph.archs._hc import fused, stream
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, need
from moeconf.memory.graph.blocks import GraphContext, RsInput
from moeconf.memory.graph.ggml import Tensor
from moeconf.model.inventory import Inventory

ARCH = "qwen4exp"
TRAITS = Traits(recurrent="delta_net", indexer="all")


# the sizes the loader requires that the graph's shapes do not carry (the PLE ones where ple.layers names a block)
_SIZES = ("hyper_connection.count", "attention.indexer.head_count", "attention.indexer.top_k",
          "attention.compress_ratios")
_PLE_SIZES = ("ple.ngram_size", "ple.heads_per_ngram", "ple.conv_kernel")


def _unmodelled(inv: Inventory) -> list[str]:
    """The files the engine refuses (a size missing) or whose graph no recorded dump has: a full-attention
    block with compress ratio 0 attends densely (build_layer_attn)."""
    md = inv.metadata
    missing = [k for k in _SIZES + (_PLE_SIZES if md.hparam("ple.layers") is not None else ())
               if md.hparam(k) is None]
    if missing:
        names = ", ".join(f"qwen4exp.{k}" for k in missing)
        return [f"memory is not modelled for this qwen4exp file: it lacks {names} (the engine needs them)"]
    ratios = md.hparam("attention.compress_ratios")
    full = sorted({t.layer for t in inv.tensors if t.layer is not None and t.name.endswith(".attn_q.weight")})
    dense = [il for il in full if not (ratios if isinstance(ratios, int) else
                                       ratios[il] if isinstance(ratios, tuple) and il < len(ratios) else 0)]
    return [f"memory is not modelled for qwen4exp's dense full-attention blocks (compress ratio 0: blocks {dense}); "
            "measure this model with llama.cpp's llama-fit-params -fitp on"] if dense else []


# the loader's keys: the delta net's and the layer map's (memory/recurrent.py), the indexer cache's width
# (memory/indexer.py), and what the graph reads
MEMORY = Memory(CHECKED + " (Qwen3.8-Flash-Next)", unmodelled=_unmodelled, keys=frozenset({
    "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count",
    "full_attention_interval", "attention.recurrent_layers", "rope.dimension_sections",
    "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
    "attention.compress_ratios", "hyper_connection.count", "hyper_connection.low_rank", "ple.layers",
    "ple.ngram_size", "ple.heads_per_ngram", "ple.conv_kernel", "embedding_length_per_layer_input",
    "ple.eos_token_id", "ple.image_token_id", "ple.layer_multipliers", "ple.head_offsets", "ple.head_vocab_sizes"}))


def _gamma(g: GraphContext, name: str, hc: int, il: int) -> Tensor:
    """A grouped norm's gamma as the loader creates it, [n_embd, hc] (TENSOR_ALLOW_RESHAPE)."""
    t = need(g.w.get(name))
    return g.ctx.weight(t.name, t.type, (t.ne[0] // hc, hc), t.buffer or "CPU", il)


def _hc_mix(g: GraphContext, x: Tensor, prefix: str, il: int, hc: int, inject: bool) -> tuple[Tensor, Tensor | None]:
    c, w = g.ctx, g.w
    n_embd, T = x.ne[0], x.ne[2]
    xn = c.mul(c.rms_norm(x), _gamma(g, f"{prefix}_norm.weight", hc, il))
    xn = c.reshape(xn, n_embd * hc, T)
    lo = c.unary(c.scale(g.mm(need(w.get(f"{prefix}_down.weight")), xn)), "silu")
    gate = g.mm(need(w.get(f"{prefix}_up.weight")), lo)
    if il >= 0 and "DSV4_HC_PRE" not in g.cp.unfused:
        mixed = c.dsv4_hc_pre(c.reshape(xn, n_embd, hc, T), c.reshape(gate, n_embd, hc, T))
        mixed = fused(g, "DSV4_HC_PRE", mixed, il)
    else:
        gated = c.reshape(c.mul(xn, c.unary(gate, "sigmoid")), n_embd, hc, T)
        mixed = c.scale(reduce(c.add, (stream(g, gated, s) for s in range(1, hc)), c.cont(stream(g, gated, 0))))
    return mixed, (g.mm(need(w.get(f"{prefix}_inject.weight")), xn) if inject else None)


def _hc_combine(g: GraphContext, res: Tensor, out: Tensor, inject: Tensor, il: int, hc: int) -> Tensor:
    c = g.ctx
    wt = c.scale(c.unary(c.scale(inject), "sigmoid"))
    if "DSV4_HC_POST" not in g.cp.unfused:
        return fused(g, "DSV4_HC_POST", c.dsv4_hc_post(out, res, wt, None), il)
    n_embd, T = res.ne[0], res.ne[2]
    b = c.repeat(c.reshape(out, n_embd, 1, T), n_embd, hc, T, 1)
    return c.add(res, c.mul(b, c.reshape(wt, 1, hc, T)))


class _Qsa:
    """llm_graph_input_qsa: one set per compress ratio."""

    def __init__(self, g: GraphContext, r: int, blk_bias: bool) -> None:
        c, cp = g.ctx, g.cp
        n_kv, ns = cp.n_kv, cp.n_stream
        n_blocks = -(-n_kv // r)
        self.k_idxs = c.input("I64", g.n_tokens, name="attn_inp_k_idxs")
        self.cell_blk = c.input("I32", n_kv, ns, name="")
        self.blk_cells = c.input("I32", r * n_blocks, ns, name="")
        self.blk_pos = c.input("I32", 4 * n_blocks * ns, name="")
        self.bias = c.input("F32", n_blocks if blk_bias else n_kv, g.n_tokens // ns, ns, name="")


def _qsa_top_k(g: GraphContext, qsa: dict[int, _Qsa], cur: Tensor, pos: Tensor, mask: Tensor, il: int,
               facts: Facts) -> Tensor:
    c, w, cp = g.ctx, g.w, g.cp
    kc = g.lid[il]
    dim, n_h = kc.ne[0], facts.hparam("attention.indexer.head_count")
    ratios = facts.ints_of("attention.compress_ratios")  # one value for every block, or one per block
    r = ratios[il if len(ratios) > 1 else 0]
    n_kv, ns, T = cp.n_kv, cp.n_stream, cur.ne[1]
    n_blocks, n_tps = -(-n_kv // r), T // ns
    blk_bias = mask.ne[0] == n_kv and mask.ne[1] == n_tps and mask.ne[3] == ns
    if r not in qsa:
        qsa[r] = _Qsa(g, r, blk_bias)
    inp = qsa[r]
    k_raw = c.reshape(g.mm(need(w.layer(il, "indexer.k_proj")), cur), dim, 1, T)
    g.expand(g._cpy_k(kc, k_raw, inp.k_idxs))
    k_all = g.get_k_one(kc, n_kv)
    k_all = c.view(k_all, (dim, n_kv, ns), (k_all.nb[2], k_all.nb[3]), 0)
    members = c.reshape(c.get_rows(k_all, inp.blk_cells), dim, r, n_blocks, ns)
    pooled = reduce(c.add, (c.cont(c.view(members, (dim, n_blocks, ns), (members.nb[2], members.nb[3]),
                                          i * members.nb[1])) for i in range(r)))
    pooled = c.reshape(c.scale(pooled), dim, n_blocks * ns, 1)
    pooled = g.norm(pooled, w.layer(il, "indexer.k_norm"), None, il)
    pooled = c.rope(c.reshape(pooled, dim, 1, n_blocks * ns), inp.blk_pos)
    pooled = c.reshape(pooled, dim, n_blocks, ns)
    q = c.reshape(g.mm(need(w.layer(il, "indexer.q_proj")), cur), dim, n_h, T)
    q = c.rope(g.norm(q, w.layer(il, "indexer.q_norm"), None, il), pos)
    score = c.mul_mat(pooled, c.reshape(q, dim, n_h * n_tps, ns))
    score = c.unary(c.reshape(score, n_blocks, n_h, n_tps, ns), "relu")

    def head(h: int) -> Tensor:
        return c.view(score, (n_blocks, n_tps, ns), (score.nb[2], score.nb[3]), h * score.nb[1])

    summed = reduce(c.add, (head(h) for h in range(1, n_h)), c.cont(head(0)))
    if blk_bias:
        summed = c.add(summed, inp.bias)
    expanded = c.get_rows(c.cont(c.permute(summed, 1, 0, 2, 3)), inp.cell_blk)
    expanded = c.cont(c.permute(expanded, 1, 0, 2, 3))
    if blk_bias:
        m = mask if mask.type == "F32" else c.cast(mask, "F32")
        expanded = c.add(expanded, c.reshape(m, n_kv, n_tps, ns))
    else:
        expanded = c.add(expanded, inp.bias)
    width = min(n_kv, facts.hparam("attention.indexer.top_k") + r - 1)
    return c.reshape(c.cont(c.top_k(expanded, width)), width, n_tps, 1, ns)


def _ple(g: GraphContext, rs_in: RsInput, emb: Tensor, hidden: Tensor, il: int, hc: int, facts: Facts) -> Tensor:
    """build_ple (docs/memory.md, "What the larger compositions build")."""
    c, w, hp = g.ctx, g.w, g.hp
    n_embd, T = hp.n_embd, g.n_tokens
    key = g.mm(need(w.layer(il, "ple_key")), emb)
    value = g.mm(need(w.layer(il, "ple_value")), emb)

    def grouped(x: Tensor, name: str) -> Tensor:
        return c.mul(c.rms_norm(c.reshape(x, n_embd, hc, T)), _gamma(g, f"blk.{il}.{name}.weight", hc, il))

    s = c.scale(c.sum_rows(c.mul(grouped(key, "ple_norm_key"), grouped(hidden, "ple_norm_query"))))
    mag = c.sqrt(c.clamp(c.unary(s, "abs")))
    gate = c.unary(c.mul(c.unary(s, "sgn"), mag), "sigmoid")
    gated = c.mul(c.repeat(c.reshape(value, n_embd, 1, T), n_embd, hc, T, 1), gate)
    normed = c.reshape(grouped(c.reshape(gated, n_embd * hc, T), "ple_norm_conv"), n_embd * hc, T)
    kern, dil = facts.hparam("ple.conv_kernel"), facts.hparam("ple.ngram_size")
    hist, n_seqs = (kern - 1) * dil, rs_in.n_seqs
    hc_dim, n_st = n_embd * hc, T // n_seqs
    row = g.ctx.cache(f"cache_ple_r_l{il}", "F32", (hist * hc_dim, g.cp.n_rs), g.rs[il][0].buffer or "CPU")
    padded = conv_state_at(g, rs_in, row, c.reshape(normed, hc_dim, n_st, n_seqs), hist, hc_dim)
    conv = need(w.layer(il, "ple_conv1d"))
    out: Tensor | None = None
    for k in range(kern):
        start = hist - (kern - 1 - k) * dil
        shifted = c.cont(c.transpose(c.view(padded, (n_st, hc_dim, n_seqs), (padded.nb[1], padded.nb[2]), 4 * start)))
        wk = c.reshape(c.cont(c.view(conv, (1, hc_dim), (conv.nb[1],), k * conv.nb[0])), hc_dim)
        if wk.type != "F32":
            wk = c.cast(wk, "F32")
        term = c.mul(shifted, wk)
        out = term if out is None else c.add(out, term)
    assert out is not None
    out = c.reshape(c.cont(c.unary(out, "silu")), n_embd, hc, T)
    return c.add(hidden, c.add(gated, out))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    hc = facts.hparam("hyper_connection.count")
    for il, kc in g.lid.items():  # llama_memory_hybrid_idx's indexer cache, created with the prefix "idx_"
        kc.name = f"cache_idx_k_l{il}"
    inp = g.inp_embd()
    g.expand(inp)
    rs_in = g.rs_inp()
    attn_in = g.attn_inp_kv()
    pos = g.inp_pos(4)
    out_ids = g.inp_out_ids()
    T = g.n_tokens
    emb: Tensor | None = None
    ple_layers = set(facts.ints_of("ple.layers"))
    if ple_layers:
        table = need(w.get("per_layer_token_embd.weight"))
        n_heads = (facts.hparam("ple.ngram_size") - 1) * facts.hparam("ple.heads_per_ngram")
        emb = c.reshape(c.get_rows(table, c.input("I32", n_heads * T, name="")), table.ne[0] * n_heads, T)
        g.expand(emb)
    x = c.repeat(c.reshape(inp, hp.n_embd, 1, T), hp.n_embd, hc, T, 1)
    qsa: dict[int, _Qsa] = {}
    for il in range(hp.n_layer):
        if il in ple_layers:
            assert emb is not None
            x = _ple(g, rs_in, emb, x, il, hc, facts)
        cur, inject = _hc_mix(g, x, f"blk.{il}.hc_attn", il, hc, True)
        g.expand(cur)
        if il in g.rs:
            cur = delta_net_layer(g, rs_in, cur, il, repeat=False, square_v=True, z_act="sigmoid", conv_at=True)
        # (the loader creates these layers' attn_q, attn_k and attn_v apart and no attention biases: gated_attn_layer's
        # fused and biased forms do not arise)
        elif il in g.lid:  # the attention through the QSA indexer's cells
            top = _qsa_top_k(g, qsa, cur, pos, attn_in.mask, il, facts)
            mask = g.top_k_mask(attn_in.mask, top)
            cur = gated_attn_layer(g, replace(attn_in, mask=mask), cur, pos, il, reshape=False)
        else:
            cur = gated_attn_layer(g, attn_in, cur, pos, il, reshape=False)
        assert inject is not None
        if il == hp.n_layer - 1:
            cur, inject = c.get_rows(cur, out_ids), c.get_rows(inject, out_ids)
            x = c.reshape(c.get_rows(c.reshape(x, hp.n_embd * hc, x.ne[2]), out_ids), hp.n_embd, hc, out_ids.ne[0])
        x = _hc_combine(g, x, cur, inject, il, hc)
        cur, inject = _hc_mix(g, x, f"blk.{il}.hc_ffn", il, hc, True)
        assert inject is not None
        # the loader requires the shared expert (its four tensors flag 0; model/layertable.py refuses a file without)
        x = _hc_combine(g, x, gated_shexp_moe(g, cur, il), inject, il, hc)
        g.cb(x, "l_last", il)  # the engine's callback pins it to the layer's device under 32 tokens
    cur, _ = _hc_mix(g, x, "output_hc", -1, hc, False)
    logits = g.mm(need(w.get("output.weight")), cur)
    g.finish(cur, logits)
