"""src/models/qwen35moe.cpp: Qwen3-Next's layers with separate beta and alpha projections, Q and K
not repeated to the value heads (the fused delta-net op broadcasts them: llama.cpp repeats them only
where a fused GDN form is off; the dumps' devices have both), the gated Q a view without a reshape,
multi-section RoPE (four positions per token)."""

from __future__ import annotations

from moeconf.memory.graph.archs._deltanet import delta_net_hybrid
from moeconf.memory.graph.archs.common import REPLAYED, Facts, Traits
from moeconf.memory.graph.blocks import GraphContext

ARCH = "qwen35moe"
TRAITS = Traits(recurrent="delta_net")
MEMORY = REPLAYED


def build(g: GraphContext, facts: Facts) -> None:
    delta_net_hybrid(g, qwen35=True)
    del facts
