"""Trinity (src/models/afmoe.cpp): gated attention, iSWA, MoE (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Facts, Memory, Swa, Traits, need, routed
from moeconf.memory.graph.blocks import GraphContext

# no window key: no sliding window
TRAITS = Traits(swa=Swa(pattern=4))
MEMORY = Memory(CHECKED + " (Trinity-Mini)", SWA_KEYS | {"leading_dense_block_count"})
NO_ROPE_STEP = 4  # hparams.n_no_rope_layer_step's default (llama-hparams.h)


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, pos, full, swa = g.inputs(iswa=True, scale=True)  # embeddings scaled by sqrt(n_embd) whatever the GGUF says
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        gate = g.mm(need(w.layer(il, "attn_gate")), cur)
        q, k = g.qk_norm(il, q, k)
        if (il + 1) % NO_ROPE_STEP != 0:
            q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(g.attn_inp(il, full, swa), il, None, None, q, k, v, iswa=True)
        cur = c.mul(cur, c.unary(gate, "sigmoid"))
        cur = g.mm(need(w.layer(il, "attn_output")), cur)
        cur = g.norm(cur, w.layer(il, "post_attention_norm"), None, il)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il, "sigmoid"), cur, il)
        cur = g.norm(cur, w.layer(il, "post_ffw_norm"), None, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)
