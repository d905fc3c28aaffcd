"""Qwen3-VL-MoE's text model (src/models/qwen3vl-moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(qk_norm="head", mrope=True, deepstack=True))
MEMORY = Memory(CHECKED + " (Qwen3-VL-30B-A3B)", frozenset({"n_deepstack_layers", "rope.dimension_sections"}))
