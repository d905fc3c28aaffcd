"""Mistral 3 (src/models/mistral3.cpp): Llama's classic decoder layer, one row, with the attention temperature."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, decoder

build = decoder(Decoder(temperature=True))
MEMORY = Memory(CHECKED + " (a synthetic Mistral 3 with 8 experts on Mistral-Small-3.2-24B's widths)")
