"""Qwen3.5-MoE (src/models/qwen35moe.cpp): delta-net (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

import moeconf.memory.recurrent as recurrent
from moeconf.memory.graph.archs._deltanet import delta_net_hybrid
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits

TRAITS = Traits(recurrent="delta_net")
build = delta_net_hybrid(qwen35=True)
# the pinned converter keeps Qwen3.5's MTP block (nextn_predict_layers 1, one more block): the loader creates
# its tensors TENSOR_SKIP unless MTP is asked for (src/models/qwen35moe.cpp load_block_mtp) and the trunk's
# memory and this graph leave the nextn layer out: no memory effect (checked on Qwen3.5-35B-A3B with the
# block, tests/test_memory_flagship.py); speculative decoding is not modelled anyway
MEMORY = Memory(CHECKED + " (Qwen3.5-397B-A17B, Qwen3.5-122B-A10B, Qwen3.5-35B-A3B)",
                recurrent.KEYS | {"nextn_predict_layers"})
