"""ik_llama.cpp on the newer MoE architectures (issue 17): weights and KV cache modelled, compute
not. Facts from ik_llama.cpp 0.1.5 (vendored in ik-llama-cpp-python 0.1.5, `src/`), checked
against the buffer sizes ik logs on real loads of cut layouts (tests/engine/test_ik_newer.py,
figures in tests/data/ik_newer_figures.json):

- Weights: the tensors ik loads as placed (moeconf/model/nametable.py IK_ARCH_TENSORS), plus, for
  glm-dsa and mistral4 (mainline conversions: `attn_k_b`/`attn_v_b`), the `wkv_b` ik computes at
  load from them for `-mla` 2 and 3, in every block including a GLM MTP block whose other tensors
  it skips (`llm_prepare_mla`; memory/ikmla.py).
- KV (`llama_kv_cache_init`, src/llama.cpp): one cache of `n_ctx` cells whatever `-np` (ik has
  no per-sequence streams), for the trunk blocks only (`n_layer - nextn_predict_layers`).
  glm-dsa and mistral4 (Mistral-Small-4, whose ik graph is build_deepseek2) take the MLA path
  (the latent of `kv_lora_rank + n_rot` per cell); for glm-dsa ik allocates NO
  lightning-indexer key cache (and never runs the indexer: its graph is DeepSeek's dense MLA).
  Qwen3.5-MoE and Qwen3-Next: the attention layers keep K and V, each recurrent layer one F32
  state of `n_embd_v_s()` per slot (`llama-hparams.h`: `(conv_kernel - 1) * (2 * state_size *
  group_count + inner_size) + head_v_dim^2 * time_step_rank`, `head_v_dim = inner_size /
  time_step_rank`), `min(max(1, -np), n_ctx)` slots (`llama_qwen3next_state_slots`), in the same
  KV buffer as the layer's K and V. That equals mainline's conv + delta-net state when
  `head_v_dim == state_size` (every published Qwen3-Next and Qwen3.5 model); a file where they
  differ is refused here.
- Which layers are recurrent (`src/llama-hparams.cpp`, `load_hparams`): qwen35moe reads
  `full_attention_interval` (default 4); qwen3next ignores it and takes every 4th layer as
  attention; neither reads `attention.recurrent_layers` nor, for qwen35moe, `nextn_predict_layers`.
  A file whose keys would make mainline (and so moeconf's layer map) differ is refused on ik.
- MTP blocks: qwen35moe, mimo2 and step35 (`IK_NEXTN_UNREAD`) do not read `nextn_predict_layers` on
  ik, so a file with MTP blocks would run them as trunk layers there: refused on ik (the mimo2 and
  step35 cuts measured have none).
- Keys ik requires that llama.cpp does not (`IK_REQUIRED_KEYS`: mistral4's leading dense blocks,
  mimo2's and step35's sliding RoPE base, step35's SwiGLU limits): a file without them fails to load
  on ik, and is refused there.
- Compute: ik builds its own graphs (src/llama-build-context.cpp: fused MoE up/gate, its MLA and
  delta-net kernels) and has no allocation-free projection to check them against. moeconf sizes
  ik's compute buffers (these architectures and `MODELLED_IN_FULL`) as llama.cpp's
  graph of the same model and placement (the llama.cpp memory model run on the same placement with
  ik's one KV cache, full-size window cells and the whole ubatch's outputs), plus, with flash
  attention off, the second f32 KQ matrix ik keeps, plus a margin per architecture MEASURED on ik:
  its logged compute buffers on real loads of cut layouts, each device an RPC server or the host
  (tests/engine/test_ik_compute.py; figures with the ik commit in tests/data/ik_compute_figures.json)
  against that estimate; the margin is the worst difference seen (`COMPUTE_MARGINS`). The figure is
  labelled estimated (`compute_label`): no GPU measured it. deepseek2 and glm-dsa, whose MLA
  attention in ik holds several GiB more than llama.cpp's graph, growing with the context
  (`MLA_MODELLED`): each device running attention takes the larger of llama.cpp's graph and ik's
  MLA attention peak, modelled from ik's graph (memory/ikmla.py), plus its measured margin.
  Where llama.cpp's graph is not modelled for the model or settings, compute is refused with the
  next step (`next_step`, `compute_next_step`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import moeconf.memory.ikmla as ikmla
import moeconf.memory.recurrent as _recurrent
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS, int_key, neutral
from moeconf.model.inventory import Inventory

ENGINE: Final = "ik_llama.cpp"

# the architectures whose memory on ik is modelled in full as on llama.cpp (weights, KV cache and compute,
# reading the keys their compositions read: support.MODELLED; compute with the margins below); their weights and
# KV checked against ik 0.1.5's logged model and KV buffers (docs/memory.md, ik_llama.cpp)
MODELLED_IN_FULL: Final = frozenset({"qwen3moe", "glm4moe", "deepseek2", "gpt-oss", "llama4"})


# the architectures whose weights and KV cache on ik are modelled here (compute: llama.cpp's graph plus the
# margin measured on ik, `COMPUTE_MARGINS`, or ik's MLA model, `MLA_MODELLED`; refused where neither is), each
# reading the `{arch}.*` keys (beyond support.NO_MEMORY_EFFECT) its llama.cpp memory
# model reads (support.MODELLED), except where ik's loader reads others (`_IK_KEYS`)
KV_ONLY: Final = frozenset({"qwen35moe", "qwen3next", "glm-dsa", "minimax-m2", "grok", "ernie4_5-moe",
                            "bailingmoe2", "dots1", "qwen3vlmoe", "hunyuan-moe", "llama", "arctic",
                            "granitemoe", "mistral3", "qwen2moe", "gemma4", "mistral4", "mimo2", "step35"})
_IK_KEYS: Final[dict[str, frozenset[str]]] = {
    "qwen35moe": _recurrent.KEYS,
    "qwen3next": _recurrent.KEYS,
    "glm-dsa": MLA_KEYS | DSA_KEYS,
}


# MoE architectures in ik 0.1.5's tables whose published or converted MoE files it does not run (a real load of a
# cut layout, tests/engine/test_ik_newer.py): memory stays refused on ik, saying why, and the next step is llama.cpp
IK_FAILS: Final[dict[str, str]] = {
    "dbrx": ("ik 0.1.5 sizes dbrx's experts as feed_forward_length / expert_used_count (src/llama-load-tensors.cpp, "
             "create_std_ffn_exps), a quarter of the width DBRX files hold: the load fails (check_tensor_dims: "
             "'blk.0.ffn_up_exps.weight' has wrong shape)"),
    "minicpm": ("ik 0.1.5's minicpm tensor names (src/llama-model.cpp, LLM_TENSOR_NAMES) have only per-expert "
                "tensors (blk.N.ffn_gate.X), so create_llama_tensors cannot find merged ffn_*_exps and the load "
                "fails (require_tensor_meta: 'blk.0.ffn_gate.0.weight' not found)"),
    "granite": ("ik 0.1.5's granite tensor names (src/llama-model.cpp, LLM_TENSOR_NAMES) have no router or expert "
                "tensors: an MoE file of it fails to load (check_tensor_dims: '__missing__' not found)"),
    "refact": ("ik 0.1.5's refact tensor names (src/llama-model.cpp, LLM_TENSOR_NAMES) have no router or expert "
               "tensors: an MoE file of it fails to load (check_tensor_dims: '__missing__' not found)"),
}


# MoE architectures ik 0.1.5 loads whose memory on ik is not measured yet: what a measurement has to deal with
# (none since mistral4, step35 and mimo2 were measured: IK_REQUIRED_KEYS holds the keys their loads needed)
IK_NOT_MEASURED: Final[dict[str, str]] = {}


def why_not(arch: str, engine: str) -> str:
    """Why moeconf does not size `arch` on `engine` where ik cannot run it or it was not measured
    there (empty otherwise)."""
    if engine != ENGINE:
        return ""
    reason = IK_FAILS.get(arch) or IK_NOT_MEASURED.get(arch)
    return f": {reason}" if reason else ""


def kv_only(arch: str, engine: str) -> bool:
    """Whether this architecture's weights and KV on `engine` are modelled by this module (the
    newer architectures on ik_llama.cpp); its compute comes from llama.cpp's graph (`compute_label`)."""
    return engine == ENGINE and arch in KV_ONLY


