"""Cohere2-MoE (src/models/cohere2moe.cpp): Cohere's parallel block: one norm (a layer norm unless
the GGUF gives an RMS epsilon) feeds both the attention and the FFN, and the layer's output is the
FFN's plus the layer's input plus the attention's. Sliding-window and full layers through the iSWA
cache pair (the full layer first in each pattern), RoPE on the windowed layers and the dense leading
ones only; a dense FFN on the leading layers, then a sigmoid-routed MoE (no selection bias) whose
shared expert is added and the sum halved. The final norm is a graph output (the MTP head's input),
the output rows taken after it, the logits scaled by logit_scale where it is not 0 (a logit_scale of
exactly 1, also scaled by the engine, is not told apart from 0 here: an in-place scale either way)."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, GATING, Facts, Memory, Swa, Traits, need
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import OUTPUT

ARCH = "cohere2moe"
TRAITS = Traits(swa=Swa(pattern=4, dense_first=True))
MEMORY = Memory(CHECKED + " (a Cohere2-MoE 30B-A3B layout)", keys=frozenset({
    "attention.sliding_window", "attention.sliding_window_pattern", "leading_dense_block_count"}))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    rms = "attention.layer_norm_rms_epsilon" in facts.floats
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    full, swa = g.attn_inp_kv_iswa()
    out_ids = g.inp_out_ids()
    gating = GATING.get(facts.gating or 0, "sigmoid")
    norm_w = bool(facts.norm_w)
    w_scale = 2.0 if "expert_weights_scale" in facts.floats else 0.0
    for il in range(hp.n_layer):
        windowed = g.swa_layers.get(il, False)
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il, rms)
        ffn_in = cur
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        if windowed or w.layer(il, "ffn_gate_inp") is None:  # the dense leading layers take RoPE too
            freqs = w.copy("rope_freqs.weight", il)
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
        attn_out = g.attn(swa if windowed else full, il, w.layer(il, "attn_output"),
                          w.layer(il, "attn_output", "bias"), q, k, v, iswa=True)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(ffn_in, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        else:
            cur = g.moe_ffn(ffn_in, il, gating=gating, norm_w=norm_w, w_scale=w_scale)
            if w.layer(il, "ffn_up_shexp") is not None:
                sh = g.ffn(ffn_in, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"),
                           w.layer(il, "ffn_down_shexp"), il)
                cur = c.scale(c.add(cur, sh))
        inp = c.add(c.add(cur, inp), attn_out)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1, rms)
    cur.flags |= OUTPUT  # t_h_nextn
    cur = c.get_rows(cur, out_ids)
    logits = g.mm(need(w.get("output.weight")), cur)
    if "logit_scale" in facts.floats:
        logits = c.scale(logits)
    g.finish(cur, logits)
