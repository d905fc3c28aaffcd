"""Compressed attention caches (DeepSeek-V4's, src/llama-kv-cache-dsv4.cpp), as data from the keys the
loader reads: a file with `attention.compress_ratios` keeps every layer's raw rows K-only in a
sliding-window cache, and per layer, by its ratio:

- 4 (CSA): a compressed K cache of ceil(cells / 4) rows padded to 256, and the lightning indexer's of
  the same rows at `attention.indexer.key_length`; their compressor states, F32 kv and score tensors
  of 2 x 4 rows, 2 x the head width (the indexer's: 2 x its key width);
- 128 (HCA): a compressed K cache of ceil(cells / 128) rows padded to 256; its compressor state, F32
  kv and score of 128 rows of the head width;
- 0: the raw rows only.

The caches take the K type; the states keep one plane per sequence (no rollback snapshots: n_rs_seq 0)."""

from __future__ import annotations

from moeconf.memory.cachetypes import cache_row_bytes
from moeconf.memory.keys import int_key
from moeconf.model import ggml
from moeconf.model.inventory import Inventory

RATIOS_KEY = "attention.compress_ratios"
CSA, HCA = 4, 128


def ratios(inv: Inventory) -> tuple[int, ...] | None:
    """Each layer's compress ratio, None where the file has no compressed caches (an architecture with an
    indexer cache of its own reads the ratios for its indexer: Qwen4Exp's block pooling, no compressed cache)."""
    from moeconf.memory.graph.archs import traits

    v = inv.metadata.hparam(RATIOS_KEY)
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
    if ratio == CSA:
        width = int_key(inv, "attention.indexer.key_length") or 0
        size += cache_row_bytes(ctk, width) * rows
        size += 2 * 4 * (2 * head_k) * (2 * CSA) * n_seq + 2 * 4 * (2 * width) * (2 * CSA) * n_seq
    else:
        size += 2 * 4 * head_k * HCA * n_seq
    return size


def unmodelled_settings(inv: Inventory, n_seq: int) -> list[str]:
    """Settings these caches are not modelled under (empty: all are)."""
    if ratios(inv) is None or n_seq <= 1:
        return []
    # the DSV4 cache keeps its raw and compressed rows per sequence whatever --kv-unified says, each stream
    # sized from the per-sequence context; only one sequence was checked
    return [f"memory is not modelled for {inv.arch} with {n_seq} sequences (-np): its compressed KV cache keeps "
            "per-sequence streams that were not checked; give -np 1, or measure with llama.cpp's "
            "llama-fit-params -fitp on"]
