"""EXAONE-MoE (src/models/exaone-moe.cpp): the classic layer (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, SWA_KEYS, Decoder, Memory, Swa, Traits, decoder

ARCH = "exaone-moe"
TRAITS = Traits(swa=Swa(window=128, pattern=4))
build = decoder(Decoder(qk_norm="head", gating_key=True, norm_w=False, norm_w_key=True, iswa=True, rope_swa_only=True))
MEMORY = Memory(CHECKED + " (K-EXAONE-236B-A23B)", SWA_KEYS | {"leading_dense_block_count", "nextn_predict_layers"})
