"""Mixtral through llama (src/models/llama.cpp): the classic decoder layer, one row."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder())
MEMORY = Memory(CHECKED + " (Mixtral-8x7B)")
