"""ik_llama.cpp's `-mqkv` (--merge-qkv): the architectures whose loader merges a layer's Q, K and V
projections into one (ik_llama.cpp src/llama-load-tensors.cpp; elsewhere the flag does nothing)."""

from __future__ import annotations

from typing import Final

MERGING_ARCHS: Final[frozenset[str]] = frozenset({
    "llama", "refact", "minicpm", "granite", "granitemoe", "mistral3", "llama4", "step35", "qwen3", "qwen3vl",
    "qwen3moe", "qwen3vlmoe", "gemma", "gemma2", "gemma3", "glm4moe", "gpt-oss", "smollm3", "deepseek2",
})
