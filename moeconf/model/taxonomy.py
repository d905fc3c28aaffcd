"""The tensor taxonomy: which semantic group each tensor belongs to, in the user's words.

Names and their kinds come from the engines themselves (`moeconf.model.nametable`, generated
from the pinned llama.cpp and ik_llama.cpp sources by scripts/extract-engine-names.py): a tensor
the engine knows gets the group of its engine kind (LLM_TENSOR_...); a name neither engine knows
is `other` with `known` False, and the inventory reports it by name.

Groups, by what the tensor is in the engine's graph:
  experts  routed expert matrices (ffn_*_exps, fused ffn_gate_up_exps, chunked *_chexps, and the
           per-expert ffn_gate.N of old split files): only the chosen experts run per token
  shexp    shared experts and their gate: always active
  router   the expert router (ffn_gate_inp), its selection bias (exp_probs_b), hash routing tables
  attn     attention and everything feeding it: q/k/v/o, MLA, DSA indexer (indexer.*,
           indexer_compressor_*), compressed-attention tensors, sinks
  dense    always-active FFN matrices: a dense block's FFN, and the latent projections that run on
           every token before routing (Nemotron-3 ffn_latent_down/up, Kimi ffn_routed_down/up)
  norm     norms and per-layer scales
  embd     token and position embeddings (per-layer embeddings included)
  output   the output head, its norm and its mHC head (output_hc_*)
  nextn    any tensor of an MTP/nextn block (its role says what it would be elsewhere)
  ssm      recurrent mixers: SSM/Mamba, gated delta-net, KDA, RWKV time/channel mix, short conv
  hc       manifold-constrained hyper-connections (mHC, hc_attn_* / hc_ffn_*): small, always active
  other    known tensors of no placement interest (encoder/decoder towers, draft-model heads,
           rope factors) and names no engine knows
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from types import ModuleType

Group = Literal[
    "experts", "shexp", "router", "attn", "dense", "norm", "embd", "output", "nextn", "ssm", "hc", "other"
]
GROUPS: Final[tuple[Group, ...]] = (
    "experts", "shexp", "router", "attn", "dense", "norm", "embd", "output", "nextn", "ssm", "hc", "other"
)
# A layer's kind is its FFN (moe: routed experts; dense: none; nextn: an MTP block); `recurrent`
# is its mixer (an SSM / delta-net / KDA / linear-attention state instead of, or beside,
# attention KV) and overlaps the others: a Qwen3.5-MoE layer is both moe and recurrent.
LayerKind = Literal["dense", "moe", "nextn", "recurrent"]
LAYER_KINDS: Final[tuple[LayerKind, ...]] = ("dense", "moe", "nextn", "recurrent")
FFN_LAYER_KINDS: Final[tuple[LayerKind, ...]] = ("dense", "moe", "nextn")

_EXPERT_KINDS = frozenset({
    "FFN_GATE_EXPS", "FFN_DOWN_EXPS", "FFN_UP_EXPS", "FFN_GATE_UP_EXPS",
    "FFN_GATE_CHEXPS", "FFN_DOWN_CHEXPS", "FFN_UP_CHEXPS",
    "FFN_GATE_EXP", "FFN_DOWN_EXP", "FFN_UP_EXP",  # ffn_gate.N: one expert per tensor
})
_ROUTER_KINDS = frozenset({"FFN_GATE_INP", "FFN_EXP_PROBS_B", "FFN_EXP_PROBS_B_VL", "FFN_GATE_TID2EID"})
# always-active FFN matrices; the latent/routed projections run on every token around the experts
_DENSE_KINDS = frozenset({
    "FFN_GATE", "FFN_UP", "FFN_DOWN", "FFN_ACT", "FFN_LATENT_DOWN", "FFN_LATENT_UP",
    "FFN_ROUTED_DOWN", "FFN_ROUTED_UP", "FFN_RES_SCORE",
})
_EMBD_KINDS = frozenset({
    "TOKEN_EMBD", "POS_EMBD", "TOKEN_TYPES", "PER_LAYER_TOKEN_EMBD", "MASKED_EMBD_CENTROIDS",
    "MASKED_EMBD_ORDERING", "PER_LAYER_MODEL_PROJ",
})
_OUTPUT_KINDS = frozenset({"OUTPUT", "OUTPUT_RES_SCORE", "DENSE_2_OUT", "DENSE_3_OUT"})
_SSM_PREFIXES = ("SSM_", "TIME_MIX_", "CHANNEL_MIX_", "SHORTCONV_")
_ATTN_PREFIXES = ("ATTN_", "INDEXER_")
# Encoder/decoder, vision, audio towers, draft-model heads: never part of an LLM's MoE placement.
_OTHER_PREFIXES = ("V_", "A_", "ENC_", "DEC_", "POS_NET_", "CONVNEXT_", "CLS", "VISEXP_", "DFLASH_", "DSPARK_",
                   "ROPE_", "ALTUP_", "LAUREL_", "HRM_")
_OTHER_KINDS = frozenset({"FC", "D2T", "CONV1D"})


@cache
def _table() -> ModuleType:
    """The generated name table, imported on first use (a large literal module)."""
    from moeconf.model import nametable

    return nametable


def group_of_kind(kind: str) -> Group:
    """The group of an engine tensor kind, by its enum name without `LLM_TENSOR_` (FFN_UP_EXPS)."""
    if kind.startswith("NEXTN_"):
        return "nextn"
    if kind in _EXPERT_KINDS:
        return "experts"
    if kind.endswith("_SHEXP"):
        return "shexp"
    if kind in _ROUTER_KINDS:
        return "router"
    if kind.startswith(_OTHER_PREFIXES) or kind in _OTHER_KINDS:
        return "other"
    if kind.startswith("HC_HEAD_"):
        return "output"
    if kind.startswith("HC_"):
        return "hc"
    if kind.startswith(_SSM_PREFIXES):
        return "ssm"
    if kind in _OUTPUT_KINDS:
        return "output"
    if "NORM" in kind or kind in ("LAYER_OUT_SCALE",):
        return "norm"
    if kind.startswith(_ATTN_PREFIXES):
        return "attn"
    if kind in _DENSE_KINDS:
        return "dense"
    if kind in _EMBD_KINDS:
        return "embd"
    if kind.startswith(("PER_LAYER_", "PLE_")):
        return "embd"
    return "other"


@dataclass(frozen=True)
class TensorKind:
    """What a tensor name says: its layer (None outside blocks), its base name in the file's
    words (`ffn_up_exps`), the engines' kind names for it, and its group outside a nextn block.
    `known`: some pinned engine knows the name."""

    layer: int | None
    base: str
    kinds: tuple[str, ...]
    group: Group
    known: bool


_BLK = re.compile(r"blk\.(\d+)\.(.+)\Z")
_XID = re.compile(r"(.+)\.(\d+)\Z")  # ffn_gate.7 (one expert's matrix), convnext.3.dw


@cache
def _base_names() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """(block-level base name -> kinds, global name -> kinds), from the engines' name tables;
    templates with an index keep it as `{xid}` / `{bid}`."""
    return dict(_table().BLOCK_TENSORS), dict(_table().GLOBAL_TENSORS)


def _group_of_kinds(kinds: tuple[str, ...]) -> Group:
    groups = {group_of_kind(k) for k in kinds}
    if len(groups) == 1:
        return groups.pop()
    # Two kinds share a name (SSM_A / SSM_A_NOSCAN): they agree in practice; pick stably.
    return sorted(groups)[0]


def _lookup(rest: str, table: dict[str, tuple[str, ...]], index_key: str) -> tuple[str, tuple[str, ...]] | None:
    candidates = [rest]
    if "." in rest:
        candidates.append(rest.rsplit(".", 1)[0])  # strip .weight / .bias / .scale
    for cand in candidates:
        kinds = table.get(cand)
        if kinds:
            return cand, kinds
        # an index inside the name: ffn_gate.7 -> ffn_gate.{xid}; posnet.3.conv1 -> posnet.{bid}.conv1
        templ = re.sub(r"(?<=\.)\d+(?=\.|\Z)|\A\d+(?=\.)", "{" + index_key + "}", cand, count=1)
        if templ != cand and templ in table:
            return cand, table[templ]
        if index_key == "bid":
            for m in re.finditer(r"\.(\d+)\.", cand):
                t2 = cand[: m.start()] + ".{bid}." + cand[m.end():]
                if t2 in table:
                    return cand, table[t2]
    return None


@cache
def classify_name(name: str) -> TensorKind:
    """Classify a tensor name such as `blk.12.ffn_up_exps.weight` or `token_embd.weight`."""
    block, top = _base_names()
    m = _BLK.match(name)
    layer: int | None
    if m:
        layer, rest = int(m.group(1)), m.group(2)
        found = _lookup(rest, block, "xid")
    else:
        layer, rest = None, name
        found = _lookup(rest, top, "bid")
    if found:
        base, kinds = found
        return TensorKind(layer, base, kinds, _group_of_kinds(kinds), True)
    base = rest.rsplit(".", 1)[0] if rest.endswith((".weight", ".bias", ".scale")) else rest
    return TensorKind(layer, base, (), "other", False)


# Layers whose mixer is recurrent though no tensor of theirs is in the `ssm` group: MiniMax-01's
# lightning-attention layers have attn_norm_2 (llama.cpp src/models/minimax-01.cpp,
# load_arch_tensors: attn_norm_2 / attn_qkv / attn_gate where hparams.is_recr(i)).
_RECURRENT_MARKERS: Final[dict[str, frozenset[str]]] = {"minimax-01": frozenset({"attn_norm_2"})}


def is_recurrent_layer(arch: str, roles: set[str], bases: set[str]) -> bool:
    """Whether a block with these tensor roles and base names mixes with a recurrent state
    (SSM, gated delta-net, KDA, RWKV, short conv, linear attention) rather than only attention."""
    return "ssm" in roles or bool(bases & _RECURRENT_MARKERS.get(arch, frozenset()))


@cache
def known_architectures() -> dict[str, tuple[str, ...]]:
    """Engine name -> every architecture name it knows."""
    return dict(_table().ARCHS)


@cache
def arch_tensor_kinds(engine: str, arch: str) -> frozenset[str] | None:
    """The tensor kinds `engine`'s loader creates for `arch` (None: the engine does not know it)."""
    table = _table().ML_ARCH_TENSORS if engine == "llama.cpp" else _table().IK_ARCH_TENSORS
    kinds = table.get(arch)
    return frozenset(kinds) if kinds is not None else None


