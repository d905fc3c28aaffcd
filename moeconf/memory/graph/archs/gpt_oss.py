"""gpt-oss (src/models/openai-moe.cpp): iSWA, sinks, MoE (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits
from moeconf.memory.graph.blocks import GraphContext

ARCH = "gpt-oss"
TRAITS = Traits(swa=Swa(pattern=2))
MEMORY = Memory(CHECKED + " (gpt-oss-20b, gpt-oss-120b)", SWA_KEYS)


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, pos, full, swa = g.inputs(iswa=True)
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(g.attn_inp(il, full, swa), il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"),
                     q, k, v, sinks=w.layer(il, "attn_sinks"), iswa=True)
        ffn_inp, cur = g.ffn_input(il, cur, inp, rows=False, norm="post_attention_norm")
        cur = g.moe_ffn(cur, il, gating="softmax_weight", norm_w=False, act="swiglu_oai",
                        gate_inp_b=w.layer(il, "ffn_gate_inp", "bias"))
        inp = c.add(cur, ffn_inp)
    g.output(inp, rows="before")  # t_h_nextn
