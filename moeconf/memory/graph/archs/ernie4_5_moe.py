"""ERNIE-4.5-MoE (src/models/ernie4-5-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import REPLAYED, Decoder, decoder

ARCH = "ernie4_5-moe"
build = decoder(Decoder())
MEMORY = REPLAYED
