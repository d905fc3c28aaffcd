"""dots3note (src/models/dots3note.cpp): MLA, DSA and windows (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import indexer_top_k, inp_dsa
from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits, built, need, routed
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS

# the pattern an array (attention.sliding_window_pattern)
TRAITS = Traits(swa=Swa(), indexer="typed")


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp, cp = g.ctx, g.w, g.hp, g.cp
    inp = g.inp_embd()
    pos = g.inp_pos()
    # build_attn_inp_k_dsa_iswa: the DSA cache's inputs (the latent's, the indexer's), then the window's
    mla_in, lid_in = inp_dsa(g)
    swa_in = g.attn_inp_k(cp.n_kv_swa)
    g.inp_out_ids()
    for il in range(hp.n_layer):
        swa = bool(g.swa_layers.get(il))
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        attn_inp = cur
        qr = g.mm(need(w.layer(il, "attn_q_a")), cur)
        qr = g.norm(qr, w.layer(il, "attn_q_a_norm"), None, il)
        top_k = None
        if not swa:  # the indexer's keys: the DSA cache's second, K-only cache of one head
            top_k = indexer_top_k(g, il, cur, qr, pos, built(lid_in.k_rot), lid_in.k_idxs, lid_in.mask, g.lid[il],
                                  facts.hparam("attention.indexer.top_k") or None)
        k_b = need(w.layer(il, "attn_k_b"))
        n_head, kv_lora, rope = k_b.ne[2], k_b.ne[1], need(w.layer(il, "attn_k_norm")).ne[0]
        q = g.mm(need(w.layer(il, "attn_q_b")), qr)
        q_nope, q_pe = g.mla_q_parts(q, n_head, q.ne[0] // n_head - rope, rope)
        kv_cmpr, k_pe = g.mla_kv(il, cur, kv_lora, rope)
        k_pe = g.norm(k_pe, w.layer(il, "attn_k_norm"), None, il)
        q_pe, k_pe = c.rope(q_pe, pos), c.rope(k_pe, pos)
        q_cur, k_cur, kv_cmpr = g.mla_absorbed(il, q_nope, q_pe, kv_cmpr, k_pe)
        cur = g.attn_k(swa_in if swa else mla_in, il, None, q_cur, k_cur, kv_cmpr, need(w.layer(il, "attn_v_b")),
                       None if swa else g.top_k_mask(mla_in.mask, built(top_k)))
        gate = c.unary(g.mm(need(w.layer(il, "attn_gate")), attn_inp), "sigmoid")
        cur = g.mm(need(w.layer(il, "attn_output")), g.gate_heads(cur, gate, n_head))
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)


MEMORY = Memory(CHECKED + " (dots3-note-prev)", MLA_KEYS | DSA_KEYS | SWA_KEYS | {
    "attention.indexer.types", "attention.key_length_mla_swa", "attention.kv_lora_rank_swa",
    "attention.value_length_mla_swa", "attention.key_length_swa", "attention.value_length_swa"})
