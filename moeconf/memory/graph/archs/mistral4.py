"""Mistral-Small-4 (src/models/mistral4.cpp): deepseek2's (docs/memory-architectures.md, "Compositions")."""

from __future__ import annotations

from dataclasses import replace

from moeconf.memory.graph.archs import deepseek2
from moeconf.memory.graph.archs.common import CHECKED

# deepseek2's loader: the keys it reads and the files it refuses
MEMORY = replace(deepseek2.MEMORY, checked_on=CHECKED + " (Mistral-Small-4)")
build = deepseek2.build
