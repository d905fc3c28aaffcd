"""The KV cache per device as the engines allocate it (llama-kv-cache.cpp, and ik_llama.cpp's llama_kv_cache_init):
K and V rows per layer on its device, MLA latents, recurrent states, indexer and compressed caches (docs/memory.md,
"Memory per device"; docs/memory-architectures.md, "Indexer and compressed caches in the engine")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace

import moeconf.memory.compressed as compressed
import moeconf.memory.recurrent as rec
from moeconf.engines import HOST
from moeconf.engines.settings import MemorySettings
from moeconf.memory.cachetypes import cache_row_bytes
from moeconf.memory.geometry import Geometry, LayerAttention
from moeconf.memory.ikmla import effective_mla
from moeconf.memory.indexer import indexer_row_layers, indexer_width
from moeconf.model import ggml
from moeconf.model.inventory import Inventory


def context_cells(inv: Inventory, geo: Geometry, settings: MemorySettings, *, ik: bool = False,
                  fa: bool = True) -> tuple[int, int, int, int, int]:
    """The context the engine allocates (docs/memory.md, "Memory per device"): n_ctx, the cells per stream, a
    sliding-window layer's (0: none), the streams, the worst-case ubatch."""
    pad = 256 if (not ik or fa) else 32
    n_ctx = ggml.pad(settings.n_ctx or (inv.metadata.context_length or 4096), pad)
    n_seq = settings.n_parallel
    unified = settings.kv_unified or n_seq == 1 or ik
    cells = n_ctx if unified else ggml.pad(n_ctx // n_seq, pad)
    T = min(n_ctx, settings.n_batch, settings.n_ubatch)
    swa_cells = 0
    if geo.swa_type != "none" and any(la.swa for la in geo.layers):
        window = ggml.pad(min(cells, geo.n_swa * (n_seq if unified else 1) + T), 256)
        swa_cells = cells if ik or settings.swa_full else window
    return n_ctx, cells, swa_cells, 1 if unified else n_seq, T


def kv_bytes(inv: Inventory, geo: Geometry, settings: MemorySettings, homes: Mapping[int, str], *, cells: int,
             swa_cells: int, n_stream: int, flash_attn: bool, ik: bool) -> dict[str, int]:
    """Bytes of KV cache per device: `homes` is each layer's device (a nextn block's KV where the loader keeps
    it), `cells` the cache's cells per stream (`swa_cells` a window's), `n_stream` the streams."""
    n_seq = settings.n_parallel
    ctk, ctv = settings.cache_type_k, settings.cache_type_v
    kv: dict[str, int] = defaultdict(int)
    # the DSA lightning indexer's K cache beside the MLA latent; MiniMax-M3's indexer key cache beside K/V
    idx_layers = set() if ik else set(indexer_row_layers(inv, [la.index for la in geo.layers]))
    idx_width = indexer_width(inv)
    msa_width = inv.metadata.hparam("attention.indexer.key_length")
    msa_layers = set() if geo.mla_arch or not isinstance(msa_width, int) else {
        t.layer for t in inv.tensors if t.layer is not None and t.name.endswith(".indexer.k_proj.weight")}
    dsv4 = compressed.ratios(inv) is not None  # DeepSeek-V4's compressed caches
    mla = effective_mla(inv, geo, settings) if geo.mla_arch and ik else 0  # ik computes wkv_b for -mla 2/3

    def layer_bytes(la: LayerAttention) -> int:
        n = (swa_cells if la.swa else cells) * n_stream
        if la.recurrent:  # F32 conv + delta-net state per sequence, no KV
            return rec.state_bytes(inv, n_seq) + rec.ple_bytes(inv, la.index, n_seq)
        if mla:
            ktype = ctk if (flash_attn or mla == 1) else ctv
            v_latent = cache_row_bytes(ctv, geo.kv_lora_rank * n) if mla == 1 and not flash_attn else 0
            return cache_row_bytes(ktype, geo.kv_lora_rank + geo.n_rot) * n + v_latent
        if geo.mla_arch and ik and geo.mla:  # -mla 0 on a mainline conversion: ik restores full heads (ikmla.py)
            return (cache_row_bytes(ctk, geo.head_k_mla, geo.n_head)
                    + cache_row_bytes(ctv, geo.head_v_mla, geo.n_head)) * n
        size = cache_row_bytes(ctk, la.head_k, la.n_head_kv) * n
        if dsv4:  # DeepSeek-V4: raw rows K-only, compressed caches, states
            return size + compressed.layer_bytes(inv, la.index, la.head_k, cells, n_seq, ctk)
        if not geo.mla:  # mainline MLA: V is a view of the latent K cache
            transposed = not (flash_attn or ik)  # V stored transposed: the widest layer's row (geometry.v_row)
            size += (cache_row_bytes(ctv, geo.v_row(la, True)) if transposed
                     else cache_row_bytes(ctv, la.head_v, la.n_head_kv)) * n
        if la.index in idx_layers:
            size += cache_row_bytes(ctk, idx_width) * n
        elif la.index in msa_layers and isinstance(msa_width, int):
            size += (cache_row_bytes(ctk, msa_width) + cache_row_bytes(ctv, la.head_v)) * n
        return size

    for la in (*geo.layers, *geo.nextn_kv):
        kv[homes.get(la.index, HOST) if settings.offload_kqv else HOST] += layer_bytes(la)
    if dsv4 and geo.layers:  # the MTP blocks' rows too, as the first layer's, on the last block's device
        dev = homes.get(geo.layers[-1].index, HOST) if settings.offload_kqv else HOST
        for il in inv.layers_of_kind("nextn"):
            kv[dev] += layer_bytes(replace(geo.layers[0], index=il, swa=swa_cells > 0, recurrent=False))
    return dict(kv)
