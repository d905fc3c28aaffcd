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


# --- every block on the CPU (-ngl 0, -ngl 1; h20ngl) ---
# "host" is -ngl 0 (the output layer on the CPU too), "gpu_output" is -ngl 1 (only the output layer
# offloaded: that GPU runs the output norm and the logits, plus what `output_gpu_experts_copy` says).
# The engine's graph gives both exactly on every modelled architecture (tests/test_memory_cpu_layers.py,
# tests/data/cpu_layers_oracle.json: llama-fit-params -fitp on); the phase model, which only ranks a
# search's candidates, was off there by up to 30 MiB per 512 ubatch tokens.


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
