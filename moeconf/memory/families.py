"""Setting families whose compute buffers moeconf does not model (issue 17): the estimate is incomplete with a note
naming the family (docs/memory-architectures.md, "Families refused": found on held-out command lines, measured with
`llama-fit-params -fitp on`). Speculative decoding and files loaded beside the model are refused everywhere."""

from __future__ import annotations

import moeconf.memory.extrafiles as extrafiles
import moeconf.memory.kvoverride as kvoverride
import moeconf.memory.speculative as spec
from moeconf.engines import HOST
from moeconf.memory.archgraph import output_device
from moeconf.memory.graph.archs import traits
from moeconf.memory.settings import MemorySettings
from moeconf.placement import Placement

_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")
_ATTN = ("attn_q", "attn_qkv", "attn_q_a", "attn_kv_a_mqa", "attn_output")


def unmodelled_settings(placement: Placement, settings: MemorySettings, gpus: list[str],
                        by_graph: bool = False) -> list[str]:
    """Why these settings' compute buffers on this placement are not modelled (empty: they are). `by_graph`: the
    graph gives every buffer where CPU experts and output over several GPUs were checked (output_family_checked)."""
    # on any device: speculative decoding, files loaded beside the model, --override-kv of a key that sizes anything
    why: list[str] = spec.unmodelled_speculation(settings.speculation, placement.inventory)
    why.extend(extrafiles.unmodelled_extra_files(settings.extra_files))
    why.extend(kvoverride.unmodelled_overrides(settings.kv_overrides, placement.inventory.arch, placement.engine.name))
    if not gpus:
        return why
    attn_dev: dict[int, str | None] = {}  # each layer's attention device: that of its first attention tensor
    for t in placement.inventory.tensors:
        if t.layer is not None and t.base in _ATTN and t.layer not in attn_dev:
            attn_dev[t.layer] = placement.devices.get(t.name)
    # routed experts on the CPU of a layer whose attention runs on a GPU
    cpu_experts = any(attn_dev.get(t.layer) not in (None, HOST) for t in placement.inventory.tensors
                      if t.layer is not None and t.base in _EXPERTS and placement.devices.get(t.name) == HOST)
    # (where the graph's figures were checked against the engine's there: Traits.nkvo_host_experts)
    if cpu_experts and not settings.offload_kqv and not traits(placement.inventory.arch).nkvo_host_experts:
        why.append("memory is not modelled for -nkvo (KV cache in host memory) with routed experts of GPU "
                   "layers on the CPU: the compute buffers of that split are not computed")
    out = output_device(placement)  # a tied output's copy where the engine makes one
    if cpu_experts and out == HOST and len(gpus) > 1 and not by_graph:
        why.append("memory is not modelled for the output on the CPU with routed experts of GPU layers on the "
                   "CPU over several GPUs: the GPUs' compute buffers of that split are not computed (keep "
                   "output.weight on a GPU)")
    # a layer whose attention runs on a GPU right after a layer whose attention runs on the CPU
    if out == HOST and min(settings.n_ubatch, settings.n_batch) > 512 and any(
            attn_dev.get(il - 1) == HOST and d not in (None, HOST) for il, d in attn_dev.items()):
        why.append("memory is not modelled for the output on the CPU with a GPU running layers after CPU layers "
                   "(a partial -ngl) at -ub above 512: the host's compute buffer (the logits and the CPU's "
                   "layers) is not computed")
    return why