# --- ik's compute against llama.cpp's graph: what the engine suite measured (tests/data/
# ik_compute_figures.json, tests/engine/test_ik_compute.py), held by tests/test_memory_ik_compute.py ---
# architecture -> (margin MiB: the largest amount by which a compute buffer ik logged exceeded
# moeconf's figure for it without the margin, rounded up; device figures measured), at -ub up to
# ikmla.MARGIN_UBATCH (the margin grows in proportion above it: the differences measured grow with
# the ubatch). An architecture not listed: compute refused (`compute_not_measured`)
COMPUTE_MARGINS: Final[dict[str, tuple[int, int]]] = {
    "qwen3moe": (16, 11), "glm4moe": (8, 11), "gpt-oss": (0, 11), "llama4": (0, 11), "qwen35moe": (5, 11),
    "qwen3next": (0, 11), "minimax-m2": (24, 11), "grok": (0, 8), "ernie4_5-moe": (0, 11), "hunyuan-moe": (1, 11),
    "bailingmoe2": (4, 11), "dots1": (0, 11), "qwen3vlmoe": (16, 11), "llama": (2, 11),
    "arctic": (46, 11), "granitemoe": (0, 11), "mistral3": (40, 11), "qwen2moe": (0, 11), "mimo2": (32, 11),
    # step35: measured on the cut with SwiGLU limits on its first dense block and last two MoE blocks (not the
    # model's own values, which moeconf has no source for: tests/engine/ik_newer_cases.py IK_KEYS); ik's buffers
    # were at or below llama.cpp's graph on every figure (by 0.02 to 320 MiB)
    "step35": (0, 11),
}
# architectures whose ik compute buffers, measured over RPC like the others', exceeded llama.cpp's graph by far more
# than a margin (over 64 MiB): compute refused, saying how ik's graph differs. Weights and KV are modelled
COMPUTE_DIFFERS: Final[dict[str, str]] = {
    "gemma4": ("in its global-attention layers (K shared as V, no attn_v) ik's build_gemma4 builds attention through "
               "llm_build_kv, whose buffer held the f32 KQ matrix (n_head x n_kv x n_ubatch x 4 bytes): 1,029.5 MiB "
               "logged against llama.cpp's graph's 527 at -c 32768 -ub 512 (+502), +2,009 at -ub 2048"),
    "mistral4": ("its graph there is build_deepseek2, whose MLA attention held 1,248 MiB at -c 32768 against "
                 "llama.cpp's graph's 304 (+944), growing with the context; and ik's MLA attention model "
                 "(memory/ikmla.py, measured on DeepSeek-V3 and GLM-5) missed Mistral-Small-4's buffer by more than "
                 "its 37 MiB margin at -ub 2048: 1,392 against 1,536 logged at -c 32768 (-144), 1,248 against 1,056 "
                 "at -c 4096 (+192); tests/data/ik_mla_mistral4.json"),
}
# architectures whose ik compute was also read on a real GPU (tests/data/ik_cuda_h200.json, checked
# by tests/test_ik_cuda_measured.py): the lines, and what the CUDA build logged against this estimate
GPU_CHECKED: Final[dict[str, str]] = {
    "qwen3moe": "1 line on an H200 (-ot exps=CPU -c 32768: CUDA0 305 MiB logged, this estimate 317)",
}
# ik's graph keeps a second f32 copy of the KQ matrix where flash attention is off: ik's compute buffer was
# llama.cpp's graph plus one n_head x n_kv x n_ubatch f32 tensor. Architecture -> what it was measured on
# (there only)
FA_OFF_MEASURED: Final[dict[str, str]] = {
    "grok": "Grok-1, whose flash attention ik forces off: -c 8192 to 32768, -ub 512 and 2048",
}
# architectures whose ik graph is build_deepseek2 (src/llama-build-context.cpp), measured: their compute is
# modelled from ik's MLA attention (memory/ikmla.py `attention_peak`, its margin measured over RPC on the
# cut layout named here, tests/data/ik_mla_figures.json), not from llama.cpp's graph
MLA_MODELLED: Final[dict[str, str]] = {"deepseek2": "DeepSeek-V3", "glm-dsa": "GLM-5"}
# the other architectures ik 0.1.5 builds with build_deepseek2 (src/llama-build-context.cpp), and what was measured:
# their compute refused (COMPUTE_DIFFERS), the next step the MLA one (`compute_next_step`: -amb caps that buffer)
IK_MLA_GRAPH: Final[dict[str, str]] = {
    "mistral4": "Mistral-Small-4: ik's MLA attention model missed its buffers beyond the margin (COMPUTE_DIFFERS)",
}


