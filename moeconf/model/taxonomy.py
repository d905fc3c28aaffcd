"""The tensor taxonomy: which semantic group each tensor belongs to, in the user's words.

Groups are derived from `gguf.constants` (`TENSOR_NAMES`, `MODEL_TENSOR`) by the tensor kind's
enum name, so a tensor kind gguf knows is classified without a hand list of file names; names
gguf does not know go to `other` with a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Final, Literal

from moeconf.model import ggml

Group = Literal[
    "experts", "shexp", "router", "attn", "dense", "norm", "embd", "output", "nextn", "ssm", "other"
]
GROUPS: Final[tuple[Group, ...]] = (
    "experts", "shexp", "router", "attn", "dense", "norm", "embd", "output", "nextn", "ssm", "other"
)
LayerKind = Literal["dense", "moe", "nextn"]
LAYER_KINDS: Final[tuple[LayerKind, ...]] = ("dense", "moe", "nextn")

_EXPERT_KINDS = frozenset({
    "FFN_GATE_EXP", "FFN_DOWN_EXP", "FFN_UP_EXP", "FFN_GATE_UP_EXP",
    "FFN_GATE_CHEXP", "FFN_DOWN_CHEXP", "FFN_UP_CHEXP",
})
_ROUTER_KINDS = frozenset({"FFN_GATE_INP", "FFN_EXP_PROBS_B"})
_DENSE_KINDS = frozenset({"FFN_GATE", "FFN_UP", "FFN_DOWN", "FFN_ACT"})
_EMBD_KINDS = frozenset({"TOKEN_EMBD", "POS_EMBD", "TOKEN_TYPES", "PER_LAYER_TOKEN_EMBD"})
_SSM_PREFIXES = ("SSM_", "TIME_MIX_", "CHANNEL_MIX_", "SHORTCONV_")
_ATTN_PREFIXES = ("ATTN_", "INDEXER_")
# Encoder/decoder, vision, audio and other towers: never part of an LLM's MoE placement.
_TOWER_PREFIXES = ("V_", "A_", "ENC_", "DEC_", "POSNET_", "CONVNEXT_", "CLS", "VISEXP_")


def group_of_kind(kind: str) -> Group:
    """The group of a `gguf.constants.MODEL_TENSOR` member, by its enum name."""
    if kind.startswith("NEXTN_"):
        return "nextn"
    if kind in _EXPERT_KINDS:
        return "experts"
    if kind.endswith("_SHEXP"):
        return "shexp"
    if kind in _ROUTER_KINDS:
        return "router"
    if kind.startswith(_TOWER_PREFIXES):
        return "other"
    if kind.startswith(_SSM_PREFIXES):
        return "ssm"
    if "NORM" in kind:
        return "norm"
    if kind.startswith(_ATTN_PREFIXES):
        return "attn"
    if kind in _DENSE_KINDS:
        return "dense"
    if kind in _EMBD_KINDS:
        return "embd"
    if kind == "OUTPUT":
        return "output"
    return "other"


@dataclass(frozen=True)
class TensorKind:
    """What a tensor name says: its layer (None outside blocks), its base name in the file's
    words (`ffn_up_exps`), gguf's kind names for it, and its group outside a nextn block."""

    layer: int | None
    base: str
    kinds: tuple[str, ...]
    group: Group
    known: bool


_BLK = re.compile(r"blk\.(\d+)\.(.+)\Z")


@cache
def _base_names() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """(block-level base name -> kinds, global name -> kinds) from TENSOR_NAMES."""
    c = ggml.constants()
    block: dict[str, list[str]] = {}
    top: dict[str, list[str]] = {}
    for kind, template in c.TENSOR_NAMES.items():
        if template.startswith("blk.{bid}."):
            block.setdefault(template[len("blk.{bid}.") :], []).append(kind.name)
        elif "{" not in template:
            top.setdefault(template, []).append(kind.name)
    return (
        {k: tuple(v) for k, v in block.items()},
        {k: tuple(v) for k, v in top.items()},
    )


def _group_of_kinds(kinds: tuple[str, ...]) -> Group:
    groups = {group_of_kind(k) for k in kinds}
    if len(groups) == 1:
        return groups.pop()
    # Two kinds share a name (FFN_NORM / FFN_PRE_NORM): they agree in practice; pick stably.
    return sorted(groups)[0]


@cache
def classify_name(name: str) -> TensorKind:
    """Classify a tensor name such as `blk.12.ffn_up_exps.weight` or `token_embd.weight`."""
    block, top = _base_names()
    m = _BLK.match(name)
    layer: int | None
    if m:
        layer, rest, table = int(m.group(1)), m.group(2), block
    else:
        layer, rest, table = None, name, top
    candidates = [rest]
    if "." in rest:
        candidates.append(rest.rsplit(".", 1)[0])  # strip .weight / .bias / .scale
    for cand in candidates:
        kinds = table.get(cand)
        if kinds:
            return TensorKind(layer, cand, kinds, _group_of_kinds(kinds), True)
    base = candidates[-1]
    return TensorKind(layer, base, (), "other", False)


@cache
def moe_architectures() -> tuple[str, ...]:
    """Architectures whose gguf tensor list has routed experts."""
    c = ggml.constants()
    out = []
    for arch, kinds in c.MODEL_TENSORS.items():
        if any(k.name in _EXPERT_KINDS for k in kinds):
            out.append(c.MODEL_ARCH_NAMES[arch])
    return tuple(sorted(out))
