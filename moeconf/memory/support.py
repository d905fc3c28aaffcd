"""What the memory model covers, as data: per architecture, the GGUF keys whose memory effect it
models, the engines it was checked against, and the cases it refuses.

Memory is only ever printed as a number when the model's architecture is in `MODELLED` and every
`{arch}.*` key of the file that the engine's loader reads for that architecture (the generated
moeconf/engines/archkeys.py) is one it models (`keys`) or one it models for every architecture
(keys.NO_MEMORY_EFFECT). A key the loader does not read changes nothing and is passed over.
Anything else makes the estimate incomplete with a note naming the architecture or the key
(`unmodelled`): `explain` prints the note, `fit` and fill rules refuse. A clear "not modelled for
X" beats a confident wrong number: a new architecture's recurrent state, indexer cache or tied
output would otherwise be silently left out.

Adding an architecture: model what its memory classes allocate (`llama-memory-*.cpp`, its
`src/models/<arch>.cpp` graph), check it against `llama-fit-params -fitp on` on a sparse
full-size layout of a real model (tests/engine/test_memory_oracle.py), then give its composition a
`MEMORY` (memory/graph/archs) with the keys its loader reads that the model handles: that makes it
modelled. The architectures listed here are those an older replay modelled (`MEMORY = REPLAYED`):
their keys and engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import moeconf.memory.ikarchs as _ikarchs
import moeconf.memory.indexer as _indexer
import moeconf.memory.recurrent as _recurrent
from moeconf.engines.archkeys import FIELDS
from moeconf.memory.archgraph import unmodelled_structure
from moeconf.memory.graph.archs import Lazy
from moeconf.memory.graph.archs.common import CHECKED
from moeconf.memory.graph.model import GRAPH_COMPUTE as _GRAPH_COMPUTE
from moeconf.memory.graph.model import GRAPH_MODELLED as _GRAPH_MODELLED
from moeconf.memory.keys import MLA_KEYS, NO_MEMORY_EFFECT, SOFTCAPPING, neutral, read_by_loader
from moeconf.model.inventory import Inventory

_SWA: Final = frozenset({"attention.sliding_window", "attention.sliding_window_pattern"})

# gated delta-net hybrids (moeconf/memory/recurrent.py)
_RECURRENT: Final = _recurrent.KEYS
_SSM: Final = frozenset(k for k in _RECURRENT if k.startswith("ssm."))  # Mamba-2 reads the sizes only
_MAINLINE: Final = frozenset({"llama.cpp"})
_BOTH: Final = frozenset({"llama.cpp", "ik_llama.cpp"})
_GLM5_NEXT = frozenset({"attention.indexer.kpool", "attention.indexer.kpool_select_tail", "hyper_connection.count",
                        "hyper_connection.epsilon", "hyper_connection.sinkhorn_iterations", "kda.gate_lower_bound"})
_CLAMPS: Final = frozenset({"swiglu_clamp_exp", "swiglu_clamp_shexp"})  # memory/keys.py (not scalars)


@dataclass(frozen=True)
class ArchMemory:
    """An architecture whose memory is modelled: the keys (beyond `NO_MEMORY_EFFECT`) it reads,
    the engines it is modelled for, and what it was checked against."""

    keys: frozenset[str]
    engines: frozenset[str]
    checked: str


# group-limited routing (the converters write n_group / topk_group of DeepSeek-V3, Kimi-K2.5, GLM-4.x):
# llama.cpp builds the group selection only when expert_group_count > 1 (src/llama-graph.cpp
# build_moe_ffn), a few small ops on the router's probabilities; ik_llama.cpp groups only
# bailingmoe2 (src/llama-build-context.cpp). Checked: DeepSeek-V3 with 8 groups (4 used), Kimi-K2.5
# and GLM-4.5-Air with 1, weights and KV exact, compute within 16 MiB (tests/test_memory_flagship.py).
_GROUPS: Final = frozenset({"expert_group_count", "expert_group_used_count"})

_LISTED: Final[dict[str, ArchMemory]] = {
    "qwen3moe": ArchMemory(frozenset(), _BOTH, CHECKED + " (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B)"),
    "glm4moe": ArchMemory(frozenset({"leading_dense_block_count", "nextn_predict_layers"}) | _GROUPS, _BOTH,
                          CHECKED + " (GLM-4.5-Air, GLM-4.5, GLM-4.7)"),
    "deepseek2": ArchMemory(MLA_KEYS | {"leading_dense_block_count"} | _GROUPS, _BOTH,
                            CHECKED + " (DeepSeek-V3, Kimi-K2, Kimi-K2.5)"),
    "gpt-oss": ArchMemory(_SWA, _BOTH, CHECKED + " (gpt-oss-20b, gpt-oss-120b)"),
    "llama4": ArchMemory(_SWA | {"interleave_moe_layer_step"}, _BOTH, CHECKED + " (Llama-4-Maverick)"),
    # the pinned converter keeps Qwen3.5's MTP block (nextn_predict_layers 1, one more block): the loader
    # creates its tensors TENSOR_SKIP unless MTP is asked for (src/models/qwen35moe.cpp load_block_mtp)
    # and the trunk's memory leaves the nextn layer out: no memory effect (checked on Qwen3.5-35B-A3B
    # with the block, tests/test_memory_flagship.py); speculative decoding is not modelled anyway. Compute by
    # the engine's graph (memory/graph/archs/qwen35moe.py, qwen3next.py), which builds the trunk's layers only
    "qwen35moe": ArchMemory(_RECURRENT | {"nextn_predict_layers"}, _MAINLINE,
                            CHECKED + " (Qwen3.5-397B-A17B, Qwen3.5-122B-A10B, Qwen3.5-35B-A3B)"),
    # Qwen3-Next's MTP block likewise (measured: the same figures with and without it, tests/test_memory_keys.py)
    "qwen3next": ArchMemory(_RECURRENT - {"rope.dimension_sections"} | {"nextn_predict_layers"}, _MAINLINE,
                            CHECKED + " (Qwen3-Next-80B-A3B)"),
    # Nemotron-3: Mamba-2 state, attention KV, compute by the engine's graph (memory/graph/archs/nemotron_h_moe.py,
    # the latent experts' projections read from the tensors moe_latent_size shapes; llama.cpp only);
    # its MTP block (Nemotron-3 Super) is skipped by the loader and attended by no trunk layer
    # (measured: the same figures with and without it, tests/test_memory_keys.py)
    "nemotron_h_moe": ArchMemory(_SSM | {"moe_latent_size", "nextn_predict_layers"}, _MAINLINE,
                                 CHECKED + " (Nemotron-3-Nano-30B-A3B, Nemotron-3-Super-120B-A12B)"),
    # Kimi-Linear: KDA state (memory/recurrent.py), MLA latent, compute the engine's graph
    # (memory/graph/archs/kimi_linear.py)
    "kimi-linear": ArchMemory(_recurrent.KDA_KEYS | MLA_KEYS - {"attention.q_lora_rank"}
                              | {"leading_dense_block_count"}, _MAINLINE, CHECKED + " (Kimi-Linear-48B-A3B)"),
    # checked on llama.cpp only (ik_llama.cpp's graphs for them not compared)
    "minimax-m2": ArchMemory(frozenset(), _MAINLINE, CHECKED + " (MiniMax-M2)"),
    # Grok's attention and router softcapping run whatever their values (src/llama-graph.cpp builds
    # Grok's tanh unconditionally); final_logit_softcapping adds a scale, a tanh and a scale on the
    # logits (src/models/grok.cpp), each the only consumer of its input, which ggml-alloc runs in
    # place: no buffer grows (measured with Grok-2's 50: the same figures, tests/test_memory_keys.py)
    "grok": ArchMemory(SOFTCAPPING, _MAINLINE, CHECKED + " (Grok-1; flash attention forced off)"),
    # --- GLM-5.3-Flash: KDA state (memory/recurrent.py), MLA latent + k-pool indexer cache
    # (memory/indexer.py), compute by the engine's graph (memory/graph/archs/glm5_next.py): the k-pool,
    # the mHC streams and the KDA decay gate's bound composed
    # its experts' clamp is the fused clamped SwiGLU, one op as wide as the SwiGLU (checked with the key)
    "glm5-next": ArchMemory(_recurrent.KDA_KEYS | MLA_KEYS | _indexer.DSA_KEYS | _GLM5_NEXT | _CLAMPS, _MAINLINE,
                            CHECKED + " (GLM-5.3-Flash)"),
    # ---
    # DSA: the MLA latent and the lightning indexer's K cache (memory/indexer.py), compute by the engine's
    # graph (memory/graph/archs/_dsa.py)
    "deepseek32": ArchMemory(MLA_KEYS | _indexer.DSA_KEYS, _MAINLINE, CHECKED + " (DeepSeek-V3.2)"),
    # GLM-5.2's per-layer indexer table: the indexer K cache on its full layers only, the shared layers
    # reading the last full layer's top-k (memory/indexer.py full_indexers, graph/archs/_dsa.py)
    "glm-dsa": ArchMemory(MLA_KEYS | _indexer.DSA_KEYS | {"attention.indexer.types"}, _MAINLINE,
                          CHECKED + " (GLM-5; GLM-5.2's indexer table)"),
    # --- the classic MoEs checked within tolerance (memory/classic.py)
    "ernie4_5-moe": ArchMemory(frozenset({"leading_dense_block_count", "interleave_moe_layer_step"}), _MAINLINE,
                               CHECKED + " (ERNIE-4.5-21B-A3B)"),
    "bailingmoe2": ArchMemory(frozenset({"leading_dense_block_count", "nextn_predict_layers"}) | _GROUPS, _MAINLINE,
                              CHECKED + " (Ling-mini-2.0)"),
    "dots1": ArchMemory(frozenset({"leading_dense_block_count"}), _MAINLINE, CHECKED + " (dots.llm1)"),
    "qwen3vlmoe": ArchMemory(frozenset({"n_deepstack_layers", "rope.dimension_sections"}), _MAINLINE,
                             CHECKED + " (Qwen3-VL-30B-A3B)"),
    "hunyuan-moe": ArchMemory(frozenset(), _MAINLINE, CHECKED + " (Hunyuan-A13B)"),
}


def _modelled(arch: str) -> ArchMemory:
    """`arch`'s entry: the architectures whose compute the engine's graph gives (memory/graph/model.py
    GRAPH_COMPUTE: asking imports the architecture's composition only), their keys and what they were
    checked on their compositions' (GRAPH_MODELLED) or, where a composition replaced an older replay
    (`MEMORY = REPLAYED`), the replay's listed above."""
    graph = _GRAPH_MODELLED.get(arch)
    if graph is not None:
        return ArchMemory(graph[0], _MAINLINE, graph[1])
    if arch not in _GRAPH_COMPUTE:
        raise KeyError(arch)
    return _LISTED[arch]


# every modelled architecture (asked one by one, as the memory model does, no more of the graph's
# compositions are imported than are asked for)
MODELLED: Final[Lazy[ArchMemory]] = Lazy(_modelled, lambda: list(_GRAPH_COMPUTE))


_ROUTED_KINDS: Final = frozenset({"FFN_GATE_EXPS", "FFN_UP_EXPS", "FFN_DOWN_EXPS", "FFN_GATE_UP_EXPS"})


def lacking_tensor_kinds(arch: str) -> tuple[str, ...]:
    """The GGUF names of the tensor kinds llama.cpp's loader creates for `arch` that no modelled
    architecture has (moeconf.model.nametable): the blocks whose nodes moeconf does not build yet. Empty
    where every kind is modelled elsewhere and only the composition of the graph is missing."""
    from moeconf.model import nametable

    covered = {k for a in MODELLED for k in nametable.ML_ARCH_TENSORS.get(a, ())}
    names = {kind: base for base, kinds in {**nametable.BLOCK_TENSORS, **nametable.GLOBAL_TENSORS}.items()
             for kind in kinds}
    return tuple(sorted(names.get(k, k.lower()) for k in set(nametable.ML_ARCH_TENSORS.get(arch, ())) - covered))


def routed_expert_archs() -> tuple[str, ...]:
    """Every architecture whose llama.cpp loader creates routed-expert tensors (moeconf.model.nametable)."""
    from moeconf.model import nametable

    return tuple(sorted(a for a, kinds in nametable.ML_ARCH_TENSORS.items() if _ROUTED_KINDS & set(kinds)))


# Architectures with routed experts in llama.cpp's tensor table whose memory moeconf does not model because
# llama-server does not serve them as a text model (memory is llama-server's): why, for `unmodelled_architecture`
# and docs/memory-architectures.md (scripts/gen-arch-table.py)
NOT_SERVED: Final[dict[str, str]] = {
    "llada-moe": "diffusion model (llama.cpp's llm_arch_is_diffusion): llama-diffusion-cli, not llama-server",
    "rnd1": "diffusion model (llama.cpp's llm_arch_is_diffusion): llama-diffusion-cli, not llama-server",
    "nomic-bert-moe": "embedding model (no causal decoding)",
    "llama-embed": "embedding model (no causal decoding)",
    "deepseek2-ocr": "OCR model: its text decoder runs behind a vision encoder",
    "dflash": "speculative-decoding drafter, loaded beside a target model",
}
# ... and those whose pinned loader never creates the routed experts the table names (their files are dense; the
# engine refuses one with experts: tests/engine/test_placement_homes.py)
NO_ROUTED_EXPERTS: Final[dict[str, str]] = {
    "ernie4_5": ("its loader (src/models/ernie4-5.cpp) creates routed experts only for ernie4_5-moe; the engine "
                 "refuses an ernie4_5 file with experts (`blk.1.ffn_gate.weight` not found: ERNIE-4.5-21B-A3B's "
                 "layout written as ernie4_5)"),
    "lfm2": ("its loader (src/models/lfm2.cpp) sets the leading dense blocks to the block count: every block is "
             "dense; routed experts are lfm2moe's"),
    "paddleocr": ("OCR model (PaddleOCR-VL, whose text decoder ERNIE-4.5-0.3B is dense); its loader is ernie4_5's "
                  "(src/models/models.h), which creates routed experts only for ernie4_5-moe: the engine refuses a "
                  "paddleocr file with experts (`blk.1.ffn_gate.weight` not found: ERNIE-4.5-21B-A3B's layout "
                  "written as paddleocr)"),
}


def unmodelled_architecture(arch: str, engine: str = "llama.cpp") -> str:
    """Why an architecture's memory is not modelled, naming what it lacks and what to do instead."""
    lacking = lacking_tensor_kinds(arch)
    if arch in NOT_SERVED:
        what = (f"llama-server does not serve it as a text model ({NOT_SERVED[arch]}), and moeconf models the memory "
                "of MoE text models as llama-server runs them")
    elif arch in NO_ROUTED_EXPERTS:
        what = "a dense architecture: " + NO_ROUTED_EXPERTS[arch] + "; moeconf models the memory of MoE models"
    else:
        what = (f"its graph has blocks moeconf does not build yet (tensors no modelled architecture has: "
                f"{', '.join(lacking)})" if lacking else
                "moeconf has no composition of its graph yet (every kind of tensor it has is modelled for another "
                "architecture)")
    measure = ("run llama.cpp's `llama-fit-params -fitp on` with the same flags" if engine == "llama.cpp" else
               f"load it in {engine} and read the buffer sizes it logs")
    return (f"memory is not modelled for the {arch!r} architecture: {what}. KV cache and compute are not computed, "
            "and weights are only the file's tensors as placed (placement itself follows the engine's own tables). "
            f"To size memory, {measure}")


def unmodelled(inv: Inventory, engine: str) -> list[str]:
    """Why this model's memory on `engine` is not modelled (empty: it is): its architecture, or
    each `{arch}.*` key of the file the model does not read and that may change memory."""
    arch = inv.arch
    # --- ik_llama.cpp on the newer architectures: weights and KV modelled, compute not (the
    # estimate leaves compute "?" with memory/ikarchs.py's note, and fit refuses) ---
    if _ikarchs.kv_only(arch, engine):
        return _ikarchs.unmodelled(inv, NO_MEMORY_EFFECT | _not_read(inv, engine), MODELLED[arch].keys) \
            + unmodelled_structure(inv)
    # ---
    spec = MODELLED.get(arch)
    if spec is None:
        return [unmodelled_architecture(arch, engine)]
    if engine not in spec.engines:
        return [f"memory is not modelled for {arch!r} on {engine}{_ikarchs.why_not(arch, engine)}"]
    return unread_keys(inv, engine, spec.keys) or _indexer.indexer_table_unmodelled(inv) or unmodelled_structure(inv)


def _not_read(inv: Inventory, engine: str) -> frozenset[str]:
    """The file's `{arch}.*` keys that `engine`'s loader does not read for its architecture."""
    read = read_by_loader(inv.arch, engine)
    keys = frozenset(inv.metadata.arch_keys or ())
    return frozenset() if read is None else keys - read


def unread_keys(inv: Inventory, engine: str, handled: frozenset[str]) -> list[str]:
    """A note per `{arch}.*` key of the file that `engine`'s loader reads for the architecture
    and the memory model does not handle (beyond keys.NO_MEMORY_EFFECT and `handled`)."""
    arch = inv.arch
    passed = NO_MEMORY_EFFECT | handled | _not_read(inv, engine)
    nxt = ("measure this model with llama.cpp's llama-fit-params -fitp on" if engine == "llama.cpp"
           else "its KV cache and compute are not computed")
    why = []
    for k in inv.metadata.arch_keys or ():
        if k in passed or neutral(k, inv):
            continue
        fields = FIELDS.get(k, ())
        into = f" (into {', '.join(fields)})" if fields and engine == "llama.cpp" else ""
        why.append(f"memory is not modelled for {arch}.{k}: the {engine} loader of {arch!r} reads it{into} and "
                   f"moeconf does not model what it changes; {nxt}")
    return why
