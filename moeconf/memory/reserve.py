"""The reserve from its parts: what a CUDA GPU holds beyond ggml's buffers (issue 26, item 6). `reserve_parts` names
each part with its size and source; `reserve_for` gives the figure a device keeps free (their sum on a card whose
every part was measured on it, else the default margin, or `--reserve`): docs/memory.md, "The reserve from its
parts"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moeconf.engines.settings import DEFAULT_RESERVE
from moeconf.memory.graph.sched import ROW_PADDING
from moeconf.model import ggml
from moeconf.units import MIB

if TYPE_CHECKING:
    from moeconf.engines.settings import MemorySettings
    from moeconf.model.inventory import Inventory, Tensor

# the quantized types the pinned CUDA backend multiplies with MMQ (mmq.cu, ggml_cuda_should_use_mmq)
MMQ_TYPES = frozenset({
    "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL", "MXFP4", "NVFP4",
})
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
_Q8_1_MMQ = (144, 128)  # block_q8_1_mmq: 144 bytes per 128 values (mmq.cuh)
_J_MAX = 512  # ggml_cuda_mmq_get_J_max caps the tile at 512 columns: that many extra q8_1 blocks
_FIXUP_PER_SM = 128 * 128 * 4  # stream-k fixup: one I x J f32 tile per block; I, J <= 128 on NVIDIA
_GRANULARITY = 2 * MIB  # the VMM pool grows in the device's recommended granularity (2 MiB on NVIDIA GPUs)
_MAX_SM = 192  # SMs assumed for a card not in the table: the full GB202 die (RTX PRO 6000 Blackwell enables 188)

_H200 = "../shared/memory-facts.md section 5 (NVIDIA H200, driver 580.159, CUDA 13.0)"
_CUBLAS_HANDLE = 68 * MIB
# what the H200 lines held beyond ggml's buffers, the context, cuBLAS and the computed pool ("other")
_OTHER_H200 = 80 * MIB


@dataclass(frozen=True)
class Part:
    """One part of the reserve: its name, bytes, and where the figure comes from."""

    name: str
    size: int
    source: str

    def json(self) -> dict[str, object]:
        return {"name": self.name, "bytes": self.size, "source": self.source}


@dataclass(frozen=True)
class Card:
    """What is known of one card's CUDA overhead: its context (measured or reported), SMs, the parts measured."""

    name: str
    match: str  # a regular expression searched in the card's name as nvidia-smi prints it, case-insensitive
    context: int
    context_source: str
    n_sm: int
    hopper_or_newer: bool  # cuBLAS workspace 32 MiB (compute capability >= 9.0), else 4 MiB
    measured: bool  # every part was measured on it: then its parts replace the default margin (reserve_for)


_REPORTED = "reported: cudaMemGetInfo's primary context (github.com/ggml-org/llama.cpp/pull/23604)"
CARDS: tuple[Card, ...] = (
    Card("NVIDIA H200", r"\bh200\b", 526 * MIB,
         f"measured: cudaMemGetInfo right after context creation, {_H200}", 132, True, True),
    Card("NVIDIA RTX PRO 6000 Blackwell", r"\brtx pro 6000\b", 555 * MIB, _REPORTED, 188, True, False),
    Card("NVIDIA GeForce RTX 4060 Ti", r"\b4060 ti\b", 107 * MIB, _REPORTED, 34, False, False),
)
# the largest CUDA context reported for any card (docs/memory.md, "The reserve from its parts")
_LARGEST_CONTEXT = max(CARDS, key=lambda c: c.context)


def card_row(card: str | None) -> Card | None:
    """The table's row for a card name or family string, or None."""
    return next((c for c in CARDS if re.search(c.match, card, re.IGNORECASE)), None) if card else None


def op_pool_bytes(t: Tensor, rows: int, experts_used: int, n_sm: int, mmq: bool = True) -> int:
    """The pool's temporaries while CUDA multiplies `rows` activations by `t` (by MMQ if `mmq`; see pool_bytes)."""
    k_in, n_out = t.shape[0], t.shape[1]
    expert = len(t.shape) == 3
    r = rows * experts_used if expert else rows
    if t.type == "F32":
        return 0  # cuBLAS's sgemm reads the weight and the f32 activations in place
    quantized = t.type not in _FLOAT_TYPES
    if quantized and mmq and t.type in MMQ_TYPES:
        q8 = r * ggml.pad(k_in, ROW_PADDING) * _Q8_1_MMQ[0] // _Q8_1_MMQ[1] + _J_MAX * _Q8_1_MMQ[0]
        ids = 2 * r * 4 + (t.shape[2] + 1) * 4 if expert else 0
        return q8 + ids + n_sm * _FIXUP_PER_SM
    # cuBLAS (ggml_cuda_mul_mat_cublas_impl): the weight dequantized to f16, the input and output in f16
    inner = (k_in * n_out * 2 if quantized else 0) + rows * k_in * 2 + rows * n_out * 2
    if not expert:
        return inner
    # ggml_cuda_mul_mat_id's generic path first sorts the rows by expert
    return 2 * r * 4 + r * k_in * (4 if quantized else 2) + r * n_out * 4 + inner


