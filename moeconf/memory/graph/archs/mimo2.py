"""MiMo-V2 (src/models/mimo2.cpp): full and sliding-window layers through the iSWA cache pair, each
with its own KV head count, V narrower than K, attention sinks where the layer has them, the
attention output scaled by `attention.value_scale` where that is not 1; a dense first layer, then
sigmoid-routed experts with a selection bias and normalised weights (never scaled: the loader reads
no expert_weights_scale). The MTP block is its own graph (the draft context's), not the trunk's."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Swa, Traits, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "mimo2"
# the pattern an array the loader requires (get_arr)
TRAITS = Traits(swa=Swa())


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    full, swa = g.attn_inp_kv_iswa()
    out_ids = g.inp_out_ids()
    v_scale = "attention.value_scale" in facts.floats
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        q = c.rope(q, pos)
        k = c.rope(k, pos)
        cur = g.attn(swa if g.swa_layers.get(il) else full, il, w.layer(il, "attn_output"), None, q, k, v,
                     sinks=w.layer(il, "attn_sinks"), iswa=True)
        if v_scale:
            cur = c.scale(cur)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il,
                        up_b=w.layer(il, "ffn_up", "bias"), gate_b=w.layer(il, "ffn_gate", "bias"),
                        down_b=w.layer(il, "ffn_down", "bias"))
        else:
            cur = g.moe_ffn(cur, il, gating="sigmoid", norm_w=True, probs_bias=w.layer(il, "exp_probs_b", "bias"))
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))


MEMORY = Memory(CHECKED + " (MiMo-V2-Flash)", keys=frozenset({
    "attention.sliding_window", "attention.sliding_window_pattern", "attention.value_scale", "nextn_predict_layers"}))
