"""ik_llama.cpp 0.1.5 per architecture (issue 17): whose weights, KV cache and compute moeconf models there (compute:
llama.cpp's graph plus a margin measured on ik, or ik's MLA attention, memory/ikmla.py), and why and what next where it
does not. The facts and measurements: docs/memory.md, "ik_llama.cpp"; docs/memory-architectures.md, "ik_llama.cpp on
the newer architectures"."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import moeconf.memory.ikmla as ikmla
import moeconf.memory.recurrent as _recurrent
from moeconf.memory.indexer import DSA_KEYS
from moeconf.memory.keys import MLA_KEYS, int_key, neutral
from moeconf.model.inventory import Inventory

ENGINE: Final = "ik_llama.cpp"

# the architectures whose memory on ik is modelled in full as on llama.cpp (compute with the margins below)
MODELLED_IN_FULL: Final = frozenset({"qwen3moe", "glm4moe", "deepseek2", "gpt-oss", "llama4"})


# the architectures whose weights and KV cache on ik are modelled here, reading their llama.cpp keys or `_IK_KEYS`
KV_ONLY: Final = frozenset({"qwen35moe", "qwen3next", "glm-dsa", "minimax-m2", "grok", "ernie4_5-moe",
                            "bailingmoe2", "dots1", "qwen3vlmoe", "hunyuan-moe", "llama", "arctic",
                            "granitemoe", "mistral3", "qwen2moe", "gemma4", "mistral4", "mimo2", "step35"})
_IK_KEYS: Final[dict[str, frozenset[str]]] = {
    "qwen35moe": _recurrent.KEYS,
    "qwen3next": _recurrent.KEYS,
    "glm-dsa": MLA_KEYS | DSA_KEYS,
}


# MoE architectures in ik 0.1.5's tables whose MoE files it does not load (tests/engine/test_ik_newer.py): why
IK_FAILS: Final[dict[str, str]] = {
    "dbrx": ("ik 0.1.5 sizes dbrx's experts as feed_forward_length / expert_used_count (src/llama-load-tensors.cpp, "
             "create_std_ffn_exps), a quarter of the width DBRX files hold: the load fails (check_tensor_dims: "
             "'blk.0.ffn_up_exps.weight' has wrong shape)"),
    "minicpm": ("ik 0.1.5's minicpm tensor names (src/llama-model.cpp, LLM_TENSOR_NAMES) have only per-expert "
                "tensors (blk.N.ffn_gate.X), so create_llama_tensors cannot find merged ffn_*_exps and the load "
                "fails (require_tensor_meta: 'blk.0.ffn_gate.0.weight' not found)"),
    **{arch: (f"ik 0.1.5's {arch} tensor names (src/llama-model.cpp, LLM_TENSOR_NAMES) have no router or expert "
              "tensors: an MoE file of it fails to load (check_tensor_dims: '__missing__' not found)")
       for arch in ("granite", "refact")},
}


def why_not(arch: str, engine: str) -> str:
    """Why moeconf does not size `arch` on `engine` where ik cannot run it (empty otherwise)."""
    return f": {IK_FAILS[arch]}" if engine == ENGINE and arch in IK_FAILS else ""


def kv_only(arch: str, engine: str) -> bool:
    """Whether this architecture's weights and KV on `engine` are modelled by this module (the newer ones on ik)."""
    return engine == ENGINE and arch in KV_ONLY


# --- ik's compute as llama.cpp's graph plus a margin: architecture -> (MiB at -ub up to MARGIN_UBATCH, lines measured)
COMPUTE_MARGINS: Final[dict[str, tuple[int, int]]] = {
    "qwen3moe": (16, 11), "glm4moe": (8, 11), "gpt-oss": (0, 11), "llama4": (0, 11), "qwen35moe": (5, 11),
    "qwen3next": (0, 11), "minimax-m2": (24, 11), "grok": (0, 8), "ernie4_5-moe": (0, 11), "hunyuan-moe": (1, 11),
    "bailingmoe2": (4, 11), "dots1": (0, 11), "qwen3vlmoe": (16, 11), "llama": (2, 11),
    "arctic": (46, 11), "granitemoe": (0, 11), "mistral3": (40, 11), "qwen2moe": (0, 11), "mimo2": (32, 11),
    "step35": (0, 11),  # measured with SwiGLU limits on three blocks, not the model's own (docs/memory.md)
}
# architectures whose ik compute exceeded llama.cpp's graph by more than a margin may (64 MiB): compute refused, why
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
# architectures whose ik compute was also read on a GPU (tests/data/ik_cuda_h200.json): the lines and figures
GPU_CHECKED: Final[dict[str, str]] = {
    "qwen3moe": "1 line on an H200 (-ot exps=CPU -c 32768: CUDA0 305 MiB logged, this estimate 317)",
}
# where ik's second f32 KQ matrix with flash attention off was measured (docs/memory.md, "ik_llama.cpp"): on what
FA_OFF_MEASURED: Final[dict[str, str]] = {
    "grok": "Grok-1, whose flash attention ik forces off: -c 8192 to 32768, -ub 512 and 2048",
}
# architectures whose compute on ik is its MLA attention's (memory/ikmla.py), and the cut layout it was measured on
MLA_MODELLED: Final[dict[str, str]] = {"deepseek2": "DeepSeek-V3", "glm-dsa": "GLM-5"}
# the other architectures ik 0.1.5 builds with build_deepseek2, and what was measured (compute refused)
IK_MLA_GRAPH: Final[dict[str, str]] = {
    "mistral4": "Mistral-Small-4: ik's MLA attention model missed its buffers beyond the margin (COMPUTE_DIFFERS)",
}


