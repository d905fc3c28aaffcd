"""src/models/qwen3next.cpp: gated delta-net layers (the conv state and the recurrent state through
build_rs, the short convolution, the L2-normed Q and K repeated to the value heads, the fused
GATED_DELTA_NET op, its new state copied back, the gated norm) and full attention layers with a gated
Q; a MoE with a sigmoid-gated shared expert; the output rows taken after the final norm."""

from __future__ import annotations

from moeconf.memory.graph.archs._deltanet import delta_net_hybrid
from moeconf.memory.graph.archs.common import REPLAYED, Facts, Traits
from moeconf.memory.graph.blocks import GraphContext

ARCH = "qwen3next"
TRAITS = Traits(recurrent="delta_net")
MEMORY = REPLAYED


def build(g: GraphContext, facts: Facts) -> None:
    delta_net_hybrid(g, qwen35=False)
    del facts
