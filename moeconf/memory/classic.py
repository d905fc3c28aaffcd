"""Memory facts of the "classic" MoE architectures beyond the first five (issue 17; which are
modelled: memory/support.py), where the logits are computed (a tied output's second copy of
`token_embd`, engines/tied.py) and the graph's input width."""

from __future__ import annotations

from moeconf.engines import HOST
from moeconf.memory.keys import int_key
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement


def output_device(placement: Placement) -> str:
    """The device that computes the logits: the one holding the output matrix (for a tied output,
    the engine's second copy of `token_embd`, or `token_embd` itself where no copy is made)."""
    tied = placement.tied_output()
    if tied is not None:
        return tied
    return placement.devices.get("output.weight") or placement.devices.get("token_embd.weight") or HOST


def input_width(inv: Inventory, n_embd: int) -> int:
    """The graph's input embedding width (llama_hparams::n_embd_inp): Qwen3-VL's deepstack adds
    n_embd per deepstack layer (the vision features the first layers add back)."""
    return n_embd * (1 + (int_key(inv, "n_deepstack_layers") or 0))