def pool_bytes(inv: Inventory, settings: MemorySettings, n_sm: int, volta: bool = False) -> int:
    """The CUDA pool after the first prompt, `volta` a V100's (docs/memory.md, "The reserve from its parts")."""
    rows = min(settings.n_ubatch, settings.n_batch)
    k = inv.metadata.expert_used_count or 1
    top = 0
    for t in inv:
        if len(t.shape) >= 2 and t.group != "norm" and not t.name.startswith("token_embd"):  # a matrix weight
            # the output weight at the rows the binary outputs (docs/memory.md, "The reserve from its parts")
            r = settings.output_rows(rows) if t.group == "output" else rows
            top = max(top, op_pool_bytes(t, r, k, n_sm, mmq=not (volta and r >= 64)))
    return ggml.pad(top, _GRANULARITY)


def _volta(card: str | None) -> bool:
    """A Volta card: no int8 tensor cores, so quantized weights at a batch of 64 or more take cuBLAS (mmq.cu)."""
    return card is not None and any(v in card.lower() for v in ("v100", "titan v", "volta"))


def reserve_parts(card: str | None, settings: MemorySettings, inv: Inventory) -> tuple[Part, ...]:
    """The reserve's parts for one GPU of `card` (a name or family string; None: unknown)."""
    row = card_row(card)
    ctx_row = row or _LARGEST_CONTEXT
    n_sm = row.n_sm if row else _MAX_SM
    hopper = row.hopper_or_newer if row else not _volta(card)
    other_src = "measured on the H200" if row and row.measured else "as measured on the H200 (not on this card)"
    ctx_src = ctx_row.context_source if row else (
        f"the largest reported ({ctx_row.name}, {ctx_row.context_source}); the card is not in the table")
    return (
        Part("CUDA context", ctx_row.context, ctx_src),
        Part("cuBLAS handle", _CUBLAS_HANDLE,
             f"{other_src}: cublasCreate under CUDA's default lazy module loading, {_H200} "
             "(458 MiB with CUDA_MODULE_LOADING=EAGER: not covered)"),
        Part("cuBLAS workspace", (32 if hopper else 4) * MIB,
             "ggml-cuda/common.cuh cublas_handle(): 32 MiB at compute capability 9.0 and newer, else 4 MiB"),
        Part("CUDA pool", pool_bytes(inv, settings, n_sm, volta=_volta(card)),
             f"computed: the largest op's temporaries at -ub {settings.n_ubatch} ({n_sm} SMs), "
             "ggml-cuda ggml_cuda_pool_vmm, mmq.cu, ggml_cuda_mul_mat_cublas_impl, ggml_cuda_mul_mat_id"),
        Part("other", _OTHER_H200,
             f"{other_src}: kernel modules loaded on first use, CUDA graphs, the driver's allocations "
             f"(largest residual over the H200 lines compute is replayed exactly, {_H200})"),
    )


@dataclass(frozen=True)
class Reserve:
    size: int
    parts: tuple[Part, ...]
    basis: str  # "parts", "default" or "given"

    def json(self) -> dict[str, object]:
        return {"bytes": self.size, "basis": self.basis, "parts": [p.json() for p in self.parts]}


def reserve_for(card: str | None, settings: MemorySettings, inv: Inventory, given: int | None = None) -> Reserve:
    """What one GPU keeps free for what no engine reports. `given` (--reserve) overrides; a card
    whose parts were all measured on it gets their sum; any other the default margin."""
    if given is not None:
        return Reserve(given, (Part("given", given, "--reserve"),), "given")
    parts = reserve_parts(card, settings, inv)
    total = sum(p.size for p in parts)
    if (row := card_row(card)) is not None and row.measured:
        return Reserve(total, parts, "parts")
    return Reserve(max(DEFAULT_RESERVE, total), parts, "default")
