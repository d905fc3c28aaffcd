"""Ling v1 (src/models/bailingmoe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(norm_w=False, norm_w_key=True))
MEMORY = Memory(CHECKED + " (Ling-lite)", frozenset({'leading_dense_block_count'}))
