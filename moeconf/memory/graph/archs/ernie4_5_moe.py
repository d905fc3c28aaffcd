"""ERNIE-4.5-MoE (src/models/ernie4-5-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

ARCH = "ernie4_5-moe"
build = decoder(Decoder())
MEMORY = Memory(CHECKED + " (ERNIE-4.5-21B-A3B)", frozenset({"leading_dense_block_count", "interleave_moe_layer_step"}))
