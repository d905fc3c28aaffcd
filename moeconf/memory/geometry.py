"""Attention and activation geometry of a model, as the engines derive it from the metadata: per layer K and V
row widths, sliding-window (or chunked) layers, MLA and the experts; what the engine decides by the architecture's
name is its composition module's `TRAITS` (memory/graph/archs, `traits`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from moeconf.memory.graph.archs import traits
from moeconf.memory.keys import int_key
from moeconf.memory.recurrent import recurrent_layers
from moeconf.model.inventory import Inventory
from moeconf.model.percache import per_inventory

SwaType = Literal["none", "standard", "chunked"]

@dataclass(frozen=True)
class LayerAttention:
    index: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    swa: bool
    recurrent: bool = False  # a recurrent (linear-attention) layer: state, no KV (memory/recurrent.py)


@dataclass(frozen=True)
class Geometry:
    n_embd: int
    n_head: int
    layers: tuple[LayerAttention, ...]  # layers that have a KV cache (nextn blocks excluded)
    swa_type: SwaType
    n_swa: int
    mla: bool  # mainline's is_mla(): the GGUF has key_length_mla / value_length_mla
    mla_arch: bool  # attn_kv_a_mqa layers (what ik's -mla acts on)
    kv_lora_rank: int
    head_k_mla: int  # per-head query/key width before absorption (nope + rope)
    head_v_mla: int
    n_rot: int
    has_kv_b: bool  # attn_kv_b present (ik: otherwise -mla falls back to 1)
    # routed experts (the count from tensor shapes)
    n_expert: int
    n_expert_used: int
    nextn_kv: tuple[LayerAttention, ...] = ()  # nextn blocks that hold a KV cache too (`Traits.nextn_kv`)

    def v_row(self, la: LayerAttention, transposed: bool) -> int:
        """A layer's V cache row, the widest layer's if `transposed` (docs/memory.md, "Memory per device")."""
        if not transposed or not la.n_head_kv:
            return la.n_head_kv * la.head_v
        return max((x.n_head_kv * x.head_v for x in self.layers if not x.recurrent), default=0)


class GeometryUnknown(Exception):
    """The inventory lacks what memory needs (a version-1 manifest, or missing head counts)."""


def per_layer(v: int | tuple[int, ...] | None, il: int, default: int) -> int:
    if isinstance(v, tuple):
        return v[il] if il < len(v) else default
    return default if v is None else v


@per_inventory  # a fit estimates hundreds of placements of one model; Geometry is immutable
def geometry(inv: Inventory) -> Geometry:
    md = inv.metadata
    if not md.geometry_known:
        raise GeometryUnknown("the manifest is version 1 (no attention geometry): regenerate it with "
                              "`moeconf inspect MODEL.gguf --manifest`")
    if md.embedding_length is None or md.head_count is None:
        raise GeometryUnknown(f"the metadata has no {md.arch}.embedding_length or attention.head_count")
    n_embd, n_head = md.embedding_length, md.head_count
    head_k = md.key_length or n_embd // n_head
    head_v = md.value_length or n_embd // n_head
    swa_type: SwaType = "none"
    n_swa = 0
    pattern: int | tuple[int, ...] = 0
    arch = traits(md.arch)
    if arch.swa is not None:
        kind, default_window = arch.swa.kind, arch.swa.window
        window = md.sliding_window if md.sliding_window is not None else default_window
        if window:
            swa_type, n_swa = kind, window if kind != "chunked" else (default_window or window)
            pattern = md.sliding_window_pattern if md.sliding_window_pattern is not None else arch.swa.pattern
    nextn = set(inv.layers_of_kind("nextn"))
    recurrent = recurrent_layers(inv)
    # per-layer head counts and the sliding-window layers' own head widths (docs/memory.md, "Memory per device")
    heads = md.hparam("attention.head_count")
    head_k_swa = int_key(inv, "attention.key_length_swa") or head_k
    head_v_swa = int_key(inv, "attention.value_length_swa") or head_v
    layers = []
    nextn_kv = []
    for il in range(md.block_count):
        n_kv = per_layer(md.head_count_kv, il, n_head)
        if il in nextn:
            if arch.nextn_kv:
                nextn_kv.append(LayerAttention(il, n_head, n_kv, head_k, head_v, False))
            continue
        if isinstance(pattern, tuple):
            swa = bool(pattern[il]) if il < len(pattern) else False
        else:
            first = arch.swa is not None and arch.swa.dense_first
            swa = swa_type != "none" and (pattern == 0 or (il % pattern != 0 if first else il % pattern < pattern - 1))
        layers.append(LayerAttention(il, per_layer(heads if isinstance(heads, tuple) else None, il, n_head), n_kv,
                                     head_k_swa if swa else head_k, head_v_swa if swa else head_v, swa,
                                     recurrent=il in recurrent))
    bases = {t.base for t in inv.tensors}
    n_expert = max((t.shape[2] for t in inv.tensors if t.base == "ffn_up_exps" and len(t.shape) > 2), default=0)
    return Geometry(
        n_embd=n_embd, n_head=n_head, layers=tuple(layers), swa_type=swa_type, n_swa=n_swa,
        mla=bool(md.key_length_mla and md.value_length_mla), mla_arch="attn_kv_a_mqa" in bases,
        kv_lora_rank=md.kv_lora_rank or 0, head_k_mla=md.key_length_mla or head_k,
        head_v_mla=md.value_length_mla or head_v, n_rot=md.rope_dimension_count or head_k,
        has_kv_b="attn_kv_b" in bases, n_expert=n_expert, n_expert_used=md.expert_used_count or 0,
        nextn_kv=tuple(nextn_kv))
