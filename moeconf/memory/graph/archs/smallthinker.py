"""SmallThinker (src/models/smallthinker.cpp), without a window (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, built, need
from moeconf.memory.graph.blocks import GraphContext

MEMORY = Memory(CHECKED + " (SmallThinker-4BA0.6B-Instruct)", keys=frozenset())


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp, pos, attn_inp, _ = g.inputs()
    out_ids = built(g.t_out_ids)
    for il in range(hp.n_layer):
        res = inp
        logits = g.mm(need(w.layer(il, "ffn_gate_inp")), inp)
        logits.name = f"ffn_moe_logits-{il}"
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(attn_inp, il, w.layer(il, "attn_output"), None, q, k, v)
        if il == hp.n_layer - 1:
            cur, res, logits = (c.get_rows(t, out_ids) for t in (cur, res, logits))
        ffn_inp, cur = g.ffn_input(il, cur, res, rows=False)
        cur = g.moe_ffn(cur, il, gating=facts.gating_or("softmax"), norm_w=True, act="relu", logits=logits)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))
