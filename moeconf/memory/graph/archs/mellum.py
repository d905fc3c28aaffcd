"""Mellum (src/models/mellum.cpp): the classic layer (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Decoder, Memory, Swa, Traits, decoder
from moeconf.model.inventory import Inventory

TRAITS = Traits(swa=Swa(pattern=4))


def _unmodelled(inv: Inventory) -> list[str]:
    """A window whose pattern marks no layer windowed (docs/memory-architectures.md, "Compositions")."""
    from moeconf.memory.geometry import geometry

    window = inv.metadata.sliding_window
    if not window or any(la.swa for la in geometry(inv).layers):
        return []
    return [f"memory is not modelled for this mellum file: mellum.attention.sliding_window is {window} but "
            "mellum.attention.sliding_window_pattern marks no layer windowed, so the engine builds its "
            "sliding-window graph (a KV cache pair) with every layer full, which moeconf's graph does not "
            "build; measure it with llama.cpp's llama-fit-params -fitp on"]


MEMORY = Memory(CHECKED + " (Mellum2-12B-A2.5B)", SWA_KEYS, unmodelled=_unmodelled)
build = decoder(Decoder(qk_norm="head", iswa=None))  # the iSWA cache pair where the context has a window
