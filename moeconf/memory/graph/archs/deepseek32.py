"""DeepSeek-V3.2 (src/models/deepseek32.cpp): MLA with DSA (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import build as build
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS

MEMORY = Memory(CHECKED + " (DeepSeek-V3.2)", MLA_KEYS | DSA_KEYS)
TRAITS = Traits(indexer="all")
