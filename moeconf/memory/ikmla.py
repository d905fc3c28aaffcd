"""ik_llama.cpp's MLA mode as it really runs, and the tensors it computes at load for it
(issue 17). Facts from ik_llama.cpp 0.1.5 (`src/llama.cpp`):

- `llm_prepare_mla` (called from `llm_load_tensors` with the `-mla` value) converts between the two
  GGUF forms of DeepSeek's attention up-projection. A file with `attn_kv_b` but no `attn_k_b`
  (ik-style conversions) gets `wk_b` (Q8_0 when `attn_kv_b` is quantized, else its type,
  `nope x kv_lora_rank x n_head`) and `wv_b` (`attn_kv_b`'s type, `kv_lora_rank x v x n_head`) for
  any `-mla` > 0. A file with `attn_k_b` + `attn_v_b` but no `attn_kv_b` (mainline conversions)
  gets `wkv_b` (`kv_lora_rank x n_head (nope + v)`, f16/bf16 when both are, else Q8_0) for any
  `-mla` but 1 (0 included: `llm_prepare_mla` returns early only for 1). Each is a buffer of its
  own, allocated on the buffer type of the tensor it is computed from.
- `-mla 0` on a mainline conversion (`head_count_kv` 1, `key_length` 576): ik's `load_hparams`
  (src/llama-hparams.cpp, deepseek2 and glm-dsa) restores `n_head` KV heads of `key_length_mla`
  and `value_length_mla`, and `llama_kv_cache_init` keeps a full K and V cache of those heads
  (GLM-5 cut to 4 attention layers at 4096 f16: 1,024 MiB against the latent's 18).
- `llama_kv_cache_init` falls back to `-mla 1` only when a layer still has no `wkv_b` after that:
  so a mainline GGUF at `-mla 3 -fa off` keeps ONE latent cache of `kv_lora_rank + n_rot` per cell
  in the V type (DeepSeek-V3 at 32k f16: 2,196 MiB, as a real-GPU log shows), not the `-mla 1`
  K + V^T pair (4,148 MiB) moeconf modelled before."""

from __future__ import annotations

from collections import defaultdict

from moeconf.memory.geometry import Geometry
from moeconf.memory.settings import MemorySettings
from moeconf.model import ggml
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

_QUANT_FREE = ("F32", "F16", "BF16")


def _bases(inv: Inventory) -> set[str]:
    return {t.base for t in inv.tensors}


def effective_mla(inv: Inventory, geo: Geometry, settings: MemorySettings) -> int:
    """The `-mla` ik runs with on this file (0: standard attention)."""
    mla = settings.mla if settings.mla is not None else 3
    if not mla or geo.has_kv_b:
        return mla
    bases = _bases(inv)
    computes_kv_b = mla > 1 and "attn_k_b" in bases and "attn_v_b" in bases
    return mla if computes_kv_b else 1


def _bytes(type_name: str, shape: tuple[int, ...]) -> int:
    n = ggml.nbytes(ggml.type_ids()[type_name], shape)
    return n or 0


def computed_weights(placement: Placement, geo: Geometry, mla: int) -> dict[str, int]:
    """Bytes per device of the tensors ik computes at load (see the module's note)."""
    inv = placement.inventory
    out: dict[str, int] = defaultdict(int)
    if not geo.mla_arch:
        return {}
    n_head, r = geo.n_head, geo.kv_lora_rank
    nope = geo.head_k_mla - geo.n_rot
    v = geo.head_v_mla
    by = inv.by_name
    for il in range(inv.block_count):
        kv_b = by.get(f"blk.{il}.attn_kv_b.weight")
        k_b = by.get(f"blk.{il}.attn_k_b.weight")
        v_b = by.get(f"blk.{il}.attn_v_b.weight")
        if kv_b is not None and k_b is None and mla > 0:
            dev = placement.devices.get(kv_b.name)
            if dev is None:
                continue
            k_type = kv_b.type if kv_b.type in _QUANT_FREE else "Q8_0"
            out[dev] += _bytes(k_type, (nope, r, n_head)) + _bytes(kv_b.type, (r, v, n_head))
        elif kv_b is None and k_b is not None and v_b is not None and mla != 1:
            dev = placement.devices.get(k_b.name)
            if dev is None:
                continue
            t = k_b.type if k_b.type == v_b.type and k_b.type in ("F16", "BF16") else "Q8_0"
            out[dev] += _bytes(t, (r, n_head * (nope + v)))
    return dict(out)
