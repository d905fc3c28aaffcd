"""Maple (src/models/maple.cpp): iSWA, clamped experts (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits
from moeconf.memory.graph.blocks import GraphContext

# the window and the per-layer pattern are required keys (load_arch_hparams)
TRAITS = Traits(swa=Swa())
MEMORY = Memory(CHECKED + " (maple-preview)", SWA_KEYS | {"swiglu_clamp_exp"})


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, pos, full, swa = g.inputs(iswa=True)
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q, k = g.qk_norm(il, q, k)
        if g.swa_layers.get(il):
            q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(g.attn_inp(il, full, swa), il, w.layer(il, "attn_output"), None, q, k, v, iswa=True)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        cur = g.moe_ffn(cur, il, act="silu_clamp" if facts.above("swiglu_clamp_exp", il) else "silu")
        inp = c.add(cur, ffn_inp)
    g.output(inp)
