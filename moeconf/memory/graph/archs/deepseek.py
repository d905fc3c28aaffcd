"""DeepSeek-MoE v1 (src/models/deepseek.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(norm_w=False))
MEMORY = Memory(CHECKED + " (DeepSeek-MoE-16B)", frozenset({'leading_dense_block_count'}))
