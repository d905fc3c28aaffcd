"""Compressed attention caches (DeepSeek-V4's, src/llama-kv-cache-dsv4.cpp), from the keys the loader reads; the
caches per compress ratio: docs/memory-architectures.md, "Indexer and compressed caches in the engine"."""

from __future__ import annotations

from moeconf.memory.cachetypes import cache_row_bytes
from moeconf.memory.graph.archs import traits
from moeconf.memory.keys import int_key
from moeconf.model import ggml
from moeconf.model.inventory import Inventory

CSA, HCA = 4, 128


def ratios(inv: Inventory) -> tuple[int, ...] | None:
    """Each layer's compress ratio, None where the file has no compressed caches (or the ratios are its indexer's)."""
    v = inv.metadata.hparam("attention.compress_ratios")
    if v is None or traits(inv.arch).indexer:
        return None
    return v if isinstance(v, tuple) else (v,)


def layer_bytes(inv: Inventory, il: int, head_k: int, cells: int, n_seq: int, ctk: str) -> int:
    """One layer's compressed caches and compressor states (bytes, its raw rows excluded)."""
    r = ratios(inv)
    ratio = r[il] if r is not None and il < len(r) else 0
    if ratio not in (CSA, HCA):
        return 0
    rows = ggml.pad(max(1, -(-cells // ratio)), 256) * n_seq
    size = cache_row_bytes(ctk, head_k) * rows
    if ratio == HCA:
        return size + 2 * 4 * head_k * HCA * n_seq
    width = int_key(inv, "attention.indexer.key_length") or 0
    size += cache_row_bytes(ctk, width) * rows
    return size + 2 * 4 * (2 * head_k) * (2 * CSA) * n_seq + 2 * 4 * (2 * width) * (2 * CSA) * n_seq


def unmodelled_settings(inv: Inventory, n_seq: int) -> list[str]:
    """Settings these caches are not modelled under (empty: all are)."""
    if ratios(inv) is None or n_seq <= 1:
        return []
    return [f"memory is not modelled for {inv.arch} with {n_seq} sequences (-np): its compressed KV cache keeps "
            "per-sequence streams that were not checked; give -np 1, or measure with llama.cpp's "
            "llama-fit-params -fitp on"]