# an MLA_MODELLED architecture's compute on a device running no attention layer (the host with every layer
# on the GPUs): llama.cpp's graph, at or above ik's logged buffer on every measured line
MLA_HOST_LABEL: Final = ("compute: estimated (llama.cpp's graph of the same placement: ik_llama.cpp's buffer was at "
                         "or below it on every line measured over RPC; not measured on a GPU)")


def mla_compute_label(n_tokens: int) -> str:
    """What an ik_llama.cpp compute figure of an MLA_MODELLED architecture is on a device running
    attention layers."""
    return (f"compute: estimated (ik_llama.cpp's MLA attention modelled from its graph, build_deepseek2; margin "
            f"{ikmla.margin_mib(n_tokens)} MiB, the largest error over {ikmla.MEASURED_BUFFERS} compute buffers "
            f"measured over RPC on cut {' and '.join(MLA_MODELLED.values())} layouts; not measured on a GPU)")


def compute_label(arch: str, n_ubatch: int = 512) -> str | None:
    """What an ik_llama.cpp compute figure is: llama.cpp's graph plus the measured margin (None:
    not measured for this architecture)."""
    if arch not in COMPUTE_MARGINS:
        return None
    lines = COMPUTE_MARGINS[arch][1]
    gpu = f"checked on a GPU: {GPU_CHECKED[arch]}" if arch in GPU_CHECKED else "not measured on a GPU"
    return (f"compute: estimated (ik_llama.cpp's graph differs; margin {margin_mib(arch, n_ubatch)} MiB, measured over "
            f"{lines} lines on RPC; {gpu})")


