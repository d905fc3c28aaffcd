"""Recurrent (linear-attention) layers of hybrid MoEs, as the pinned llama.cpp (0.3.36) allocates them: which
layers are recurrent, the per-sequence state they keep. The rules, figures and engine sources (and the kinds of
`Traits.recurrent` in memory/graph/archs): docs/memory-architectures.md, "Recurrent layers in the engine"."""

from __future__ import annotations

from moeconf.engines.archkeys import MAINLINE
from moeconf.memory.graph.archs import traits
from moeconf.memory.keys import int_key
from moeconf.memory.rshape import RecurrentShape
from moeconf.model.inventory import Inventory

# the `{arch}.*` keys this module reads (moeconf.memory.support lists them as modelled)
KEYS = frozenset({"ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank",
                  "ssm.group_count", "full_attention_interval", "attention.recurrent_layers",
                  "rope.dimension_sections"})


def shape(inv: Inventory) -> RecurrentShape | None:
    """The recurrent layers' dimensions, None when the architecture has none modelled here."""
    kind = traits(inv.arch).recurrent
    if kind == "lightning":
        heads = inv.metadata.head_count or 0
        hd = int_key(inv, "attention.key_length") or ((inv.metadata.embedding_length or 0) // heads if heads else 0)
        return RecurrentShape(0, heads * hd, hd, 0, heads) if heads and hd else None
    if kind not in ("delta_net", "mamba2", "mamba"):
        return None
    vals = [int_key(inv, k) for k in ("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank")]
    if any(v is None for v in vals):
        return None
    d_conv, d_inner, d_state, n_v = (v or 0 for v in vals)
    n_group = int_key(inv, "ssm.group_count")  # hparams.ssm_n_group: 0 where the loader does not read it (Jamba)
    if n_group is None and kind != "mamba":
        return None
    return RecurrentShape(d_conv, d_inner, d_state, n_group or 0, n_v)


def recurrent_layers(inv: Inventory) -> frozenset[int]:
    """The trunk layers the engine marks recurrent (see the module's notes)."""
    kind = traits(inv.arch).recurrent
    md = inv.metadata
    if kind == "mamba2":
        return _zero_layers(inv, md.head_count_kv, md.hparam("feed_forward_length"))
    if is_kda(inv) or kind == "mamba" or shortconv_shape(inv) is not None:
        return _zero_layers(inv, md.head_count_kv)  # KDA, short-conv and Mamba layers: no KV heads
    if kind not in ("delta_net", "lightning"):
        return frozenset()
    n_layer = md.block_count - (int_key(inv, "nextn_predict_layers") or 0)
    arr = md.hparam("attention.recurrent_layers")
    if isinstance(arr, tuple):
        return frozenset(il for il in range(min(n_layer, len(arr))) if arr[il])
    interval = int_key(inv, "full_attention_interval") or (8 if kind == "lightning" else 4)
    return frozenset(il for il in range(n_layer) if (il + 1) % interval != 0)


def shortconv_shape(inv: Inventory) -> RecurrentShape | None:
    """LFM2's short-convolution state, None without `shortconv.l_cache` (see the module's notes)."""
    l_cache, n_embd = int_key(inv, "shortconv.l_cache"), inv.metadata.embedding_length
    return RecurrentShape(l_cache, n_embd, 0, 0, 0) if l_cache and n_embd else None


# the keys Kimi-Linear's KDA layers read (docs/memory-architectures.md, "Kimi-Linear")
KDA_KEYS = frozenset({"ssm.conv_kernel", "kda.head_dim"})


def kda_dims(inv: Inventory) -> RecurrentShape | None:
    """The KDA layers' state, None where the file lacks a size (see the module's notes)."""
    d_conv, head_dim, n_head = int_key(inv, "ssm.conv_kernel"), int_key(inv, "kda.head_dim"), inv.metadata.head_count
    return (RecurrentShape(d_conv, n_head * head_dim, head_dim, n_head, n_head) if d_conv and head_dim and n_head
            else None)


def is_kda(inv: Inventory) -> bool:
    """Whether the file's recurrent layers are KDA layers (its llama.cpp loader reads `kda.head_dim`, or it has it)."""
    return "kda.head_dim" in MAINLINE.get(inv.arch, frozenset()) or int_key(inv, "kda.head_dim") is not None


def _zero_layers(inv: Inventory, *values: int | tuple[int, ...] | None) -> frozenset[int]:
    """The layers where every value is 0, each one per layer or one for all (get_key_or_arr)."""
    n = inv.metadata.block_count
    cols = [v if isinstance(v, tuple) else (v,) * n for v in values]
    return frozenset(il for il in range(min(n, *map(len, cols))) if all(c[il] == 0 for c in cols))


def state_bytes(inv: Inventory, n_seq_max: int) -> int:
    """One recurrent layer's state (every recurrent layer of a model has the same), 0 if unknown."""
    s = kda_dims(inv) if is_kda(inv) else shape(inv) or shortconv_shape(inv)
    return s.state_bytes(n_seq_max) if s is not None else 0


def ple_bytes(inv: Inventory, il: int, n_seq_max: int) -> int:
    """Qwen4Exp's PLE conv history, bytes; 0 elsewhere (see the module's notes)."""
    t = inv.by_name.get(f"blk.{il}.ple_conv1d.weight")
    dilation = int_key(inv, "ple.ngram_size")
    if t is None or not dilation:
        return 0
    return (t.shape[0] - 1) * dilation * t.shape[1] * 4 * max(1, n_seq_max)


def unmodelled_settings(inv: Inventory, offload_kqv: bool) -> list[str]:
    """Settings whose memory is not modelled for this hybrid (empty: all are)."""
    if is_kda(inv) and (kda_dims(inv) is None or not _zero_layers(inv, inv.metadata.head_count_kv)):
        # without them the KDA state and activations would silently be 0
        return [f"memory is not modelled for this {inv.arch} file: it lacks {inv.arch}.ssm.conv_kernel, "
                f"{inv.arch}.kda.head_dim or a per-layer attention.head_count_kv marking the KDA layers"]
    if traits(inv.arch).recurrent in ("delta_net", "kda", "lightning") and not offload_kqv:
        # the scans and the attention on the CPU: not checked (docs/memory-architectures.md, "Hybrid recurrent MoEs")
        return [f"memory is not modelled for -nkvo (--no-kv-offload) on {inv.arch}: the host's compute buffer "
                "(recurrent scans and attention run on the CPU) is not computed"]
    return []
