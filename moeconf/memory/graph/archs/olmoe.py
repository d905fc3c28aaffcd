"""OLMoE (src/models/olmoe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(qk_norm="full", norm_w=False))
MEMORY = Memory(CHECKED + " (OLMoE-1B-7B)")
