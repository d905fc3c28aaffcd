"""Memory facts of the "classic" MoE architectures beyond the first five (issue 17):
the tied output's second copy of `token_embd` (engines/tied.py), where the logits are computed,
the graph's input width, and the placements whose compute is modelled."""

from __future__ import annotations

from moeconf.memory.graph.model import GRAPH_COMPUTE
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

HOST = "CPU"


def output_device(placement: Placement) -> str:
    """The device that computes the logits: the one holding the output matrix (for a tied output,
    the engine's second copy of `token_embd`, or `token_embd` itself where no copy is made)."""
    tied = placement.tied_output()
    if tied is not None:
        return tied
    return placement.devices.get("output.weight") or placement.devices.get("token_embd.weight") or HOST


def tied_output_bytes(placement: Placement) -> tuple[str, int] | None:
    """(device, bytes) of the tied output's second copy, as the model buffer holds it."""
    tied = placement.tied_output()
    if tied is None:
        return None
    return tied, placement.inventory.by_name["token_embd.weight"].nbytes


_CHECKED = "llama-fit-params -fitp on (llama.cpp 0.3.36) on sparse full-size layouts"
_MAINLINE = frozenset({"llama.cpp"})

# architectures whose memory is modelled (added to support.MODELLED): the `{arch}.*` keys read
# beyond support.NO_MEMORY_EFFECT, the engines, and what they were checked against
CLASSIC_MODELLED: dict[str, tuple[frozenset[str], frozenset[str], str]] = {
    "ernie4_5-moe": (frozenset({"leading_dense_block_count", "interleave_moe_layer_step"}), _MAINLINE,
                     _CHECKED + " (ERNIE-4.5-21B-A3B)"),
    "bailingmoe2": (frozenset({"leading_dense_block_count", "nextn_predict_layers", "expert_group_count",
                               "expert_group_used_count"}), _MAINLINE,
                    _CHECKED + " (Ling-mini-2.0)"),
    "dots1": (frozenset({"leading_dense_block_count"}), _MAINLINE, _CHECKED + " (dots.llm1)"),
    "qwen3vlmoe": (frozenset({"n_deepstack_layers", "rope.dimension_sections"}), _MAINLINE,
                   _CHECKED + " (Qwen3-VL-30B-A3B)"),
    "hunyuan-moe": (frozenset(), _MAINLINE, _CHECKED + " (Hunyuan-A13B)"),
}


def input_width(inv: Inventory, n_embd: int) -> int:
    """The graph's input embedding width (llama_hparams::n_embd_inp): Qwen3-VL's deepstack adds
    n_embd per deepstack layer (the vision features the first layers add back)."""
    deep = inv.metadata.hparam("n_deepstack_layers")
    return n_embd * (1 + (deep if isinstance(deep, int) else 0))


# Architectures whose memory is refused, and why (measured against llama-fit-params -fitp on,
# llama.cpp 0.3.36, on the sparse full-size layout named): support.unmodelled gives this reason
# instead of the generic one. Weights (the tied output's copy included) are still shown as placed.
CLASSIC_REFUSED: dict[str, str] = {}


# --- every block on the CPU (-ngl 0, -ngl 1; h20ngl) ---
# The architectures whose memory with every block on the CPU was measured within tolerance against
# `llama-fit-params -fitp on` (llama.cpp 0.3.36; every layout of moeconf/fixtures at -c 32768, -ub 512
# and 1024, f16 and q8_0 caches, and at -c 4096 and 131072; -fa off on one layout each:
# tests/data/cpu_layers_oracle.json). "host" is -ngl 0 (the output layer on the CPU too), "gpu_output"
# is -ngl 1 (only the output layer offloaded: that GPU runs the output norm and the logits, plus what
# `output_gpu_experts_copy` says). Any other architecture is refused in that case: its figures were
# off (-ngl 0: Llama-4's host 30.75 MiB per 512 ubatch tokens under; dots.llm1's and Qwen3.5's host
# exact at -c 32768 only, 20 MiB under at -c 4096, 106 at -c 131072; -ngl 1: Qwen3-Coder-480B's host
# 22.8 MiB under at -ub 1024, the experts' down output placed above a hole it does not fit in; GLM's,
# DeepSeek's, Grok's output GPU 20-28 MiB over at -ub 1024), or were never measured.
# architectures measured at -ngl 0 and -ngl 1 beside their own figures (glm5-next: its graph,
# tests/data/glm5next_memory_oracle.json): the rule below leaves them to those
OWN_PLACEMENT_CHECKS: frozenset[str] = frozenset({"glm5-next"})
# (on llama.cpp the architectures whose compute the engine's graph gives, graph.model.GRAPH_COMPUTE, are
# exact in both: tests/test_memory_cpu_layers.py; these sets hold for the phase model, ik_llama.cpp's)
CPU_LAYERS_EXACT: dict[str, frozenset[str]] = {
    "host": frozenset({"bailingmoe2", "gpt-oss", "minimax-m2", "grok"}),
    "gpu_output": frozenset({"bailingmoe2", "dots1", "ernie4_5-moe", "qwen35moe", "qwen3next", "gpt-oss",
                             "minimax-m2", "qwen3vlmoe"}),
}


