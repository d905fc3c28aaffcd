"""MiniMax-M2 (src/models/minimax-m2.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

ARCH = "minimax-m2"
build = decoder(Decoder(qk_norm="full", gating_key=True))
MEMORY = Memory(CHECKED + " (MiniMax-M2)")