def mtp_skipped(engine: str, arch: str) -> bool:
    """Whether `engine`'s loader creates the tensors of `arch`'s MTP/nextn blocks with TENSOR_SKIP
    when MTP is not loaded (the default)."""
    skipped = _table().ML_MTP_SKIPPED if engine == "llama.cpp" else _table().IK_MTP_SKIPPED
    return arch in skipped


def mtp_loaded_names(engine: str, arch: str) -> frozenset[str]:
    """Tensors (names after `blk.N.`) `engine`'s loader creates in an MTP/nextn block of `arch`
    without the skip flag: loaded on their layer's device though MTP is not (deepseek32 and glm-dsa:
    `exp_probs_b.bias`)."""
    table = _table().ML_MTP_LOADED if engine == "llama.cpp" else _table().IK_MTP_LOADED
    return frozenset(table.get(arch, ()))


@cache
def unused_kinds() -> frozenset[str]:
    """Kinds mainline's loader never loads (LLM_TENSOR_INFOS op GGML_OP_NONE)."""
    return frozenset(_table().ML_UNUSED_KINDS)


@cache
def moe_architectures() -> tuple[str, ...]:
    """Architectures whose loader (either engine) creates routed experts."""
    out = set()
    for table in (_table().ML_ARCH_TENSORS, _table().IK_ARCH_TENSORS):
        for arch, kinds in table.items():
            if any(k in _EXPERT_KINDS for k in kinds):
                out.add(arch)
    return tuple(sorted(out))
