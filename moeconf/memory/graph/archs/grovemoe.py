"""GroveMoE (src/models/grovemoe.cpp): adjugate experts (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Facts, Memory, need
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.keys import int_key
from moeconf.model.inventory import Inventory


def build(g: GraphContext, facts: Facts) -> None:
    c, w = g.ctx, g.w
    inp, pos, kv, _ = g.inputs()
    for il in range(g.hp.n_layer):
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur)
        q, k = g.qk_norm(il, q, k)
        cur = g.attn(kv, il, w.layer(il, "attn_output"), None, c.rope(q, pos), c.rope(k, pos), v)
        ffn_inp, cur = g.ffn_input(il, cur, inp)
        logits = g.mm(need(w.layer(il, "ffn_gate_inp")), cur)
        moe = g.moe_ffn(cur, il, logits=logits, grove=True)
        adj = g.moe_ffn(moe, il, logits=logits, exps="chexps", grove=True)
        inp = c.add(c.add(moe, c.scale(adj)), ffn_inp)
    g.output(inp)


def _unmodelled(inv: Inventory) -> list[str]:
    """Expert groups, or fewer adjugate experts than experts used: the engine aborts (docs/memory-architectures.md,
    "Compositions")."""
    if (int_key(inv, "expert_group_count") or 0) > 1:
        return [f"llama.cpp cannot run this grovemoe file: it sets {int_key(inv, 'expert_group_count')} expert groups "
                "(grovemoe.expert_group_count), and build_moe_ffn's group selection over the adjugate experts "
                "reshapes the routed experts' probabilities to the adjugate experts' count and aborts; a conversion "
                "without expert groups (no n_group in the config) loads"]
    chexps = next((t for t in inv.tensors if t.name.endswith(".ffn_down_chexps.weight")), None)
    used = inv.metadata.expert_used_count or 0
    if chexps is None or len(chexps.shape) < 3 or chexps.shape[2] >= used:
        return []
    return [f"llama.cpp cannot run this grovemoe file: {chexps.shape[2]} adjugate experts (ffn_*_chexps) are fewer "
            f"than the {used} experts used per token, and its graph aborts (build_moe_ffn reads "
            f"{used} of them); it needs expert_count / experts_per_group >= expert_used_count"]


MEMORY = Memory(CHECKED + " (GroveMoE-Inst)", keys=frozenset({
    "expert_chunk_feed_forward_length", "expert_group_scale", "experts_per_group"}), unmodelled=_unmodelled)
