"""The KV cache's types as ggml sizes them: a row's bytes, whether a type is quantized, and the
Hadamard rotation llama.cpp applies to a quantized cache."""

from __future__ import annotations

from moeconf.engines.settings import Q8_KV
from moeconf.model import ggml


def cache_block(cache_type: str) -> tuple[int, int]:
    """(elements, bytes) of one block of a cache type, from ggml's type table."""
    return ggml.quant_sizes()[ggml.type_ids()[cache_type.upper()]]


def is_quantized(cache_type: str) -> bool:
    return cache_type not in ("f32", "f16", "bf16")


def rotation(cache_type: str, head: int, k: bool) -> int:
    """The side of the Hadamard rotation llama.cpp applies for a cache of this type and head width, 0: none
    (docs/memory.md, "The graph's prologue")."""
    from moeconf.memory.graph.blocks import rotation_width  # the graph's (K's side is the same rule)

    if not is_quantized(cache_type) or head % 64:
        return 0
    return rotation_width(head) if k else 64


def cache_row_bytes(cache_type: str, n: int, heads: int = 1) -> int:
    """Bytes of a cache row of `heads` heads of `n` elements in `cache_type` (ik's q8_KV: 8 bytes of
    scale per head)."""
    if cache_type == Q8_KV:
        return (n + 8) * heads
    block, size = cache_block(cache_type)
    return (n * heads + block - 1) // block * size
