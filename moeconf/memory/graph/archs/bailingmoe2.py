"""Ling/Ring 2.0 (src/models/bailingmoe2.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(qk_norm="head", gating="sigmoid", gating_key=True, norm_w=False, norm_w_key=True))
MEMORY = Memory(CHECKED + " (Ling-mini-2.0)", frozenset({"leading_dense_block_count", "nextn_predict_layers"}))
