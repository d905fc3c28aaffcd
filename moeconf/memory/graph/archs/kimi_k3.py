"""src/models/kimi-k3.cpp: Kimi-K3, KDA layers beside MLA layers, cross-layer residual attention, a latent MoE
(docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from moeconf.memory.graph.archs._deltanet import kda_layer, mm_where
from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, _unchecked, mla_forms, need, older_mla
from moeconf.memory.graph.blocks import AttnInput, GraphContext
from moeconf.memory.graph.ggml import Tensor
from moeconf.model.inventory import Inventory

ARCH = "kimi-k3"

_SHEXP = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


def _unmodelled(inv: Inventory) -> list[str]:
    """The loader's forms moeconf does not build: the decompressing attn_kv_b (`common.older_mla`) and a shared
    expert with only some of its three tensors (docs/memory.md, "What the larger compositions build")."""
    names = {t.name for t in inv.tensors}
    why = older_mla(inv)
    partial = sorted({t.layer for t in inv.tensors if t.layer is not None and 0 < sum(
        f"blk.{t.layer}.{n}.weight" in names for n in _SHEXP) < len(_SHEXP)})
    if partial:
        why.append(_unchecked(inv, f"block(s) {partial} have only some of ffn_gate/up/down_shexp (a shared expert "
                                   "the loader takes tensor by tensor)"))
    return why


MEMORY = Memory(CHECKED + " (Kimi-K3)", frozenset({
    "attention.key_length_mla", "attention.value_length_mla", "attention.kv_lora_rank", "attention.q_lora_rank",
    "ssm.conv_kernel", "kda.head_dim", "kda.gate_lower_bound", "attn_res.block_size", "expert_latent_length",
    "activation.situ_beta", "activation.situ_linear_beta", "leading_dense_block_count"}), unmodelled=_unmodelled,
    loader_refuses=mla_forms)


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd()
    attn_in = g.attn_inp_k()
    rs_in = g.rs_inp()
    out_ids = g.inp_out_ids()
    block = facts.hparam("attn_res.block_size")
    decay = "bounded" if "kda.gate_lower_bound" in facts.floats | facts.units else "softplus"
    # activation.situ_linear_beta above 0 runs the up branch's tanh, 0 leaves it out (tiny set "b")
    linear = facts.nonzero("activation.situ_linear_beta")
    bank: Tensor | None = None  # the residual bank (`resi_stack`): [n_embd, checkpoints, tokens], never refolded
    for il in range(hp.n_layer):
        prefix = inp
        cur = _res_mix(g, bank, prefix, w.layer(il, "attn_res_score"))  # the stream itself before a bank
        banked = bool(block) and il % block == 0
        if banked:
            ckpt = c.reshape(prefix, hp.n_embd, 1, prefix.ne[1])
            bank = ckpt if bank is None else c.concat(bank, ckpt, 1)
        cur = g.norm(cur, w.layer(il, "attn_norm"), None, il)
        g.expand(cur)
        cur = kda_layer(g, rs_in, cur, il, decay, gate_rows=True) if il in g.rs else _mla_layer(g, attn_in, cur, il)
        prefix = cur if banked else c.add(prefix, cur)
        cur = _res_mix(g, bank, prefix, w.layer(il, "ffn_res_score"))
        cur = g.norm(cur, w.layer(il, "ffn_norm"), None, il)
        cur = g.layer_ffn(cur, il, act="situ", linear=linear) if g.dense(il) else _latent_moe(g, cur, il, facts, linear)
        inp = c.add(prefix, cur)
    g.output(c.get_rows(_res_mix(g, bank, inp, w.get("output_res_score.weight")), out_ids))


def _res_mix(g: GraphContext, src: Tensor | None, cur: Tensor, score: Tensor | None) -> Tensor:
    """res_mix: the bank's checkpoints and the running stream scored (RMS-normed, weighted, summed),
    softmaxed together, the bank summed by DSV4_HC_PRE, the stream weighted and added."""
    if src is None:
        return cur
    c = g.ctx
    n_ckpt, T = src.ne[1], cur.ne[1]
    sc_src = c.reshape(c.sum_rows(c.mul(c.rms_norm(src), need(score))), n_ckpt, T)
    sc_cur = c.sum_rows(c.mul(c.rms_norm(cur), need(score)))
    probs = c.soft_max(c.concat(sc_src, sc_cur, 0))
    p_src = c.cont(c.view(probs, (n_ckpt, T), (probs.nb[1],), 0))
    p_cur = c.cont(c.view(probs, (1, T), (probs.nb[1],), probs.nb[0] * n_ckpt))
    return c.add(c.dsv4_hc_pre(src, p_src), c.mul(cur, p_cur))


def _mla_layer(g: GraphContext, attn_in: AttnInput, cur: Tensor, il: int) -> Tensor:
    """build_mla_layer: the absorbed MLA (no RoPE) through the latent K-only cache, the output gate."""
    c, w = g.ctx, g.w
    q = g.mla_q(il, cur)
    kv_cmpr, k_pe = g.mla_kv(il, cur)
    q_cur, k_cur, kv3 = g.mla_absorbed(il, *g.mla_q_parts(q, g.hp.n_head[il]), kv_cmpr, k_pe)
    out = g.attn_k(attn_in, il, None, q_cur, k_cur, kv3, w.layer(il, "attn_v_b"))
    gate_w = w.layer(il, "attn_gate")
    if gate_w is not None:
        out = c.mul(out, c.unary(g.mm(gate_w, cur), "sigmoid"))
    return g.mm(need(w.layer(il, "attn_output")), out)


def _latent_moe(g: GraphContext, cur: Tensor, il: int, facts: Facts, linear: bool) -> Tensor:
    """build_latent_moe: the routed experts on the down-projected input (routed by the full one),
    normed and projected back up; the shared expert on the full input, added."""
    w = g.w
    routed_in = mm_where(g, w.layer(il, "ffn_routed_down"), cur)
    logits = g.mm(need(w.layer(il, "ffn_gate_inp")), cur)
    moe = g.moe_ffn(routed_in, il, gating=facts.gating_or("softmax"), norm_w=bool(facts.norm_w),
                    w_scale=facts.w_scale, act="situ", probs_bias=w.layer(il, "exp_probs_b", "bias"), logits=logits,
                    situ_linear=linear)
    norm = w.layer(il, "ffn_routed_norm")
    if norm is not None:
        moe = g.norm(moe, norm, None, il)
    return g.add_shexp(mm_where(g, w.layer(il, "ffn_routed_up"), moe), cur, il, act="situ", linear=linear)
