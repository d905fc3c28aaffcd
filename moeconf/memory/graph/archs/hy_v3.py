"""HY V3 (src/models/hy-v3.cpp): the classic decoder layer (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import CHECKED, Decoder, Memory, blocks_without, decoder

build = decoder(Decoder(qk_norm="head", gating="sigmoid", gating_key=True, norm_w=False, norm_w_key=True, h_nextn=True))
MEMORY = Memory(CHECKED + " (Hy3-preview)", frozenset({"nextn_predict_layers"}), unmodelled=blocks_without(
    "ffn_up", ("ffn_gate.weight",), "build_ffn then runs SiLU over the up projection alone"))
