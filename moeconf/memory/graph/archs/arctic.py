"""Arctic (src/models/arctic.cpp): a dense FFN, the MoE beside it (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory
from moeconf.memory.graph.blocks import GraphContext

MEMORY = Memory(CHECKED + " (Snowflake-Arctic)")


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, pos, attn_in, _ = g.inputs()
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur, res = g.out_rows(il, g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k, v), inp)
        ffn_inp, cur = g.ffn_input(il, cur, res, rows=False)
        ffn_out = c.add(g.layer_ffn(cur, il), ffn_inp)
        cur = g.norm(res, w.layer(il, "ffn_norm_exps"), None, il)
        cur = g.moe_ffn(cur, il, gating="softmax", norm_w=True)  # its loader reads no expert_weights_scale
        inp = c.add(cur, ffn_out)
    g.output(inp)
