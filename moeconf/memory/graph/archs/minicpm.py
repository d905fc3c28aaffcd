"""MiniCPM (src/models/minicpm.cpp): Granite's graph (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder
from moeconf.model.inventory import Inventory

build = decoder(Decoder(granite=True))
_SCALES = ("embedding_scale", "residual_scale", "logit_scale")


def _unmodelled(inv: Inventory) -> list[str]:
    """A scale key missing: the loader's default scale runs in the engine's graph, not in this one."""
    keys = set(inv.metadata.arch_keys or ())
    missing = [f"minicpm.{k}" for k in _SCALES if k not in keys]
    if not missing:
        return []
    return [f"memory is not modelled for this minicpm file: it lacks {', '.join(missing)} (the engine then "
            "runs its default scale, which moeconf's graph does not); reconvert it with a current "
            "convert_hf_to_gguf.py, which writes the three scales"]


MEMORY = Memory(CHECKED + " (MiniCPM-MoE-8x2B)", unmodelled=_unmodelled)
