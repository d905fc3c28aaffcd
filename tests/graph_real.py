"""Sparse full-size layouts of real MoE models of the architectures the engine's graph models
where no older replay did (those not in tests/test_memory_cpu_layers.py ARCHS), each from its published
config.json (hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head
dim, num_local_experts/num_experts, num_experts_per_tok, intermediate sizes, vocab_size), with the
tensors and keys the pinned llama.cpp's loader reads (moeconf/fixtures/graphmodels.py's builders).
All tensors F32 (the compute graph does not depend on the weights' types on RPC devices)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from moeconf.fixtures import graphmodels as gm
from moeconf.fixtures.writer import write_gguf

# key -> (architecture, Dims, shared expert width, source)
REAL: dict[str, tuple[str, gm.Dims, int, str]] = {
    # mistralai/Mixtral-8x7B-v0.1 config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads,
    # intermediate 14336, 8 experts, 2 per token, vocab 32000
    "mixtral-8x7b": ("llama", gm.Dims(blocks=32, hidden=4096, heads=32, heads_kv=8, head_dim=128, experts=8, used=2,
                                      ff=14336, vocab=32000), 0, "mistralai/Mixtral-8x7B-v0.1"),
    # Qwen/Qwen1.5-MoE-A2.7B: hidden 2048, 24 layers, 16 heads (16 KV), moe_intermediate 1408,
    # shared_expert_intermediate 5632, 60 experts, 4 per token, vocab 151936
    "qwen1.5-moe-a2.7b": ("qwen2moe", gm.Dims(blocks=24, hidden=2048, heads=16, heads_kv=16, head_dim=128, experts=60,
                                             used=4, ff=1408, vocab=151936), 5632, "Qwen/Qwen1.5-MoE-A2.7B"),
    # allenai/OLMoE-1B-7B-0924: hidden 2048, 16 layers, 16 heads, intermediate 1024, 64 experts,
    # 8 per token, vocab 50304
    "olmoe-1b-7b": ("olmoe", gm.Dims(blocks=16, hidden=2048, heads=16, heads_kv=16, head_dim=128, experts=64, used=8,
                                    ff=1024, vocab=50304), 0, "allenai/OLMoE-1B-7B-0924"),
    # ibm-granite/granite-3.1-3b-a800m-instruct: hidden 1536, 32 layers, 24 heads, 8 KV heads,
    # intermediate 512, 40 experts, 8 per token, vocab 49155
    "granite-3.1-3b-a800m": ("granitemoe", gm.Dims(blocks=32, hidden=1536, heads=24, heads_kv=8, head_dim=64,
                                                   experts=40, used=8, ff=512, vocab=49155), 0,
                             "ibm-granite/granite-3.1-3b-a800m-instruct"),
    # microsoft/Phi-3.5-MoE-instruct: hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate
    # 6400, 16 experts, 2 per token, vocab 32064
    "phi-3.5-moe": ("phimoe", gm.Dims(blocks=32, hidden=4096, heads=32, heads_kv=8, head_dim=128, experts=16, used=2,
                                     ff=6400, vocab=32064), 0, "microsoft/Phi-3.5-MoE-instruct"),
    # databricks/dbrx-base: d_model 6144, 40 layers, 48 heads, kv_n_heads 8, ffn_hidden 10752,
    # 16 experts, 4 per token, vocab 100352
    "dbrx": ("dbrx", gm.Dims(blocks=40, hidden=6144, heads=48, heads_kv=8, head_dim=128, experts=16, used=4,
                             ff=10752, vocab=100352), 0, "databricks/dbrx-base"),
    # Snowflake/snowflake-arctic-instruct: hidden 7168, 35 layers, 56 heads, 8 KV heads, intermediate 4864
    # (the experts'; the residual dense FFN is n_embd wide in the loader), 128 experts, 2 per token, vocab 32000
    "snowflake-arctic": ("arctic", gm.Dims(blocks=35, hidden=7168, heads=56, heads_kv=8, head_dim=128, experts=128,
                                           used=2, ff=4864, vocab=32000), 0, "Snowflake/snowflake-arctic-instruct"),
}


def write_real(key: str, path: Path) -> Path:
    arch, d, shexp, _ = REAL[key]
    import gguf

    kinds = {"str": gguf.GGUFValueType.STRING, "u32": gguf.GGUFValueType.UINT32,
             "f32": gguf.GGUFValueType.FLOAT32, "bool": gguf.GGUFValueType.BOOL}
    kv, tensors = gm.OWN[arch](d)
    if arch == "qwen2moe":  # the real shared expert width
        kv = [(k, shexp if k.endswith("expert_shared_feed_forward_length") else v, t) for k, v, t in kv]
        tensors = [(n, ty, _shexp_shape(n, sh, shexp)) for n, ty, sh in tensors]
    if arch == "granitemoe" and not shexp:  # Granite 3.1 MoE has no shared expert
        kv = [x for x in kv if not x[0].endswith("expert_shared_feed_forward_length")]
        tensors = [x for x in tensors if "_shexp" not in x[0]]
    kv = [(k, 32768 if k.endswith(".context_length") else v, t) for k, v, t in kv]
    kvs: list[tuple[str, Any, Any]] = [(k, v, kinds[t]) for k, v, t in kv]
    kvs.append(("general.file_type", 0, gguf.GGUFValueType.UINT32))
    return write_gguf(path, arch, kvs, tensors, data="sparse", vocab=d.vocab)[0]


def _shexp_shape(name: str, shape: tuple[int, ...], width: int) -> tuple[int, ...]:
    if "_shexp" not in name or "gate_inp" in name:
        return shape
    return (shape[0], width) if "down" not in name else (width, shape[1])


# architectures beyond moeconf/fixtures/graphmodels.py: (arch, dims, shared experts, leading dense blocks and their
# width, fused QKV, extra keys) -- DeepSeek-MoE (v1) and Ling (v1, bailingmoe) per their loaders
# (src/models/deepseek.cpp, bailingmoe.cpp: shared experts of n_expert_shared x the expert width)
EXTRA: dict[str, tuple[str, gm.Dims, int, int, int, bool, list[tuple[str, Any, str]], str]] = {
    # deepseek-ai/deepseek-moe-16b-base: hidden 2048, 28 layers, 16 heads, intermediate 10944 (layer 0),
    # moe_intermediate 1408, 64 routed experts, 6 per token, 2 shared, first_k_dense_replace 1, vocab 102400
    "deepseek-moe-16b": ("deepseek", gm.Dims(blocks=28, hidden=2048, heads=16, heads_kv=16, head_dim=128, experts=64,
                                            used=6, ff=1408, vocab=102400), 2, 1, 10944, False, [],
                         "deepseek-ai/deepseek-moe-16b-base"),
    # inclusionAI/Ling-lite: hidden 2048, 28 layers, 16 heads, 4 KV heads, moe_intermediate 1408, 64 experts,
    # 6 per token, 2 shared, no dense layer, norm_topk_prob, vocab 126464
    "ling-lite": ("bailingmoe", gm.Dims(blocks=28, hidden=2048, heads=16, heads_kv=4, head_dim=128, experts=64, used=6,
                                       ff=1408, vocab=126464), 2, 0, 0, True, [("expert_weights_norm", True, "bool")],
                  "inclusionAI/Ling-lite"),
}


KeyValues = list[tuple[str, Any, str]]
Tensors = list[tuple[str, str, tuple[int, ...]]]


def _extra(arch: str, d: gm.Dims, shared: int, lead: int, dense: int, fused: bool,
           keys: KeyValues) -> tuple[KeyValues, Tensors]:
    kv = [*gm._common(arch, d, dense or 4 * d.ff), (f"{arch}.expert_feed_forward_length", d.ff, "u32"),
          (f"{arch}.expert_shared_count", shared, "u32"), (f"{arch}.leading_dense_block_count", lead, "u32"),
          (f"{arch}.rope.dimension_count", d.head_dim, "u32"),
          *((f"{arch}.{k}", v, t) for k, v, t in keys)]
    tensors = gm._classic(arch, d, fused_qkv=fused, shexp=shared * d.ff)
    out = []
    for name, ty, shape in tensors:
        il = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if 0 <= il < lead and ("exps" in name or "gate_inp" in name or "shexp" in name):
            if name.endswith("ffn_gate_inp.weight"):
                h = d.hidden
                p = f"blk.{il}."
                out += [(p + "ffn_gate.weight", "F32", (h, dense)), (p + "ffn_down.weight", "F32", (dense, h)),
                        (p + "ffn_up.weight", "F32", (h, dense))]
            continue
        out.append((name, ty, shape))
    return kv, out


def write_extra_real(key: str, path: Path) -> Path:
    import gguf

    arch, d, shared, lead, dense, fused, keys, _ = EXTRA[key]
    kv, tensors = _extra(arch, d, shared, lead, dense, fused, keys)
    kv = [(k, 32768 if k.endswith(".context_length") else v, t) for k, v, t in kv]
    return _write(arch, kv, tensors, d.vocab, path, gguf, data="sparse")


def _write(arch: str, kv: list[tuple[str, Any, str]], tensors: list[tuple[str, str, tuple[int, ...]]], vocab: int,
           path: Path, gguf: Any, data: str = "zeros") -> Path:
    kinds = {"str": gguf.GGUFValueType.STRING, "u32": gguf.GGUFValueType.UINT32,
             "f32": gguf.GGUFValueType.FLOAT32, "bool": gguf.GGUFValueType.BOOL}
    kvs: list[tuple[str, Any, Any]] = [(k, v, kinds[t]) for k, v, t in kv]
    kvs.append(("general.file_type", 0, gguf.GGUFValueType.UINT32))
    return write_gguf(path, arch, kvs, tensors, data=data, vocab=vocab)[0]  # type: ignore[arg-type]


__all__ = ["EXTRA", "REAL", "replace", "write_extra_real", "write_real"]
