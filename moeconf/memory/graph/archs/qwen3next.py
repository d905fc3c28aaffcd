"""src/models/qwen3next.cpp: gated delta-net layers (the conv state and the recurrent state through
build_rs, the short convolution, the L2-normed Q and K repeated to the value heads, the fused
GATED_DELTA_NET op, its new state copied back, the gated norm) and full attention layers with a gated
Q; a MoE with a sigmoid-gated shared expert; the output rows taken after the final norm."""

from __future__ import annotations

import moeconf.memory.recurrent as recurrent
from moeconf.memory.graph.archs._deltanet import delta_net_hybrid, older_qkvz
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits

TRAITS = Traits(recurrent="delta_net")
build = delta_net_hybrid(qwen35=False)
# its MTP block is skipped as Qwen3.5's (measured: the same figures with and without it,
# tests/test_memory_keys.py)
MEMORY = Memory(CHECKED + " (Qwen3-Next-80B-A3B)",
                recurrent.KEYS - {"rope.dimension_sections"} | {"nextn_predict_layers"}, unmodelled=older_qkvz)
