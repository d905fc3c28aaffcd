"""src/models/glm-dsa.cpp: GLM-5, DeepSeek-V3.2's graph (archs/_dsa.py) whose "shared" indexer layers
(attention.indexer.types; llama-model.cpp's is_indexer_full) keep no indexer cache and reuse the top-k
of the last layer that ran its own indexer."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import build
from moeconf.memory.graph.archs.common import REPLAYED, Traits

MEMORY = REPLAYED
ARCH = "glm-dsa"
TRAITS = Traits(indexer="full", approximate_search=True)

__all__ = ["ARCH", "MEMORY", "build"]
