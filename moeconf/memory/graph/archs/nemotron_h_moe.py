"""src/models/nemotron-h.cpp: Mamba-2, attention and FFN (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import mamba2_layer, unbiased_conv
from moeconf.memory.graph.archs.common import CHECKED, SSM_KEYS, Facts, Memory, Traits, hybrid_inputs, need
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import Tensor

TRAITS = Traits(recurrent="mamba2")
MEMORY = Memory(CHECKED + " (Nemotron-3-Nano-30B-A3B, Nemotron-3-Super-120B-A12B)",
                SSM_KEYS | {"moe_latent_size", "nextn_predict_layers"}, unmodelled=unbiased_conv)


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, rs_in, attn_in = hybrid_inputs(g)
    g.inp_out_ids()
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = mamba2_layer(g, rs_in, cur, il)
        elif w.layer(il, "attn_q") is not None or w.layer(il, "attn_qkv") is not None:
            q, k, v = g.qkv(il, cur)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        else:
            cur = g.layer_ffn(cur, il, act="relu_sqr") if g.dense(il) else _moe(g, facts, cur, il)
        inp = c.add(cur, inp)
    g.output(inp, rows="after")  # t_h_nextn


def _moe(g: GraphContext, facts: Facts, cur: Tensor, il: int) -> Tensor:
    c, w = g.ctx, g.w
    latent_down, latent_up = w.layer(il, "ffn_latent_down"), w.layer(il, "ffn_latent_up")
    moe_in = c.mul_mat(latent_down, cur) if latent_down is not None else cur
    logits = g.mm(need(w.layer(il, "ffn_gate_inp")), cur)
    moe = g.moe_ffn(moe_in, il, gating="sigmoid", norm_w=bool(facts.norm_w), w_scale=facts.w_scale, act="relu_sqr",
                    probs_bias=w.layer(il, "exp_probs_b", "bias"), logits=logits)
    if latent_up is not None:
        moe = c.mul_mat(latent_up, moe)
    return g.add_shexp(moe, cur, il, act="relu_sqr")