def margin_mib(arch: str, n_ubatch: int) -> int:
    return ikmla.margin_mib(n_ubatch, COMPUTE_MARGINS[arch][0])


def compute_not_measured(arch: str) -> str:
    if arch in COMPUTE_DIFFERS:
        return (f"compute on ik_llama.cpp is not modelled for {arch!r}: ik's graph differs from llama.cpp's ("
                f"{COMPUTE_DIFFERS[arch]}; tests/engine/test_ik_compute.py); weights and KV cache are modelled")
    return (f"compute on ik_llama.cpp is not modelled for {arch!r}: its compute buffers were not measured against "
            "llama.cpp's graph (tests/engine/test_ik_compute.py); weights and KV cache are modelled")


def compute_next_step(arch: str) -> str:
    """What a user can do where ik's compute is refused for a model whose weights and KV are modelled."""
    if arch in MLA_MODELLED or arch in IK_MLA_GRAPH:
        return ("next step: write the placement as explicit rules (`moeconf compile`) and check it with `moeconf "
                "explain` (weights and KV cache exact), leaving room on each GPU for ik's compute buffer (ik logs it "
                "at start: `compute buffer size`); ik's -amb caps its MLA attention's buffer")
    return ""


def next_step(inv: Inventory, llama_cpp_modelled: bool) -> str:
    """What a user can do where moeconf does not size this model's memory on ik_llama.cpp."""
    from moeconf.model.nametable import ARCHS

    if inv.arch not in ARCHS[ENGINE]:
        return (f"ik_llama.cpp 0.1.5 does not load the {inv.arch!r} architecture: run it on llama.cpp "
                "(--engine llama.cpp)")
    if inv.arch in IK_FAILS:
        return "next step: run it on llama.cpp (--engine llama.cpp)" + (
            ", where its memory is modelled" if llama_cpp_modelled else "")
    if llama_cpp_modelled:
        return ("next step: size it with llama.cpp's graph (--engine llama.cpp: the same placement's memory on "
                "llama.cpp), or write the placement as explicit rules (`moeconf compile`) and check it with "
                "`moeconf explain`, which shows where every tensor goes and the memory moeconf does model")
    return ("next step: write the placement as explicit rules (`moeconf compile`: placement is exact on "
            f"{inv.arch!r}) and check it with `moeconf explain`, which shows where every tensor goes and the "
            "weights as placed; memory for this model is modelled on neither engine")


