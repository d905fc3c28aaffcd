"""Hypothesis strategies: random MoE inventories built from gguf.constants.MODEL_TENSORS, and
random plans over them."""

from __future__ import annotations

from typing import Any

import gguf
from hypothesis import strategies as st

from moeconf.model.inventory import Inventory, ModelMetadata, RawTensor, build_inventory
from moeconf.model.taxonomy import classify_name, moe_architectures

C = gguf.constants
ARCH_BY_NAME = {C.MODEL_ARCH_NAMES[a]: a for a in C.MODEL_TENSORS}
EXPERT_KINDS = {"FFN_GATE_EXP", "FFN_DOWN_EXP", "FFN_UP_EXP", "FFN_GATE_UP_EXP",
                "FFN_GATE_CHEXP", "FFN_DOWN_CHEXP", "FFN_UP_CHEXP"}
MOE_ONLY = EXPERT_KINDS | {"FFN_GATE_INP", "FFN_EXP_PROBS_B", "FFN_GATE_SHEXP", "FFN_UP_SHEXP",
                           "FFN_DOWN_SHEXP", "FFN_GATE_INP_SHEXP", "FFN_NORM_EXP", "MOE_LATENT_DOWN",
                           "MOE_LATENT_UP"}
DENSE_ONLY = {"FFN_GATE", "FFN_UP", "FFN_DOWN", "FFN_ACT"}


def _kinds(arch: str) -> tuple[list[Any], list[Any]]:
    """(per-block kinds, global kinds) of an LLM architecture, towers left out."""
    block, top = [], []
    for k in C.MODEL_TENSORS[ARCH_BY_NAME[arch]]:
        t = C.TENSOR_NAMES[k]
        if t.startswith("blk.{bid}."):
            block.append(k)
        elif "{" not in t and classify_name(t + ".weight").group in ("embd", "output", "norm"):
            top.append(k)
    return block, top


@st.composite
def inventories(draw: st.DrawFn, max_blocks: int = 64) -> Inventory:
    arch = draw(st.sampled_from([a for a in moe_architectures() if a in ARCH_BY_NAME]))
    block_kinds, top_kinds = _kinds(arch)
    n = draw(st.integers(1, max_blocks))
    lead = draw(st.integers(0, min(3, n - 1)))
    nextn = draw(st.integers(0, 1)) if n - lead > 1 else 0
    step = draw(st.sampled_from([1, 1, 1, 2]))
    has_bias = draw(st.booleans())
    raw: list[RawTensor] = []
    for k in top_kinds:
        raw.append(RawTensor(C.TENSOR_NAMES[k] + ".weight", "F32", (32,), 128))
    for il in range(n):
        is_nextn = il >= n - nextn
        is_moe = is_nextn or (il >= lead and (il + 1) % step == 0)
        for k in block_kinds:
            name = k.name
            if name.startswith("NEXTN_") and not is_nextn:
                continue
            if name in MOE_ONLY and not is_moe:
                continue
            if name in DENSE_ONLY and is_moe:
                continue
            base = C.TENSOR_NAMES[k].format(bid=il)
            raw.append(RawTensor(base + ".weight", "F32", (32,), 128))
            if has_bias and name in EXPERT_KINDS:
                raw.append(RawTensor(base + ".bias", "F32", (32,), 128))
    # de-duplicate names two kinds share (FFN_NORM / FFN_PRE_NORM)
    seen: set[str] = set()
    uniq = [r for r in raw if not (r.name in seen or seen.add(r.name))]  # type: ignore[func-returns-value]
    md = ModelMetadata(
        arch=arch, block_count=n, expert_count=8, expert_used_count=2,
        leading_dense_block_count=lead or None, interleave_moe_layer_step=step if step > 1 else None,
        nextn_predict_layers=nextn or None,
    )
    return build_inventory(md, uniq, source=f"random-{arch}")


DEVICES = ["cpu", "gpu", "gpu1", "CUDA1", "cpu"]


@st.composite
def rules(draw: st.DrawFn, inv: Inventory) -> str:
    bases = sorted({t.base for t in inv.tensors if t.layer is not None})
    groups = sorted({t.group for t in inv.tensors})
    target_pool = [*groups, "layer", "all", *bases]
    targets = draw(st.lists(st.sampled_from(target_pool), min_size=1, max_size=3, unique=True))
    last = inv.block_count - 1
    layerset = draw(st.one_of(
        st.just(""),
        st.integers(0, last).map(lambda a: f" layers {a}.."),
        st.integers(0, last).map(lambda a: f" layers ..{a}"),
        st.tuples(st.integers(0, last), st.integers(0, last)).map(lambda ab: f" layers {min(ab)}..{max(ab)}"),
        st.lists(st.integers(0, last), min_size=1, max_size=5).map(lambda xs: " layers " + ", ".join(map(str, xs))),
        st.integers(1, 6).map(lambda k: f" first {k}"),
        st.integers(1, 6).map(lambda k: f" last {k}"),
        st.sampled_from([" layers moe", " layers dense", " layers nextn"]),
    ))
    device = draw(st.sampled_from(DEVICES))
    return f"{', '.join(targets)}{layerset} -> {device}"


def plan_text(rule_list: list[str], engine: str = "llama.cpp", extra: str = "") -> str:
    rl = "[" + ", ".join(f'"{r}"' for r in rule_list) + "]"
    return (f'rules = {rl}\n[model]\npath = "unused.json"\nserve_path = "/m/model.gguf"\n'
            f'[engine]\nname = "{engine}"\ngpus = ["CUDA0", "CUDA1"]\n{extra}')
