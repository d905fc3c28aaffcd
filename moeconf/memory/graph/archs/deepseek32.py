"""src/models/deepseek32.cpp: DeepSeek-V3.2, deepseek2's absorbed MLA with the lightning indexer in every
layer choosing the cells each token attends to (archs/_dsa.py); dense leading layers, then the MoE with
its shared expert."""

from __future__ import annotations

from moeconf.memory.graph.archs._dsa import build as build
from moeconf.memory.graph.archs.common import CHECKED, Memory, Traits
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS

MEMORY = Memory(CHECKED + " (DeepSeek-V3.2)", MLA_KEYS | DSA_KEYS)
TRAITS = Traits(indexer="all")
