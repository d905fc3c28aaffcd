"""GLM-5 (src/models/glm-dsa.cpp): DSA with shared indexers (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import build as build
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS

# GLM-5.2's per-layer indexer table: the indexer K cache on its full layers only (memory/indexer.py)
MEMORY = Memory(CHECKED + " (GLM-5; GLM-5.2's indexer table)", MLA_KEYS | DSA_KEYS | {"attention.indexer.types"})
ARCH = "glm-dsa"
TRAITS = Traits(indexer="full")
