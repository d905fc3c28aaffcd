"""Granite-4.0-H (src/models/granite-hybrid.cpp): Mamba-2 (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import mamba2_layer, unbiased_conv
from moeconf.memory.graph.archs.common import CHECKED, SSM_KEYS, Facts, Memory, Traits, hybrid_inputs
from moeconf.memory.graph.blocks import GraphContext
from moeconf.model.inventory import Inventory

TRAITS = Traits(recurrent="mamba")


def _unmodelled(inv: Inventory) -> list[str]:
    """Mamba-2 blocks without their convolution's bias (`unbiased_conv`), and a shared expert that does not match
    expert_shared_feed_forward_length, which the loader refuses (docs/memory-architectures.md, "Compositions")."""
    width = inv.metadata.hparam("expert_shared_feed_forward_length")
    keyed = isinstance(width, int) and width > 0
    names = {t.name for t in inv.tensors}
    routed = sorted({t.layer for t in inv.tensors if t.layer is not None
                     and t.name == f"blk.{t.layer}.ffn_gate_inp.weight"})
    parts = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
    odd = [il for il in routed if any((f"blk.{il}.{p}.weight" in names) != keyed for p in parts)]
    why = unbiased_conv(inv)
    if odd:
        why.append(f"llama.cpp refuses to load this file: block(s) {odd} have "
                   f"{'not all of' if keyed else 'some of'} ffn_gate/up/down_shexp where the file's "
                   f"expert_shared_feed_forward_length is {'not set' if width is None else width} (its granitehybrid "
                   "loader creates the shared expert in every expert block exactly where that width is above 0)")
    return why


MEMORY = Memory(CHECKED + " (Granite-4.0-H-Small)", SSM_KEYS, unmodelled=_unmodelled)


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, rs_in, attn_in = hybrid_inputs(g)
    g.inp_out_ids()
    pos = g.inp_pos()
    res_scale = facts.nonzero("residual_scale")  # Granite scales whenever the value is not 0
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        if il in g.rs:
            cur = mamba2_layer(g, rs_in, cur, il)
        else:
            q, k, v = g.qkv(il, cur)
            freqs = w.copy("rope_freqs.weight", il)
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        cur, res = g.out_rows(il, cur, inp)
        if res_scale:
            cur = c.scale(cur)
        ffn_inp, cur = g.ffn_input(il, cur, res, rows=False)
        if g.dense(il):
            cur = g.layer_ffn(cur, il)
        else:
            cur = g.add_shexp(g.moe_ffn(cur, il, gating="softmax", norm_w=True, w_scale=facts.w_scale), cur, il)
        if res_scale:
            cur = c.scale(cur)
        inp = c.add(cur, ffn_inp)
    g.output(inp, scale=facts.nonzero("logit_scale"))
