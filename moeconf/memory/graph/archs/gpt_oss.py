"""src/models/openai-moe.cpp: sliding-window and full layers through the iSWA cache pair, the
attention sinks, the router's bias, biased experts with the clamped SwiGLU, the chosen logits
softmaxed; the last layer's output is a graph output (t_h_nextn), its rows taken after the loop."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import REPLAYED, Facts, Swa, Traits, need
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import OUTPUT

ARCH = "gpt-oss"
TRAITS = Traits(swa=Swa(pattern=2), expert_ffn_tensors=2)
MEMORY = REPLAYED


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    full, swa = g.attn_inp_kv_iswa()
    out_ids = g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        q = c.rope(q, pos)
        k = c.rope(k, pos)
        cur = g.attn(swa if g.swa_layers.get(il) else full, il, w.layer(il, "attn_output"),
                     w.layer(il, "attn_output", "bias"), q, k, v, sinks=w.layer(il, "attn_sinks"), iswa=True)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "post_attention_norm"), None, il)
        cur = g.moe_ffn(cur, il, gating="softmax_weight", norm_w=False, act="swiglu_oai",
                        gate_inp_b=w.layer(il, "ffn_gate_inp", "bias"))
        inp = c.add(cur, ffn_inp)
    inp.flags |= OUTPUT  # t_h_nextn
    cur = c.get_rows(inp, out_ids)
    cur = g.norm(cur, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))
    del facts
