"""The DSA lightning indexer's K cache beside the MLA latent cache (DeepSeek-V3.2 `deepseek32`, GLM-5 `glm-dsa`;
issue 17), by the rule of the architecture's `Traits.indexer`. The rules and figures: docs/memory-architectures.md
("DeepSeek-V3.2, GLM-5, MiniMax-M2, Grok"), the engine's sources its "Indexer and compressed caches in the engine"."""

from __future__ import annotations

from typing import Final

from moeconf.memory.graph.archs import traits
from moeconf.memory.keys import int_key
from moeconf.model.inventory import Inventory

# the keys a DSA model reads (after `{arch}.`): the indexer's, its dense leading blocks and MTP block
DSA_KEYS: Final = frozenset({"attention.indexer.head_count", "attention.indexer.key_length",
                             "attention.indexer.top_k", "leading_dense_block_count", "nextn_predict_layers"})
_GLM_52_CONTEXT: Final = 1048576  # glm-dsa: at or above it, the GLM-5.2 per-layer table applies


def indexer_width(inv: Inventory) -> int:
    """Elements per cell of each indexer-cached layer's K row (0: no indexer cache)."""
    kind = traits(inv.arch).indexer
    if not kind:
        return 0
    width = int_key(inv, "attention.indexer.key_length") or 0
    # glm5-next: the row caches key | gate | pooled key when attention.indexer.kpool > 0
    return 3 * width if kind == "kpool" and (int_key(inv, "attention.indexer.kpool") or 0) > 0 else width


def indexer_unmodelled(inv: Inventory) -> list[str]:
    """What of the file's indexer the model does not read (empty: it reads all of it)."""
    kind = traits(inv.arch).indexer
    if not kind:
        return []
    why = []
    # glm5-next: every DSA layer keeps an indexer row unless attention.indexer.types marks some shared
    if kind == "kpool" and "attention.indexer.types" in (inv.metadata.arch_keys or ()):
        why.append("glm5-next's per-layer indexer table (attention.indexer.types) is not modelled: which layers keep "
                   "an indexer K cache and run the indexer is unknown")
    if not indexer_width(inv):
        why.append(f"{inv.arch}.attention.indexer.key_length is missing: the engine refuses the file")
    return why + indexer_table_unmodelled(inv)


def indexer_table_unmodelled(inv: Inventory) -> list[str]:
    """Why glm-dsa's per-layer indexer table is not modelled (empty: it is, or the model has none), or
    why a DSA file is refused by the engine (no indexer top-k: the loader requires it)."""
    why = []
    kind = traits(inv.arch).indexer
    if kind in ("all", "full") and not isinstance(inv.metadata.hparam("attention.indexer.top_k"), int):
        why.append(f"{inv.arch}.attention.indexer.top_k is missing: the engine refuses the file")
    typed = "attention.indexer.types" in (inv.metadata.arch_keys or ())
    if kind == "full" and not typed and (inv.metadata.context_length or 0) >= _GLM_52_CONTEXT:
        why.append("memory is not modelled for glm-dsa's built-in per-layer indexer table (GLM-5.2's, which the "
                   "engine takes at a training context of 1M or more when the file has no attention.indexer.types): "
                   "write the table into the file (the converter does, from config.json indexer_types)")
    elif kind == "full" and typed and full_indexers(inv) is None:
        why.append("memory is not modelled for a glm-dsa.attention.indexer.types that is neither one value nor one "
                   "per trunk layer with the first layer full: the engine refuses the file")
    return why


def full_indexers(inv: Inventory) -> tuple[bool, ...] | None:
    """Per trunk layer, whether it runs its own ("full") indexer and keeps an indexer K cache (glm-dsa with
    `attention.indexer.types`, or a "typed" indexer); None without the key, or where the engine refuses it."""
    v = inv.metadata.hparam("attention.indexer.types")
    n = inv.block_count - (int_key(inv, "nextn_predict_layers") or 0)
    kind = traits(inv.arch).indexer
    if kind == "typed":  # one value per layer, the array required (get_arr); the nextn blocks' beyond
        return tuple(x != 0 for x in v[:n]) if isinstance(v, tuple) and len(v) >= n else (False,) * n
    if kind != "full":
        return None
    if isinstance(v, int):
        full = (v != 0,) * n
    elif isinstance(v, tuple) and len(v) == n:
        full = tuple(x != 0 for x in v)
    else:
        return None
    return full if full and full[0] else None


def indexer_row_layers(inv: Inventory, layer_indices: list[int]) -> list[int]:
    """The layers (of those with a KV cache, nextn blocks excluded) that keep an indexer K cache."""
    if not indexer_width(inv) or indexer_unmodelled(inv):
        return []
    full = full_indexers(inv)
    return [il for il in layer_indices if full is None or (il < len(full) and full[il])]
