"""Qwen3-Next (src/models/qwen3next.cpp): delta-net (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

import moeconf.memory.recurrent as recurrent
from moeconf.memory.graph.archs._deltanet import delta_net_hybrid, older_qkvz
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits

TRAITS = Traits(recurrent="delta_net")
build = delta_net_hybrid(qwen35=False)
MEMORY = Memory(CHECKED + " (Qwen3-Next-80B-A3B)",
                recurrent.KEYS - {"rope.dimension_sections"} | {"nextn_predict_layers"}, unmodelled=older_qkvz)
