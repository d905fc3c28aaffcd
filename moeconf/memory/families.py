"""Setting families whose compute buffers moeconf does not model (issue 17): the estimate is incomplete with a note
naming the family (docs/memory-architectures.md, "Families refused": found on held-out command lines, measured with
`llama-fit-params -fitp on`). Speculative decoding, files loaded beside the model and an `--override-kv` of a key that
sizes anything (read from the command line by engines/speculative.py, extrafiles.py, kvoverride.py) are refused
everywhere."""

from __future__ import annotations

from collections.abc import Sequence

import moeconf.engines.extrafiles as xf
import moeconf.engines.kvoverride as kvo
import moeconf.engines.speculative as spec
from moeconf.engines import HOST
from moeconf.engines.settings import MemorySettings
from moeconf.memory.archgraph import output_device
from moeconf.memory.graph.archs import traits
from moeconf.memory.keys import SCALARS_ONLY, read_by_loader
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")
_ATTN = ("attn_q", "attn_qkv", "attn_q_a", "attn_kv_a_mqa", "attn_output")
# the scalars whose value adds or removes no op: not the routing's gating, normalisation and scale, nor the
# embedding, logit and residual scales, which change the graph (--override-kv of one is refused like a size)
_OPLESS_SCALARS = frozenset(k for k in SCALARS_ONLY if not k.startswith("expert_")
                            and k not in ("logit_scale", "embedding_scale", "residual_scale"))


def unmodelled_settings(placement: Placement, settings: MemorySettings, gpus: list[str],
                        by_graph: bool = False) -> list[str]:
    """Why these settings' compute buffers on this placement are not modelled (empty: they are). `by_graph`: the
    graph gives every buffer where CPU experts and output over several GPUs were checked (output_family_checked)."""
    # on any device: speculative decoding, files loaded beside the model, --override-kv of a key that sizes anything
    why: list[str] = unmodelled_speculation(settings.speculation, placement.inventory)
    why.extend(unmodelled_extra_files(settings.extra_files))
    why.extend(unmodelled_overrides(settings.kv_overrides, placement.inventory.arch, placement.engine.name))
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


# kind -> what is not counted, around the flag or variable ({0}; for a binary, {1}: what it keeps)
_SPECULATION: dict[str, str] = {
    spec.DRAFT: "the draft model's weights, KV cache and compute ({0}) are not counted",
    spec.DRAFT_TYPE: ("{0} runs a second context on the model's MTP head or a draft sidecar: its weights, KV cache "
                      "and compute, and the recurrent layers' rollback snapshots, are not counted"),
    spec.NGRAM: ("{0}: the logits of the drafted tokens, the n-gram tables and the speculative checkpoints are not "
                 "counted"),
    spec.IK_MTP: ("{0} runs the model's NextN (MTP) layers in a second context: its KV cache and compute are not "
                  "counted"),
    spec.BINARY: "{0} keeps {1}, which are not counted",
}


def unmodelled_speculation(speculation: spec.Speculation, inv: Inventory) -> list[str]:
    """Why memory is not modelled for this speculation (empty: none is on, or it changes nothing:
    ik's -mtp on a model without NextN layers)."""
    nextn = inv.metadata.hparam("nextn_predict_layers")
    has_nextn = (max(nextn, default=0) if isinstance(nextn, tuple) else nextn or 0) > 0
    return [f"memory is not modelled with speculative decoding: "
            f"{_SPECULATION[kind].format(where, spec.SPECULATING_BINARIES.get(where))}"
            for kind, where in dict.fromkeys(speculation)
            if kind in _SPECULATION and (kind != spec.IK_MTP or has_nextn)]


# kind -> what is not counted, around the flag ({})
_PROJECTOR = "the multimodal projector's weights and compute buffer ({}, "
_EXTRA_FILES: dict[str, str] = {
    xf.MMPROJ: _PROJECTOR + "on the GPU unless --no-mmproj-offload) are",
    xf.MMPROJ + "-host": _PROJECTOR + "in host memory: --no-mmproj-offload) are",
    xf.LORA: "the LoRA adapter's tensors ({}, beside each tensor they modify) are",
    xf.CVEC: "the control vector ({}, a row per layer on its device) is",
}


def unmodelled_extra_files(extra: xf.ExtraFiles) -> list[str]:
    """Why memory is not modelled for the files this launch loads beside the model (empty: none)."""
    return [f"memory is not modelled with files loaded beside the model: {_EXTRA_FILES[kind].format(where)} "
            "not counted"
            for kind, where in dict.fromkeys(extra) if kind in _EXTRA_FILES]


def unmodelled_overrides(overrides: Sequence[kvo.Override], arch: str, engine: str | None = None) -> list[str]:
    """Why memory is not modelled under these overrides (empty: none sizes anything). With the
    engine named, an `{arch}.*` key its loader does not read for `arch` (moeconf/engines/archkeys.py)
    changes nothing."""
    why: list[str] = []
    read = read_by_loader(arch, engine) if engine is not None else None
    for key, where in dict.fromkeys(overrides):
        if key.startswith("tokenizer.") or (key.startswith("general.") and key != "general.architecture"):
            continue
        sub = key[len(arch) + 1:] if key.startswith(arch + ".") else None
        if sub is not None and (sub in _OPLESS_SCALARS or (read is not None and sub not in read)):
            continue
        why.append(f"memory is not modelled with {where}: moeconf reads the file's {key}, which the engine "
                   "replaces, and that value may size the KV cache, the compute buffers or the layers")
    return why
