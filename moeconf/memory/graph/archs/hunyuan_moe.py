"""Hunyuan-A13B (src/models/hunyuan-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

ARCH = "hunyuan-moe"
build = decoder(Decoder(qk_norm="head_after_rope"))
MEMORY = Memory(CHECKED + " (Hunyuan-A13B)")
