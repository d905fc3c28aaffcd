"""Gemma 4 (src/models/gemma4.cpp): iSWA, dense FFN beside MoE (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits, blocks_without, need
from moeconf.memory.graph.blocks import GraphContext

# the pattern an array the loader requires (get_arr)
TRAITS = Traits(swa=Swa())
MEMORY = Memory(CHECKED + " (Gemma-4-26B-A4B)", SWA_KEYS | {
    "attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count_swa", "final_logit_softcapping"},
    unmodelled=blocks_without("attn_qkv", ("attn_q.weight",), "Q, K and V fused in one projection, which the "
                              "converter does not write for gemma4"))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = c.scale(g.inp_embd())  # inp_scaled
    pos = g.inp_pos()
    full, swa = g.attn_inp_kv_iswa()
    g.inp_out_ids()
    for il in range(hp.n_layer):
        windowed = bool(g.swa_layers.get(il))
        hd, n_head, n_kv = hp.hk(il), hp.n_head[il], hp.n_head_kv[il]
        T = inp.ne[1]
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        freqs = None if windowed else w.copy("rope_freqs.weight", il)
        q = g.mm(need(w.layer(il, "attn_q")), cur)
        q = c.rope(g.norm(c.reshape(q, hd, n_head, T), w.layer(il, "attn_q_norm"), None, il), pos, freqs)
        k = g.mm(need(w.layer(il, "attn_k")), cur)
        wv = w.layer(il, "attn_v")
        v = g.mm(wv, cur) if wv is not None else k
        k, v = c.reshape(k, hd, n_kv, T), c.reshape(v, hd, n_kv, T)
        k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
        v = c.rms_norm(v)
        k = c.rope(k, pos, freqs)
        cur = g.attn(swa if windowed else full, il, None, None, q, k, v, iswa=True)
        cur = g.mm(need(w.layer(il, "attn_output")), cur)
        cur = g.norm(cur, w.layer(il, "post_attention_norm"), None, il)
        attn_out = c.add(cur, inp)
        cur = g.layer_ffn(g.norm(attn_out, w.layer(il, "ffn_norm"), None, il), il, act="gelu")
        if not g.dense(il):  # a router: the experts beside the dense FFN
            mlp = g.norm(cur, w.layer(il, "post_ffw_norm_1"), None, il)
            moe_in = g.norm(attn_out, w.layer(il, "pre_ffw_norm_2"), None, il)
            tmp = c.mul(c.scale(c.rms_norm(attn_out)), need(w.layer(il, "ffn_gate_inp", "scale")))
            logits = g.mm(need(w.layer(il, "ffn_gate_inp")), tmp)
            moe = g.moe_ffn(moe_in, il, gating="softmax", norm_w=True, act="gelu", logits=logits)
            cur = c.add(mlp, g.norm(moe, w.layer(il, "post_ffw_norm_2"), None, il))
        cur = c.add(g.norm(cur, w.layer(il, "post_ffw_norm"), None, -1), attn_out)
        scale = w.layer(il, "layer_output_scale")
        inp = c.mul(cur, scale) if scale is not None else cur
    # t_h_nextn: the final norm's every row
    g.output(inp, rows="after", softcap="final_logit_softcapping" in facts.floats)
