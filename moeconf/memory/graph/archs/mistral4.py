"""src/models/mistral4.cpp: Mistral-Small-4 is deepseek2's graph itself (llama_model_mistral4 takes
llama_model_deepseek2's loader and graph, src/models/models.h): MLA attention, dense leading layers,
then the MoE with its shared expert."""

from __future__ import annotations

from dataclasses import replace

from moeconf.memory.graph.archs import deepseek2
from moeconf.memory.graph.archs.common import CHECKED

# deepseek2's loader: the keys it reads and the files it refuses
MEMORY = replace(deepseek2.MEMORY, checked_on=CHECKED + " (Mistral-Small-4)")
build = deepseek2.build
