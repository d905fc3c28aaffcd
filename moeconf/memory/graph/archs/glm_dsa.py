"""src/models/glm-dsa.cpp: GLM-5, DeepSeek-V3.2's graph (archs/_dsa.py) whose "shared" indexer layers
(attention.indexer.types; llama-model.cpp's is_indexer_full) keep no indexer cache and reuse the top-k
of the last layer that ran its own indexer."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import build as build
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS

# GLM-5.2's per-layer indexer table: the indexer K cache on its full layers only (memory/indexer.py)
MEMORY = Memory(CHECKED + " (GLM-5; GLM-5.2's indexer table)", MLA_KEYS | DSA_KEYS | {"attention.indexer.types"})
ARCH = "glm-dsa"
TRAITS = Traits(indexer="full")
