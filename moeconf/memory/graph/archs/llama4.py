"""Llama 4 (src/models/llama4.cpp): chunked attention, MoE (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits
from moeconf.memory.graph.blocks import GraphContext

MEMORY = Memory(CHECKED + " (Llama-4-Maverick)", SWA_KEYS | {"interleave_moe_layer_step"})
# chunked (8192) unless its GGUF sets sliding_window 0
TRAITS = Traits(swa=Swa(kind="chunked", window=8192, pattern=4))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd()
    pos = g.inp_pos()
    attn_scale = g.ctx.input("F32", 1, 1, g.n_tokens, name="inp_attn_scale")
    chunked = any(g.swa_layers.values())
    full, swa = g.attn_inp_kv_iswa() if chunked else (g.attn_inp_kv(), None)
    g.inp_out_ids()
    for il in range(hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        if not chunked or (il + 1) % 4 != 0:  # RoPE but on every fourth layer where chunked
            freqs = w.copy("rope_freqs.weight", il)
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
            if hp.n_expert != 128:  # Q and K L2-normed unless the model has 128 experts
                q, k = c.rms_norm(q), c.rms_norm(k)
        else:
            q = c.mul(q, attn_scale)
        cur = g.attn(g.attn_inp(il, full, swa), il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"),
                     q, k, v, iswa=chunked)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        if g.dense(il):
            cur = g.layer_ffn(cur, il)
        else:
            moe = g.moe_ffn(cur, il, gating="sigmoid", norm_w=False, weight_before=True, w_scale=facts.w_scale)
            cur = g.add_shexp(moe, cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)