def cpu_layers_case(placement: Placement) -> str | None:
    """"host" where -ngl puts every block and the output layer on the CPU, "gpu_output" where it
    puts every block on the CPU and the output layer on a GPU (-ngl 1), None otherwise."""
    inv = placement.inventory
    if not all(placement.defaults.get(t.name) in (HOST, None) for t in inv.tensors if t.layer is not None):
        return None
    return "host" if output_device(placement) == HOST else "gpu_output"


# weighted tensors a layer's graph uses after its routed experts' sum: a shared expert, a dense FFN
# beside the experts, a norm after the FFN (Grok's layer_output_norm)
_AFTER_EXPERTS = frozenset({"ffn_up", "ffn_gate", "ffn_down", "layer_output_norm", "ffn_post_norm", "post_ffw_norm"})


def output_gpu_experts_copy(placement: Placement, n_expert_used: int, n_embd: int, n_tokens: int) -> int:
    """Bytes the output GPU of -ngl 1 holds beside the logits when the last layer, run on the CPU, ends
    with its routed experts: the weighting and sum of the experts' outputs and the residual add carry
    no weights, so the scheduler's "expand GPU up" pass (ggml-backend.cpp,
    ggml_backend_sched_split_graph) gives them the output GPU, whose split then starts with a copy of
    the experts' outputs (n_embd x n_expert_used x ubatch floats), a split input kept allocated to the
    end (measured: Qwen3-30B-A3B 32 MiB, gpt-oss 22.5, MiniMax-M2 48 at -ub 512). A shared expert,
    a dense FFN or a norm after the experts has its weights on the CPU: the sum stays there (0)."""
    if cpu_layers_case(placement) != "gpu_output":
        return 0
    inv = placement.inventory
    last = max((t.layer for t in inv.tensors if t.layer is not None), default=None)
    bases = {t.base for t in inv.tensors if t.layer == last}
    if not any(b.endswith("_exps") for b in bases) or any("shexp" in b or b in _AFTER_EXPERTS for b in bases):
        return 0
    return 4 * n_tokens * n_expert_used * n_embd
# --- end every block on the CPU ---

def graph_computed(placement: Placement) -> bool:
    """Whether `estimate` takes every compute buffer from the engine's graph (memory/graph): llama.cpp's."""
    return placement.inventory.arch in GRAPH_COMPUTE and placement.engine.name == "llama.cpp"


def unmodelled_settings(placement: Placement) -> list[str]:
    """Settings under which a modelled architecture's compute is not modelled (measured outside
    tolerance): the estimate is incomplete with this note instead of a wrong number."""
    inv = placement.inventory
    out = []
    case = cpu_layers_case(placement)  # every block on the CPU (h20ngl)
    if (case is not None and inv.arch not in CPU_LAYERS_EXACT[case] and inv.arch not in OWN_PLACEMENT_CHECKS
            and not graph_computed(placement)):  # the engine's graph covers every placement (memory/graph)
        what = ("every block and the output layer on the CPU (-ngl 0)" if case == "host" else
                "every block on the CPU and only the output layer on a GPU (-ngl 1)")
        out.append(f"compute is not modelled for {inv.arch} with {what}: not measured within tolerance of "
                   "llama.cpp's own projection; KV cache and compute are not computed")
    return out
