"""src/models/kimi-linear.cpp: KDA and MLA layers (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._deltanet import kda_layer
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, Traits, mla_forms, need, older_mla, routed
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor
from moeconf.memory.keys import MLA_KEYS
from moeconf.memory.recurrent import KDA_KEYS

ARCH = "kimi-linear"
TRAITS = Traits(recurrent="kda")
# the KDA state (memory/recurrent.py) and the MLA latent
MEMORY = Memory(CHECKED + " (Kimi-Linear-48B-A3B)", KDA_KEYS | MLA_KEYS - {"attention.q_lora_rank"}
                | {"leading_dense_block_count"}, unmodelled=older_mla, loader_refuses=mla_forms)


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd()
    rs_in = g.rs_inp()  # build_inp_mem_hybrid(_k): the states' indices, then the cache's inputs
    attn_in = g.attn_inp_k() if g.mla.absorbed else g.attn_inp_kv()
    g.inp_out_ids()
    for il in range(hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        g.expand(cur)
        if il in g.rs:
            g.cb(g.rs[il][0], "conv_states_all", il)  # the engine names the conv state's cache tensor
            cur = kda_layer(g, rs_in, cur, il, gate_rows=True, flat=True)
        else:
            cur = _mla(g, attn_in, cur, il)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        cur = g.layer_ffn(cur, il) if g.dense(il) else g.add_shexp(routed(g, facts, cur, il, norm_w=True), cur, il)
        inp = c.add(cur, ffn_inp)
    g.output(inp)


def _mla(g: GraphContext, attn_in: AttnInput, cur: Tensor, il: int) -> Tensor:
    """The MLA layer, no RoPE on either side."""
    c, w, hp, d = g.ctx, g.w, g.hp, g.mla
    T, n_head = cur.ne[1], hp.n_head[il]
    nope = d.head_k - d.rope
    q = c.mul_mat(need(w.layer(il, "attn_q")), cur)
    kv_cmpr, k_pe = g.mla_kv(il, cur)
    if d.absorbed:
        q_cur, k_cur, kv_cmpr = g.mla_absorbed(il, *g.mla_q_parts(q, n_head), kv_cmpr, k_pe)
        return g.attn_k(attn_in, il, w.layer(il, "attn_output"), q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"))
    q = c.reshape(q, d.head_k, n_head, T)
    kv = c.mul_mat(need(w.layer(il, "attn_kv_b")), kv_cmpr)
    step = 4 * (nope + d.head_v)
    k_nope = c.view(kv, (nope, n_head, T), (step, step * n_head), 0)
    v_cur = c.cont(c.view(kv, (d.head_v, n_head, T), (step, step * n_head), 4 * nope))
    k_cur = c.concat(c.repeat(k_pe, d.rope, n_head, T), k_nope, 0)
    return g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k_cur, v_cur)
