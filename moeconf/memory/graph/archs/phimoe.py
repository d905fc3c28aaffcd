"""Phi-3.5-MoE (src/models/phi3.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(q_scale=True, residual_first=True))
MEMORY = Memory(CHECKED + " (Phi-3.5-MoE)")
