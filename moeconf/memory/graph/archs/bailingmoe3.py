"""Ling 3.0 (src/models/bailingmoe3.cpp): KDA and MLA layers (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._deltanet import kda_layer
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, hybrid_inputs, need, routed
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor

# its hybrid memory keeps a KV cache for the nextn blocks too
TRAITS = Traits(nextn_kv=True)
MEMORY = Memory(CHECKED + " (Ling-3.0-Flash)", keys=frozenset({
    "attention.key_length_mla", "attention.value_length_mla", "attention.kv_lora_rank", "attention.q_lora_rank",
    "kda.head_dim", "kda.gate_lower_bound", "kda.safe_gate", "ssm.conv_kernel", "leading_dense_block_count",
    "nextn_predict_layers"}))


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, rs_in, attn_in = hybrid_inputs(g, k_only=True)
    pos = g.inp_pos()
    g.inp_out_ids()
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        cur = kda_layer(g, rs_in, cur, il, "sigmoid") if il in g.rs else _mla_layer(g, attn_in, cur, pos, il)
        ffn_inp, cur = g.ffn_input(il, cur, inp, rows=False)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp, rows="after")  # t_h_nextn


def _mla_layer(g: GraphContext, attn_in: AttnInput, cur: Tensor, pos: Tensor, il: int) -> Tensor:
    c, w, hp, d = g.ctx, g.w, g.hp, g.mla
    n_head, T = hp.n_head[il], cur.ne[1]
    q_nope, q_pe = g.mla_q_parts(g.mla_q(il, cur), n_head)
    kv, k_pe = g.mla_kv(il, cur)
    q_pe, k_pe = c.rope(q_pe, pos), c.rope(k_pe, pos)
    q, k, kv = g.mla_absorbed(il, q_nope, q_pe, kv, k_pe)
    out = g.attn_k(attn_in, il, None, q, k, kv, w.layer(il, "attn_v_b"))
    gate = c.unary(c.reshape(c.mul_mat(need(w.layer(il, "attn_gate")), cur), 1, n_head, T), "sigmoid")
    out = c.mul(c.reshape(out, d.head_v, n_head, T), gate)
    return c.mul_mat(need(w.layer(il, "attn_output")), c.cont(out, d.head_v * n_head, T))
