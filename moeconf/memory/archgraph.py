"""What the phase model and the refusals need to know about an architecture's graph, read from the
tensors its layers hold instead of from its name where they can (issue 17).

- `ffn_floats`: the phase model's live FFN set, where ggml-alloc (best fit among the free blocks,
  a tensor freed after its last consumer) puts the down projection's output into the hole the
  gate and up projections leave when it fits there (measured on MiniMax-M2 with routed experts on
  the CPU: 134 MiB where the four tensors side by side would be 158).
"""

from __future__ import annotations

from moeconf.model.inventory import Inventory


def ffn_floats(moe_tensors: int, used: int, n_ff_exp: int, n_embd: int) -> int:
    """Floats per token alive at the routed experts' peak: gate, up, their gated product and the
    down projection's output, the latter in the hole gate and up left when it fits there."""
    ffe = used * n_ff_exp
    down = used * n_embd
    if moe_tensors == 3 and down <= 2 * ffe:
        return 3 * ffe
    return moe_tensors * ffe + down



def unmodelled_structure(inv: Inventory) -> list[str]:
    """Layer structures of a modelled architecture the model was not checked on: Grok-2
    style layers holding a dense FFN beside the routed experts (src/models/grok.cpp adds both,
    scaled), checked only on Grok-1's experts-only layers. A number of experts used that differs per
    layer (Nemotron-3 Puzzle's per-layer expert_used_count): the graph's build_moe_ffn takes one for
    every layer."""
    used = inv.metadata.hparam("expert_used_count")
    if isinstance(used, tuple) and len(set(used)) > 1:
        return [f"memory is not modelled for {inv.arch} with experts that differ per layer (a per-layer "
                "expert_used_count): measure this model with llama.cpp's llama-fit-params -fitp on"]
    if inv.arch != "grok":
        return []
    dense = {t.layer for t in inv.tensors if t.base == "ffn_up" and t.layer is not None}
    routed = {t.layer for t in inv.tensors if t.base == "ffn_up_exps" and t.layer is not None}
    if dense & routed:
        return ["memory is not modelled for grok layers with a dense FFN beside the routed experts (Grok-2 style; "
                "checked on Grok-1 only)"]
    return []
