"""DBRX (src/models/dbrx.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(norm="layer", clamp_key="attention.clamp_kqv", ffn_norm="attn_output_norm"))
MEMORY = Memory(CHECKED + " (DBRX)")
