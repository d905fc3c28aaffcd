"""Refact (src/models/refact.cpp): ALiBi, the layer's FFN (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory
from moeconf.memory.graph.blocks import GraphContext


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp = g.inp_embd()
    attn = g.attn_inp_kv()
    g.inp_out_ids()
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        cur = g.attn(attn, il, w.layer(il, "attn_output"), None, q, k, v)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        cur = g.layer_ffn(cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)


MEMORY = Memory(CHECKED + " (a synthetic Refact with 8 experts on Refact-1.6B's widths)")
