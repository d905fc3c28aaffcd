"""Sparse full-size layouts of real MoE models of the architectures the engine's graph models
where no older replay did (memory/graph/model.py GRAPH_MODELLED), each from its published
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


__all__ = ["REAL", "replace", "write_real"]
