"""Qwen1.5/Qwen2-MoE (src/models/qwen2moe.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(norm_w=False, shexp_gate="silu_div"))
MEMORY = Memory(CHECKED + " (Qwen1.5-MoE-A2.7B)")
