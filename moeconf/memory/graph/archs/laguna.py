"""Laguna (src/models/laguna.cpp): per-layer head counts; with a sliding window (XS.2) full and
windowed layers through the iSWA pair, else one cache (M.1); per-head Q/K norms before RoPE;
attention without its output projection, then a softplus gate projected from the layer's input,
per head (one value broadcast over the head) or per element as the gate's width says, then the
output projection; dense leading layers, then routed experts (sigmoid unless `expert_gating_func`
says otherwise, a selection bias) beside an always-on shared expert."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, GATING, Facts, Memory, Swa, Traits, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "laguna"
# no window key (Laguna-M.1): every layer full
TRAITS = Traits(swa=Swa(pattern=4, dense_first=True))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    has_swa = any(g.swa_layers.values())
    full, swa = g.attn_inp_kv_iswa() if has_swa else (g.attn_inp_kv(), None)
    out_ids = g.inp_out_ids()
    gating = GATING.get(facts.gating or 0, "sigmoid")
    w_scale = 2.0 if "expert_weights_scale" in facts.floats else 0.0
    T = g.n_tokens
    for il in range(hp.n_layer):
        res = inp
        n_head = hp.n_head[il]
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, n_head, hp.n_head_kv[il], hp.head_k, hp.head_v)
        gate_w = need(w.layer(il, "attn_gate"))
        gate = g.mm(gate_w, cur)
        q = c.rope(g.norm(q, w.layer(il, "attn_q_norm"), None, il), pos)
        k = c.rope(g.norm(k, w.layer(il, "attn_k_norm"), None, il), pos)
        inp_attn = swa if swa is not None and g.swa_layers.get(il) else full
        cur = g.attn(inp_attn, il, None, None, q, k, v, iswa=has_swa)
        gate = c.unary(gate, "softplus")
        if gate_w.ne[1] == n_head:  # one gate value per head
            cur = c.mul(c.reshape(cur, hp.head_v, n_head, T), c.reshape(gate, 1, n_head, T))
            cur = c.reshape(cur, hp.head_v * n_head, T)
        else:
            cur = c.mul(cur, gate)
        cur = g.mm(need(w.layer(il, "attn_output")), cur)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        else:
            moe = g.moe_ffn(cur, il, gating=gating, norm_w=bool(facts.norm_w), w_scale=w_scale,
                            probs_bias=w.layer(il, "exp_probs_b", "bias"))
            sh = g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"), w.layer(il, "ffn_down_shexp"),
                       il)
            cur = c.add(moe, sh)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))


MEMORY = Memory(CHECKED + " (Laguna-XS.2)", keys=frozenset({
    "leading_dense_block_count", "expert_gating_func", "expert_weights_scale", "expert_weights_norm",
    "attention.sliding_window", "attention.sliding_window_pattern"}))
