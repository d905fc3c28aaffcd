"""The cut layouts and command lines on which ik_llama.cpp 0.1.5 is checked for the newer
architectures (moeconf/memory/ikarchs.py): shared by the engine test that measures them
(tests/engine/test_ik_newer.py) and the default-suite test that holds moeconf to the recorded
figures (tests/test_memory_ik_newer.py, tests/data/ik_newer_figures.json).

ik has no allocation-free projection, and a real load reads the whole sparse file through mmap
(its pages become resident), so each layout keeps its real layer shapes with fewer blocks and
experts (the largest cuts, GLM-5 and Grok-1, map 2.7 GiB). Cuts of the hybrids keep whole
groups of four layers (three recurrent, one attention); GLM-5 and Ling keep their dense lead and
their MTP block."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from moeconf.fixtures.layouts import LAYOUTS, ModelLayout
from moeconf.model import ggml
from moeconf.model.inventory import Inventory

# layout -> its cut (blocks, nextn block included; experts)
CUTS: dict[str, dict[str, int]] = {
    "qwen3.5-35b-a3b": {"blocks": 8, "experts": 16},
    "qwen3-next-80b-a3b": {"blocks": 8, "experts": 16},
    "glm-5": {"blocks": 5, "experts": 8},  # 3 dense + 1 MoE + the MTP block
    "minimax-m2": {"blocks": 4, "experts": 16},
    "grok-1": {"blocks": 2, "experts": 2},
    "ernie-4.5-21b-a3b": {"blocks": 4, "experts": 16},
    "hunyuan-a13b": {"blocks": 4, "experts": 16},
    "ling-mini-2.0": {"blocks": 4, "experts": 16},  # 1 dense + 2 MoE + the MTP block
    "dots.llm1": {"blocks": 4, "experts": 16},
    "qwen3-vl-30b-a3b": {"blocks": 8, "experts": 16},
    "mixtral-8x7b": {"blocks": 4, "experts": 2},
    "snowflake-arctic": {"blocks": 4, "experts": 2},
    "granite-3.1-3b-a800m": {"blocks": 4, "experts": 8},
    "mistral3-synthetic-moe": {"blocks": 3, "experts": 2},
    "qwen1.5-moe-a2.7b": {"blocks": 4, "experts": 8},  # filled (FILLED)
    "gemma-4-26b-a4b": {"blocks": 6, "experts": 8},  # five sliding-window blocks and one global; filled
    "mistral-small-4": {"blocks": 4, "experts": 8},  # MLA (mainline attn_k_b/attn_v_b), every block MoE
    # the dense block, four sliding and one full; no MTP block (ik 0.1.5 does not read mimo2.nextn_predict_layers:
    # nor creates its nextn.* tensors: a file with one does not load on ik, refused: model/required.py ik_load_refusals)
    "mimo-v2-flash": {"blocks": 6, "experts": 8, "nextn": 0},
    "step-3.5-flash": {"blocks": 5, "experts": 16},  # 3 dense + 2 MoE; full, 3 sliding, full; keys: IK_KEYS
}
# a layout's parts as the published files have them where ik's loader requires that form: Gemma 4's
# experts with gate and up fused (ik 0.1.5 reads only ffn_gate_up_exps; llama.cpp reads either)
PARTS: dict[str, tuple[str, ...]] = {"gemma-4-26b-a4b": ("gate_up",)}
# keys the published files have beyond the layout, which ik 0.1.5's loader requires (ikarchs.IK_REQUIRED_KEYS):
# Step-3.5-Flash's per-layer SwiGLU limits (llama.cpp's converter, conversion/step3.py, writes swiglu_clamp_exp and
# swiglu_clamp_shexp from the config's swiglu_limits lists, padded to the blocks) and its sliding layers' RoPE base
# (rope.freq_base_swa, from the config's per-layer rope_theta list: 10000 on sliding layers). The limits' values are
# tests/step35_variant.py's (a limit on the last two blocks' routed and shared experts and on the first dense block),
# NOT the model's own, for which moeconf has no source: weights and KV do not depend on them, compute does (which
# layers clamp), so compute is not measured on them
IK_KEYS: dict[str, tuple[tuple[str, str, object], ...]] = {
    "step-3.5-flash": (("swiglu_clamp_exp", "u32[]", [0.0, 0.0, 0.0, 7.0, 7.0]),
                       ("swiglu_clamp_shexp", "u32[]", [16.0, 0.0, 0.0, 16.0, 16.0]),
                       ("rope.freq_base_swa", "f32", 10000.0)),
}
# measured for weights and KV only (no placement lines): -mla 0 on a mainline DeepSeek conversion
KV_ONLY_CUTS: dict[str, dict[str, int]] = {"deepseek-v3": {"blocks": 4, "experts": 8}}

# weights and KV: each with -ngl 999 -ot exps=CPU and one RPC server as the GPU, except the
# lines marked "host", run with no RPC server (every tensor and all compute in host memory)
KV_LINES: list[str] = [
    "-c 4096",
    "-c 8192 -ctk q8_0 -ctv q8_0",  # Grok: ik forces flash attention off, then refuses a quantized V
    "-c 5000 -fa off -np 3",  # ik pads to 32 cells without flash attention; one cache for all sequences
    "host -c 4096 -ngl 0",
]
EXTRA_KV_LINES: dict[str, list[str]] = {
    # -mla 0: ik restores full heads (K and V of n_head heads) and still computes wkv_b
    "glm-5": ["-c 8192 -mla 1 -fa off", "-c 8192 -mla 2 -fa off -ctk q8_0 -ctv f16", "-c 4096 -mla 0",
              "-c 4096 -mla 0 -ctk q8_0 -fa on"],
    "deepseek-v3": ["-c 4096 -mla 0", "-c 4096 -mla 0 -ctk q8_0 -fa on"],
    "mistral-small-4": ["-c 8192 -mla 1 -fa off", "-c 8192 -mla 2 -fa off -ctk q8_0 -ctv f16", "-c 4096 -mla 0",
                        "-c 4096 -mla 0 -ctk q8_0 -fa on"],
    "qwen3.5-35b-a3b": ["-c 16384 -np 4 -ctk q8_0 -ctv f16"],
    "qwen3-next-80b-a3b": ["-c 16384 -np 4 -ctk q8_0 -ctv f16"],
}

# placement: one RPC server unless "2rpc"; `{half}` is half the blocks (a partial -ngl)
PLACEMENT_LINES: list[str] = [
    "-ngl 999 -ot exps=CPU",
    "-ngl 999 --n-cpu-moe 2",
    "-ngl {half}",
    "2rpc -ngl 999 --n-cpu-moe 1",
]


def cut_layout(name: str) -> ModelLayout:
    cut = {**CUTS, **KV_ONLY_CUTS}[name]
    layout = LAYOUTS[name]
    nextn = cut.get("nextn", layout.nextn)
    # the per-block patterns (sliding window, heads) of the first blocks, and the MTP block's last
    per_block: dict[str, tuple[object, ...]] = {}
    for field in ("swa", "heads_per_block"):
        pattern = getattr(layout, field, ())
        if pattern:
            keep = cut["blocks"] - nextn
            per_block[field] = (*pattern[:keep], *pattern[len(pattern) - nextn:])
    if name in PARTS:
        per_block["extra"] = (*layout.extra, ("parts", PARTS[name]))
    if name in IK_KEYS:
        per_block["extra"] = (*layout.extra, ("keys", IK_KEYS[name]))
    return dataclasses.replace(layout, key=f"{name}-cut", **cut, **per_block)


# cuts whose blocks ik cannot run all-zero: ik 0.1.5's CPU flash attention aborts on the first token
# (iqk_fa_templates.h, GGML_ASSERT(S > 0)) on an all-zero Qwen1.5-MoE, Gemma 4 or Step-3.5 (Step-3.5 with flash
# attention off: a non-finite row sum, ggml.c), after every buffer is allocated. Their blocks' tensors other than
# the routed experts get non-zero values (`fill_blocks`); the sizes are unchanged
FILLED: frozenset[str] = frozenset({"qwen1.5-moe-a2.7b", "gemma-4-26b-a4b", "step-3.5-flash"})


def fill_blocks(path: Path) -> None:
    """Give every block tensor but the routed experts, and every f32 tensor (norms, Gemma 4's
    rope_freqs), non-zero data in place: f32 ones, and every byte 0x11 in the others (small
    finite scales and quants in every ggml block type used)."""
    import struct

    from moeconf.model.gguf_header import read_header

    header = read_header(path)
    with path.open("r+b") as f:
        for t in header.tensors:
            if "_exps." in t.name or not (t.name.startswith("blk.") or t.type_name == "F32"):
                continue
            n = nbytes_of(t.type_name, t.shape)
            f.seek(header.data_offset + t.offset)
            f.write(struct.pack("<f", 1.0) * (n // 4) if t.type_name == "F32" else b"\x11" * n)


def kv_cases() -> list[tuple[str, str]]:
    return ([(m, line) for m in CUTS for line in [*KV_LINES, *EXTRA_KV_LINES.get(m, [])]]
            + [(m, line) for m in KV_ONLY_CUTS for line in EXTRA_KV_LINES[m]])


def engine_args(line: str, endpoint: str | None) -> list[str]:
    """The engine arguments of a KV line (`endpoint`: the RPC server of non-host lines)."""
    words = line.split()
    if words[0] == "host":
        return words[1:]
    assert endpoint is not None
    return ["--rpc", endpoint, "-dev", f"RPC0[{endpoint}]", "-ngl", "999", "-ot", "exps=CPU", *words]


def mmap_span(inv: Inventory, loaded: set[str]) -> int:
    """The bytes ik's host buffer reports when every loaded tensor is in it and the file is
    mmap'ed: the file range from the first to the last loaded tensor (llama_model_loader
    get_mapping_range), which includes the tensors it skips that lie between (a GLM or Ling MTP
    block's). Tensors follow each other in file order, each aligned to the file's 32 bytes."""
    offs = 0
    first = last = None
    for t in inv.tensors:
        if t.name in loaded:
            first = offs if first is None else first
            last = offs + t.nbytes
        offs += (t.nbytes + 31) // 32 * 32
    return 0 if first is None or last is None else last - first


def skipped_in_span(inv: Inventory, unused: set[str]) -> int:
    """What ik's mmap'ed host buffer holds beyond the tensors it loads (see `mmap_span`)."""
    loaded = {t.name for t in inv.tensors if t.name not in unused}
    return mmap_span(inv, loaded) - sum((t.nbytes + 31) // 32 * 32 for t in inv.tensors if t.name in loaded)


def nbytes_of(type_name: str, shape: tuple[int, ...]) -> int:
    return ggml.nbytes(ggml.type_ids()[type_name.upper()], shape) or 0


def cut_path(folder: Path, name: str) -> Path:
    return folder / f"{name}-cut.gguf"
