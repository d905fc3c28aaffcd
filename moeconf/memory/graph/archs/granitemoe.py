"""Granite-MoE (src/models/granite.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(granite=True))
MEMORY = Memory(CHECKED + " (Granite-3.1-3B-A800M)")
