"""src/models/nemotron-h.cpp (the graph nemotron-h-moe.cpp builds for its trunk): every block one
RMS norm and one mixer, added to the block's input: a Mamba-2 layer (`_mamba.mamba2_layer`), an
attention layer without RoPE, or a feed-forward layer: a MoE routed by sigmoid from the block's input
(a selection bias, the experts squared-ReLU without a gate, optionally reading and writing a latent
projection of the input) beside an ungated squared-ReLU shared expert, or a dense squared-ReLU FFN.
The final norm is the MTP head's seed (an output), the output rows taken after it."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import mamba2_layer
from moeconf.memory.graph.archs.common import REPLAYED, Facts, Traits, need
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import OUTPUT, Tensor

ARCH = "nemotron_h_moe"
TRAITS = Traits(recurrent="mamba2")
MEMORY = REPLAYED


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    g.expand(inp)
    rs_in = g.rs_inp(seqs=True)
    attn_in = g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    w_scale = "expert_weights_scale" in facts.floats
    norm_w = bool(facts.norm_w)
    g.groups = facts.groups  # read for every architecture (llama-model.cpp)
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = mamba2_layer(g, rs_in, cur, il)
        elif w.layer(il, "attn_q") is not None or w.layer(il, "attn_qkv") is not None:
            q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        else:
            cur = _ffn(g, cur, il, norm_w, w_scale)
        inp = c.add(cur, res)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    cur.flags |= OUTPUT  # t_h_nextn
    cur = c.get_rows(cur, out_ids)
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))


def _ffn(g: GraphContext, cur: Tensor, il: int, norm_w: bool, w_scale: bool) -> Tensor:
    c, w = g.ctx, g.w
    gate_inp = w.layer(il, "ffn_gate_inp")
    if gate_inp is None:
        return g.ffn(cur, w.layer(il, "ffn_up"), None, w.layer(il, "ffn_down"), il, act="relu_sqr",
                     up_b=w.layer(il, "ffn_up", "bias"), down_b=w.layer(il, "ffn_down", "bias"))
    latent_down, latent_up = w.layer(il, "ffn_latent_down"), w.layer(il, "ffn_latent_up")
    moe_in = c.mul_mat(latent_down, cur) if latent_down is not None else cur
    logits = g.mm(gate_inp, cur)
    moe = g.moe_ffn(moe_in, il, gating="sigmoid", norm_w=norm_w, w_scale=2.0 if w_scale else 0.0, act="relu_sqr",
                    probs_bias=w.layer(il, "exp_probs_b", "bias"), groups=g.groups, logits=logits)
    if latent_up is not None:
        moe = c.mul_mat(latent_up, moe)
    sh = g.ffn(cur, w.layer(il, "ffn_up_shexp"), None, w.layer(il, "ffn_down_shexp"), il, act="relu_sqr")
    return c.add(moe, sh)
