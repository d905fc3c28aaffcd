"""src/models/mistral4.cpp: Mistral-Small-4 is deepseek2's graph itself (llama_model_mistral4 takes
llama_model_deepseek2's loader and graph, src/models/models.h): MLA attention, dense leading layers,
then the MoE with its shared expert."""

from __future__ import annotations

from moeconf.memory.graph.archs import deepseek2
from moeconf.memory.graph.archs.common import CHECKED, Memory

ARCH = "mistral4"
MEMORY = Memory(CHECKED + " (Mistral-Small-4)",
                frozenset({"attention.key_length_mla", "attention.value_length_mla", "attention.kv_lora_rank",
                           "attention.q_lora_rank", "leading_dense_block_count",
                           "expert_group_count", "expert_group_used_count"}),
                loader_refuses=deepseek2.MEMORY.loader_refuses)

build = deepseek2.build
