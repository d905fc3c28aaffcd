"""Qwen3.5-MoE (src/models/qwen35moe.cpp): delta-net (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

import moeconf.memory.recurrent as recurrent
from moeconf.memory.graph.archs._deltanet import delta_net_hybrid
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits

TRAITS = Traits(recurrent="delta_net")
build = delta_net_hybrid(qwen35=True)
MEMORY = Memory(CHECKED + " (Qwen3.5-397B-A17B, Qwen3.5-122B-A10B, Qwen3.5-35B-A3B)",
                recurrent.KEYS | {"nextn_predict_layers"})
