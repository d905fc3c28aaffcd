"""Trinity (src/models/afmoe.cpp): the embeddings scaled; sliding-window and full layers through the
iSWA cache pair, RoPE on every layer but each fourth (the loader's default no-RoPE step, never read
from the GGUF); Q and K normed per head; the attention's output gated by the sigmoid of a projection
of the layer's input before the output projection; norms before and after both the attention and
the FFN; dense leading layers, then a sigmoid-routed MoE with a selection bias and a shared expert."""

from __future__ import annotations

from dataclasses import replace

from moeconf.memory.graph.archs.common import CHECKED, GATING, Facts, Memory, Swa, Traits, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "afmoe"
# no window key: no sliding window
TRAITS = Traits(swa=Swa(pattern=4))
MEMORY = Memory(CHECKED + " (Trinity-Mini)", keys=frozenset({
    "attention.sliding_window", "attention.sliding_window_pattern", "leading_dense_block_count"}))
NO_ROPE_STEP = 4  # hparams.n_no_rope_layer_step's default (llama-hparams.h)


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    g.hp = hp = replace(g.hp, embedding_scale=1.0)  # scaled by sqrt(n_embd) whatever the GGUF says
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    full, swa = g.attn_inp_kv_iswa()
    out_ids = g.inp_out_ids()
    gating = GATING.get(facts.gating or 0, "sigmoid")
    norm_w = bool(facts.norm_w)
    w_scale = 2.0 if "expert_weights_scale" in facts.floats else 0.0
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        gate = g.mm(need(w.layer(il, "attn_gate")), cur)
        q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
        k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
        if (il + 1) % NO_ROPE_STEP != 0:
            q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(swa if g.swa_layers.get(il) else full, il, None, None, q, k, v, iswa=True)
        cur = c.mul(cur, c.unary(gate, "sigmoid"))
        cur = g.mm(need(w.layer(il, "attn_output")), cur)
        cur = g.norm(cur, w.layer(il, "post_attention_norm"), None, il)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        else:
            moe = g.moe_ffn(cur, il, gating=gating, norm_w=norm_w, w_scale=w_scale,
                            probs_bias=w.layer(il, "exp_probs_b", "bias"))
            if w.layer(il, "ffn_up_shexp") is not None:
                moe = c.add(moe, g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"),
                                       w.layer(il, "ffn_down_shexp"), il))
            cur = moe
        cur = g.norm(cur, w.layer(il, "post_ffw_norm"), None, il)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))
