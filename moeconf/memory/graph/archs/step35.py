"""Step-3.5 (src/models/step35.cpp): iSWA, gated heads (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Swa, Traits, blocks_without, need, routed
from moeconf.memory.graph.blocks import GraphContext

# the pattern an array the loader requires (get_arr)
TRAITS = Traits(swa=Swa())
EPS = 1e-6
MEMORY = Memory(CHECKED + " (Step-3.5-Flash)", frozenset({
    "attention.sliding_window", "attention.sliding_window_pattern", "nextn_predict_layers", "swiglu_clamp_exp",
    "swiglu_clamp_shexp"}), unmodelled=blocks_without("attn_q", (
        "attn_q_norm.weight", "attn_k_norm.weight", "attn_gate.weight"), "the engine then skips that norm or gate"))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp, pos, full, swa = g.inputs(iswa=True)
    for il in range(hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        if w.layer(il, "attn_q_norm") is not None:
            q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
        if w.layer(il, "attn_k_norm") is not None:
            k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
        freqs = None if g.swa_layers.get(il) else w.copy("rope_freqs.weight", il)
        q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
        att = g.attn(g.attn_inp(il, full, swa), il, None, None, q, k, v, iswa=True)
        gate_w = w.layer(il, "attn_gate")
        if gate_w is not None:  # head-wise gate: sigmoid(g_proj(x)) broadcast over each head
            att = g.gate_heads(att, c.unary(g.mm(gate_w, cur), "sigmoid"), hp.n_head[il])
        cur = g.mm(need(w.layer(il, "attn_output")), att)
        ffn_inp, cur = g.ffn_input(il, cur, inp, rows=False)
        # the SwiGLU limited where the layer's limit is above build_ffn's / build_moe_ffn's epsilon: the dense
        # FFN and the shared expert by swiglu_clamp_shexp, the routed experts by swiglu_clamp_exp
        sh_clamp = facts.above("swiglu_clamp_shexp", il, EPS)
        if g.dense(il):
            cur = g.layer_ffn(cur, il, clamp=sh_clamp)
        else:
            moe = routed(g, facts, cur, il, "sigmoid", clamp=facts.above("swiglu_clamp_exp", il, EPS))
            cur = g.add_shexp(moe, cur, il, clamp=sh_clamp)
        inp = c.add(cur, ffn_inp)
    g.output(inp, rows="before")  # t_h_nextn: the last layer's every row
