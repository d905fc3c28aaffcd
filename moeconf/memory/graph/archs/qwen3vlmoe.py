"""Qwen3-VL-MoE's text model (src/models/qwen3vl-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import REPLAYED, Decoder, decoder

ARCH = "qwen3vlmoe"
build = decoder(Decoder(qk_norm="head", mrope=True, deepstack=True))
MEMORY = REPLAYED
