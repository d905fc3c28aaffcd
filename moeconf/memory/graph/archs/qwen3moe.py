"""Qwen3-MoE (src/models/qwen3moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(qk_norm="head"))
MEMORY = Memory(CHECKED + " (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B)")
