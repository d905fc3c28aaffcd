"""Granite SWA (src/models/granite-swa.cpp): Granite's iSWA (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits
from moeconf.memory.graph.blocks import GraphContext

# the loader requires the window and the per-layer pattern
TRAITS = Traits(swa=Swa())


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, pos, full, swa = g.inputs(iswa=True)
    rope, res_scale = facts.ints_of("attention.rope_pattern"), "residual_scale" in facts.floats
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        if il >= len(rope) or rope[il]:
            freqs = w.copy("rope_freqs.weight", il)
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
        cur = g.attn(g.attn_inp(il, full, swa), il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"),
                     q, k, v, sinks=w.layer(il, "attn_sinks"), iswa=True)
        cur, res = g.out_rows(il, cur, inp)
        ffn_inp = c.add(c.scale(cur) if res_scale else cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(g.moe_ffn(cur, il), cur, il, act="swiglu")
        inp = c.add(c.scale(cur) if res_scale else cur, ffn_inp)
    g.output(inp, scale=True)  # logit_scale: a key the loader requires


MEMORY = Memory(CHECKED + " (granite-swash-3b-a600m)", SWA_KEYS | {"attention.rope_pattern"})
