"""nemotron_h (src/models/nemotron-h.cpp): nemotron_h_moe's (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._mamba import unbiased_conv
from moeconf.memory.graph.archs.common import CHECKED, SSM_KEYS, Memory, Traits
from moeconf.memory.graph.archs.nemotron_h_moe import build as build

TRAITS = Traits(recurrent="mamba2")
# the Mamba-2 state's sizes (memory/recurrent.py), the latent experts' width (read from their tensors)
MEMORY = Memory(CHECKED + " (Nemotron-3-Nano-30B-A3B's config as nemotron_h, synthetic)", unmodelled=unbiased_conv,
                keys=SSM_KEYS | {"moe_latent_size"})
