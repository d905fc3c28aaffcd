"""Granite (src/models/granite.cpp): the scaled classic layer (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder
from moeconf.model.inventory import Inventory

build = decoder(Decoder(granite=True))


def _unmodelled(inv: Inventory) -> list[str]:
    """A file whose rope.scaling.finetuned is false: the engine then builds no RoPE and no positions."""
    if inv.metadata.hparam("rope.scaling.finetuned") != 0:
        return []
    return ["memory is not modelled for this granite file: its granite.rope.scaling.finetuned is false, so the "
            "engine runs no RoPE (a graph moeconf does not build); measure it with llama.cpp's "
            "llama-fit-params -fitp on"]


MEMORY = Memory(CHECKED + " (a synthetic Granite with 8 experts on granite-3.1-8b's widths)", unmodelled=_unmodelled)