# ik 0.1.5's gated delta-net layer maps (src/llama-hparams.cpp, load_hparams): the attention interval it
# takes whatever full_attention_interval says (None: it reads the key)
_IK_DELTA_NET: Final[dict[str, int | None]] = {"qwen3next": 4, "qwen35moe": None}
# the KV_ONLY architectures whose ik 0.1.5 loader does not read nextn_predict_layers (src/llama-hparams.cpp,
# load_hparams): a file's MTP blocks would be trunk layers there (their tensors loaded, a KV cache each, run in
# the graph), which moeconf does not model: such a file is refused on ik. Architecture -> where ik reads its keys
IK_NEXTN_UNREAD: Final[dict[str, str]] = {
    "qwen35moe": "load_hparams, LLM_ARCH_QWEN35MOE",
    "mimo2": "load_hparams, LLM_ARCH_MIMO2",
    "step35": "load_hparams, LLM_ARCH_STEP35",
}
# keys ik 0.1.5's loader requires of a KV_ONLY architecture where llama.cpp's does not (src/llama-hparams.cpp,
# load_hparams: get_key without `required = false`, or a GGML_ASSERT): a file without them fails to load on ik, so
# moeconf refuses it there. Architecture -> the keys, each a group of alternatives (ik takes either); the published
# conversions write the first of each (docs/memory.md, ik_llama.cpp)
IK_REQUIRED_KEYS: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    "mistral4": (("leading_dense_block_count",), ("expert_weights_scale",)),
    "mimo2": (("rope.freq_base_swa",),),
    "step35": (("swiglu_clamp_exp", "swiglu_limits"), ("swiglu_clamp_shexp", "swiglu_limits_shared"),
               ("rope.freq_base_swa", "rope.freq_base_per_layer")),
}


def unmodelled(inv: Inventory, no_memory_effect: Iterable[str], mainline: frozenset[str]) -> list[str]:
    """Why this model's weights and KV on ik_llama.cpp are not modelled (empty: they are): a key
    moeconf does not read for it on ik (those its llama.cpp model reads, `mainline`, unless ik reads
    others), or a layer map or state ik reads differently from the file's keys (see the module's notes)."""
    arch = inv.arch
    known = set(no_memory_effect) | _IK_KEYS.get(arch, mainline)
    keys = inv.metadata.arch_keys or ()
    # a key whose value builds nothing (keys.neutral: Gemma 4's shared KV layers and per-layer inputs at 0) passes,
    # as on llama.cpp (support.unread_keys)
    why = [f"memory is not modelled for {arch}.{k} on ik_llama.cpp (a key moeconf does not read for {arch})"
           for k in keys if k not in known and not neutral(k, inv)]
    for group in IK_REQUIRED_KEYS.get(arch, ()):
        if not any(k in keys for k in group):
            why.append(f"memory is not modelled for this {arch} file on ik_llama.cpp: ik 0.1.5 requires "
                       f"{arch}.{' or '.join(group)} (src/llama-hparams.cpp), which the file lacks: it fails to load")
    if arch in IK_NEXTN_UNREAD and (int_key(inv, "nextn_predict_layers") or 0):
        why.append(f"memory is not modelled for {arch}.nextn_predict_layers on ik_llama.cpp (ik 0.1.5 does "
                   "not read it: its MTP blocks would be taken as trunk layers)")
    if arch in _IK_DELTA_NET:
        fixed = _IK_DELTA_NET[arch]
        if inv.metadata.hparam("attention.recurrent_layers") is not None:
            why.append(f"memory is not modelled for {arch}.attention.recurrent_layers on ik_llama.cpp (ik 0.1.5 "
                       "ignores the array and derives the recurrent layers from the attention interval)")
        interval = int_key(inv, "full_attention_interval")
        if fixed is not None and interval not in (None, fixed):
            why.append(f"memory is not modelled for {arch}.full_attention_interval = {interval} on ik_llama.cpp "
                       f"(ik 0.1.5 takes every {fixed}th layer as attention whatever the key)")
        rs = _recurrent.shape(inv)
        if rs is not None and rs.n_v_heads and rs.d_inner // rs.n_v_heads != rs.d_state:
            why.append(f"memory is not modelled for {arch} on ik_llama.cpp with a value head width "
                       f"({rs.d_inner // rs.n_v_heads}) other than ssm.state_size ({rs.d_state}): ik's recurrent "
                       "state is sized by the value heads, mainline's by the state size")
    return why