# an MLA_MODELLED architecture's compute on a device running no attention layer: llama.cpp's graph
MLA_HOST_LABEL: Final = ("compute: estimated (llama.cpp's graph of the same placement: ik_llama.cpp's buffer was at "
                         "or below it on every line measured over RPC; not measured on a GPU)")


def mla_compute_label(n_tokens: int) -> str:
    """What an ik_llama.cpp compute figure of an MLA_MODELLED architecture is on a device running attention."""
    return (f"compute: estimated (ik_llama.cpp's MLA attention modelled from its graph, build_deepseek2; margin "
            f"{ikmla.margin_mib(n_tokens)} MiB, the largest error over {ikmla.MEASURED_BUFFERS} compute buffers "
            f"measured over RPC on cut {' and '.join(MLA_MODELLED.values())} layouts; not measured on a GPU)")


def compute_label(arch: str, n_ubatch: int = 512) -> str | None:
    """What an ik_llama.cpp compute figure is: llama.cpp's graph plus the measured margin (None: not measured)."""
    if arch not in COMPUTE_MARGINS:
        return None
    gpu = f"checked on a GPU: {GPU_CHECKED[arch]}" if arch in GPU_CHECKED else "not measured on a GPU"
    return (f"compute: estimated (ik_llama.cpp's graph differs; margin {margin_mib(arch, n_ubatch)} MiB, measured over "
            f"{COMPUTE_MARGINS[arch][1]} lines on RPC; {gpu})")


def margin_mib(arch: str, n_ubatch: int) -> int:
    return ikmla.margin_mib(n_ubatch, COMPUTE_MARGINS[arch][0])


def compute_not_measured(arch: str) -> str:
    why = (f"ik's graph differs from llama.cpp's ({COMPUTE_DIFFERS[arch]}; " if arch in COMPUTE_DIFFERS
           else "its compute buffers were not measured against llama.cpp's graph (")
    return (f"compute on ik_llama.cpp is not modelled for {arch!r}: {why}tests/engine/test_ik_compute.py); weights "
            "and KV cache are modelled")


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


# ik 0.1.5's gated delta-net layer maps: the attention interval it takes whatever the key says (None: it reads it)
_IK_DELTA_NET: Final[dict[str, int | None]] = {"qwen3next": 4, "qwen35moe": None}
# KV_ONLY architectures whose ik loader does not read nextn_predict_layers (refused): arch -> where ik reads keys
IK_NEXTN_UNREAD: Final[dict[str, str]] = {
    "qwen35moe": "load_hparams, LLM_ARCH_QWEN35MOE",
    "mimo2": "load_hparams, LLM_ARCH_MIMO2",
    "step35": "load_hparams, LLM_ARCH_STEP35",
}
# keys ik 0.1.5's loader requires where llama.cpp's does not: architecture -> groups of alternatives (either one)
IK_REQUIRED_KEYS: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    "step35": (("swiglu_clamp_exp", "swiglu_limits"), ("swiglu_clamp_shexp", "swiglu_limits_shared"),
               ("rope.freq_base_swa", "rope.freq_base_per_layer")),
}


def unmodelled(inv: Inventory, no_memory_effect: Iterable[str], mainline: frozenset[str]) -> list[str]:
    """Why this model's weights and KV on ik_llama.cpp are not modelled (empty: they are): a key moeconf does not
    read for it on ik (`mainline`: its llama.cpp model's), or a layer map or state ik reads differently."""
    arch = inv.arch
    known = set(no_memory_effect) | _IK_KEYS.get(arch, mainline)
    keys = inv.metadata.arch_keys or ()
    # a key whose value builds nothing (keys.neutral) passes, as on llama.cpp (support.unread_keys)
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
