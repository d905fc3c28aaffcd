"""Qwen3-MoE (src/models/qwen3moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import REPLAYED, Decoder, decoder

ARCH = "qwen3moe"
build = decoder(Decoder(qk_norm="head"))
MEMORY = REPLAYED
