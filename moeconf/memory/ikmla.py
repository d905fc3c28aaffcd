"""ik_llama.cpp's `-mla` as it really runs (issue 17): the mode ik falls back to, the tensors it computes at load
for it (`llm_prepare_mla`) and the peak of its MLA attention (`build_deepseek2`). Engine facts and measurements:
docs/memory-architectures.md ("ik_llama.cpp on the newer architectures", "ik_llama.cpp `-mla` on mainline DeepSeek
GGUFs") and docs/memory.md ("ik's MLA attention")."""

from __future__ import annotations

from collections import defaultdict
from typing import Final

from moeconf.engines import Engine
from moeconf.engines.settings import MemorySettings
from moeconf.memory.geometry import Geometry
from moeconf.model import ggml
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement
from moeconf.units import MIB


def effective_mla(inv: Inventory, geo: Geometry, settings: MemorySettings) -> int:
    """The `-mla` ik runs with on this file (0: standard attention)."""
    mla = settings.mla if settings.mla is not None else 3
    if not mla or geo.has_kv_b:
        return mla
    computes_kv_b = mla > 1 and {"attn_k_b", "attn_v_b"} <= {t.base for t in inv.tensors}
    return mla if computes_kv_b else 1


def _bytes(type_name: str, shape: tuple[int, ...]) -> int:
    return ggml.nbytes(ggml.type_ids()[type_name], shape) or 0


def computed_weights(placement: Placement, geo: Geometry, mla: int) -> dict[str, int]:
    """Bytes per device of the tensors ik computes at load (docs: "ik_llama.cpp `-mla` on mainline DeepSeek GGUFs")."""
    if not geo.mla_arch:
        return {}
    out: dict[str, int] = defaultdict(int)
    n_head, r = geo.n_head, geo.kv_lora_rank
    nope, v = geo.head_k_mla - geo.n_rot, geo.head_v_mla
    by = placement.inventory.by_name
    for il in range(placement.inventory.block_count):
        kv_b, k_b, v_b = (by.get(f"blk.{il}.attn_{name}.weight") for name in ("kv_b", "k_b", "v_b"))
        if kv_b is not None and k_b is None and mla > 0:
            k_type = kv_b.type if kv_b.type in ("F32", "F16", "BF16") else "Q8_0"
            src, size = kv_b, _bytes(k_type, (nope, r, n_head)) + _bytes(kv_b.type, (r, v, n_head))
        elif kv_b is None and k_b is not None and v_b is not None and mla != 1:
            t = k_b.type if k_b.type == v_b.type and k_b.type in ("F16", "BF16") else "Q8_0"
            src, size = k_b, _bytes(t, (r, n_head * (nope + v)))
        else:
            continue
        dev = placement.devices.get(src.name)
        if dev is not None:
            out[dev] += size
    return dict(out)


# --- compute: ik's MLA attention (deepseek2, glm-dsa; docs/memory.md, "ik's MLA attention") ---
# the largest amount by which a compute buffer ik logged exceeded moeconf's figure, MiB, at -ub up to MARGIN_UBATCH
MARGIN_MIB: Final = 37
MARGIN_UBATCH: Final = 2048
IK_PR_AMB_256: Final = "2026-08-13"  # ik PR #2312: -amb defaults to 256 (was 0)
MEASURED_BUFFERS: Final = 41  # device compute buffers ik sized by its MLA attention (39 command lines)
PP_MIN_TOKENS: Final = 128  # `pp_opt`: ik's prompt-processing form of the attention from this many tokens


def heads_per_chunk_pp(n_head: int, kv_f32_mib: int, amb: int) -> int:
    """-mla 2/3, flash attention: the heads ik decompresses at once (docs/memory.md, "ik's MLA attention")."""
    if amb <= 0 or kv_f32_mib <= amb:
        return n_head
    for niter in range(2, n_head):
        if n_head % niter == 0 and kv_f32_mib // niter <= amb:
            return n_head // niter
    return 1


def heads_per_step_kq(n_head: int, kq_mib: int, amb: int) -> int:
    """The KQ form (flash attention off): the heads of one of ik's -amb steps (docs/memory.md, "ik's MLA attention")."""
    if amb <= 0 or amb >= kq_mib:
        return n_head
    steps = min(-(-kq_mib // amb), n_head)
    return -(-n_head // steps)


def attention_form(mla: int, fa: bool, n_tokens: int) -> str | None:
    """Which of build_deepseek2's attention forms ik reserves its graph with (None: -mla 0, not modelled here)."""
    if mla == 0:
        return None
    if fa and mla > 1 and n_tokens >= PP_MIN_TOKENS:
        return "pp"  # K and V decompressed from the latent cache, flash attention over them
    if fa and (mla == 1 or mla == 3):
        return "latent-fa"  # flash attention over the latent cache with absorbed queries
    return "kq"  # absorbed queries, the f32 KQ matrix and its softmax


def attention_peak(geo: Geometry, n_kv: int, n_tokens: int, mla: int, fa: bool, amb: int) -> int | None:
    """Bytes of ik's compute buffer at its MLA attention's peak on a device running attention layers (None: a form
    not modelled), over n_kv cells at a ubatch of n_tokens (docs/memory.md, "ik's MLA attention")."""
    form = attention_form(mla, fa, n_tokens)
    if form is None:
        return None
    H, r, p, E, T = geo.n_head, geo.kv_lora_rank, geo.n_rot, geo.n_embd, n_tokens
    n, v = geo.head_k_mla - p, geo.head_v_mla
    mask = n_kv * ggml.pad(T, 16) * (2 if fa else 4)
    # per token the layer input, Q, its roped part, the absorbed Q-nope and the concatenated Q
    absorbed_tokens = 4 * (E + H * (n + p) + H * p + H * r + H * (r + p)) * T
    if form == "pp":
        hc = heads_per_chunk_pp(H, H * (n + v) * n_kv * 4 // MIB, amb)
        # in chunks, the roped K repeated to a chunk's heads, beside the output concatenated so far
        chunked = n_kv * hc * p * 2 + 4 * H * v * T if hc < H else 0
        return mask + n_kv * hc * (n + v) * 6 + 4 * (E + 2 * H * (n + p) + H * p) * T + chunked
    if form == "kq":
        # the f32 KQ of a step of heads (its SOFT_MAX in place), with -mla 2/3 the f16 transposed latent
        hs = heads_per_step_kq(H, n_kv * T * H * 4 // MIB, amb)
        stepped = 4 * H * r * T if hs < H else 0  # in steps, the latent output concatenated so far
        return mask + 4 * n_kv * T * hs + (n_kv * r * 2 if mla > 1 else 0) + absorbed_tokens + stepped
    return mask + absorbed_tokens


def margin_mib(n_tokens: int, mib: int = MARGIN_MIB) -> int:
    """A margin measured at -ub up to MARGIN_UBATCH, grown in proportion above it (also ikarchs.margin_mib's)."""
    return mib if n_tokens <= MARGIN_UBATCH else -(-mib * n_tokens // MARGIN_UBATCH)


def default_amb(settings: MemorySettings, engine: Engine) -> int:
    """The -amb ik runs with: as given, else its version's default (0 in 0.1.5; 256 since ik PR #2312)."""
    if settings.amb is not None:
        return settings.amb
    return 256 if (engine.date or "") >= IK_PR_AMB_256 else 0
