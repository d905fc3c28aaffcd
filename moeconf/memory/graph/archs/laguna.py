"""Laguna (src/models/laguna.cpp): softplus-gated attention (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits, need, routed
from moeconf.memory.graph.blocks import GraphContext

# no window key (Laguna-M.1): every layer full
TRAITS = Traits(swa=Swa(pattern=4, dense_first=True))


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    has_swa = any(g.swa_layers.values())
    inp, pos, full, swa = g.inputs(iswa=has_swa)
    for il in range(hp.n_layer):
        n_head = hp.n_head[il]
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        gate_w = need(w.layer(il, "attn_gate"))
        gate = g.mm(gate_w, cur)
        q = c.rope(g.norm(q, w.layer(il, "attn_q_norm"), None, il), pos)
        k = c.rope(g.norm(k, w.layer(il, "attn_k_norm"), None, il), pos)
        cur = g.attn(g.attn_inp(il, full, swa), il, None, None, q, k, v, iswa=has_swa)
        gate = c.unary(gate, "softplus")
        # one gate value per head, or one per element
        cur = g.gate_heads(cur, gate, n_head) if gate_w.ne[1] == n_head else c.mul(cur, gate)
        ffn_inp, cur = g.ffn_input(il, g.mm(need(w.layer(il, "attn_output")), cur), inp)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il, "sigmoid"), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)


MEMORY = Memory(CHECKED + " (Laguna-XS.2)", keys=SWA_KEYS | {
    "leading_dense_block_count", "expert_gating_func", "expert_weights_scale", "expert_weights_norm"})
