"""Jamba (src/models/jamba.cpp): Mamba-1 and attention (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import mamba_layer
from moeconf.memory.graph.archs.common import CHECKED, SSM_KEYS, Facts, Memory, Traits, hybrid_inputs
from moeconf.memory.graph.blocks import GraphContext

# Mamba-1: its loader reads no ssm.group_count
TRAITS = Traits(recurrent="mamba")
MEMORY = Memory(CHECKED + " (Jamba-Mini-1.5)", SSM_KEYS - {"ssm.group_count"})


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, rs_in, attn_in = hybrid_inputs(g)
    g.inp_out_ids()
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = mamba_layer(g, rs_in, cur, il)
        else:
            q, k, v = g.qkv(il, cur)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k, v)
        cur, inp = g.out_rows(il, cur, inp)
        ffn_inp = c.add(inp, cur)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.moe_ffn(cur, il, gating="softmax", norm_w=False,
                                                                  w_scale=facts.w_scale)
        inp = c.add(ffn_inp, cur)
    g.output(inp)
