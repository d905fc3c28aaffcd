"""src/models/grok.cpp: embeddings scaled (the loader's default scale unless the GGUF sets 0 or 1: a
scale of exactly 1 is not told apart here), the KQ logits softcapped without flash attention, the
attention's output normed before its residual, a GELU MoE (plus a dense GELU FFN where the layer has
one, the two summed and scaled), normed after; the logits scaled and, where the GGUF sets
final_logit_softcapping, softcapped."""

from __future__ import annotations

from dataclasses import replace

from moeconf.memory.graph.archs.common import REPLAYED, Facts, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "grok"
MEMORY = REPLAYED
FLASH_ATTN_OFF = True  # llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    if "embedding_scale" not in facts.units:
        g.hp = hp = replace(hp, embedding_scale=1.0)
    g.kq_softcap = True
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_in = g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        cur = g.norm(cur, w.layer(il, "attn_output_norm"), None, il)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        moe = g.moe_ffn(cur, il, gating="softmax", norm_w=True, act="gelu")  # no expert_weights_scale read
        if w.layer(il, "ffn_up") is not None:
            dense = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il, act="gelu")
            moe = c.scale(c.add(dense, moe))
        post = w.layer(il, "layer_output_norm") or w.layer(il, "post_ffw_norm")
        cur = g.norm(moe, post, None, il)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    logits = c.scale(g.mm(need(w.get("output.weight")), cur))
    if "final_logit_softcapping" in facts.floats:
        logits = c.scale(c.unary(c.scale(logits), "tanh"))
    g.finish(cur, logits)
