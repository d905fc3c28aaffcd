"""What the architectures' compositions share: the facts a composition reads from the GGUF beyond
the tensors, the classic decoder layer as a row (`Decoder`), build_moe_ffn with a shared expert, and
`Memory`: what a composition module declares about the memory `estimate` takes from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import OUTPUT, Tensor

if TYPE_CHECKING:
    from moeconf.model.inventory import Inventory


@dataclass(frozen=True)
class Facts:
    """What a composition reads from the GGUF beyond the tensors."""

    gating: int | None = None  # expert_gating_func (1 softmax, 2 sigmoid, 3 softmax of the chosen)
    norm_w: int | None = None  # expert_weights_norm
    floats: frozenset[str] = frozenset()  # the float `{arch}.*` keys present (scales, clamps)
    groups: tuple[int, int] = (0, 0)  # expert_group_count, expert_group_used_count
    units: frozenset[str] = frozenset()  # the float `{arch}.*` keys present whose value is 0 or 1
    # the float `{arch}.*` keys' values where the source has them (a GGUF; a manifest has none)
    values: tuple[tuple[str, float | tuple[float, ...]], ...] = ()
    indexer_top_k: int = 0  # attention.indexer.top_k: the cells the DSA indexer keeps per token
    hparams: tuple[tuple[str, int | tuple[int, ...]], ...] = ()  # the other integer `{arch}.*` keys present
    zeros: frozenset[str] = frozenset()  # the float keys present whose value is 0

    def above(self, key: str, il: int, floor: float = 0.0) -> bool:
        """Whether `{arch}.key` is above `floor` for layer il (get_key_or_arr: one value per layer or
        one for all; absent: no); a key present whose value the source does not carry counts as above."""
        v = dict(self.values).get(key)
        if v is None:
            return key in self.floats or key in self.units
        if isinstance(v, tuple):
            return il < len(v) and v[il] > floor
        return v > floor

    def hparam(self, key: str, default: int = 0) -> int:
        """An integer `{arch}.KEY` (by its name after `{arch}.`), or `default` where absent."""
        return next((v for k, v in self.hparams if k == key and isinstance(v, int)), default)

    def ints_of(self, key: str) -> tuple[int, ...]:
        """An integer array `{arch}.KEY` of the file (a single value as one; empty where absent)."""
        for k, v in self.hparams:
            if k == key:
                return v if isinstance(v, tuple) else (v,)
        return ()

    def nonzero(self, key: str) -> bool:
        """Whether the float `{arch}.key` is present and not 0 (a manifest's float keys count as not 0)."""
        return key in self.floats or (key in self.units and key not in self.zeros)


@dataclass(frozen=True)
class Decoder:
    """The classic decoder layer (src/models/llama.cpp, qwen3moe.cpp, qwen2moe.cpp, olmoe.cpp,
    granite.cpp, phi3.cpp, dbrx.cpp, minimax-m2.cpp).

    norm: "rms" or "layer" (LLM_NORM). qk_norm: "head" (per head before RoPE, Qwen3), "full" (over
    the projection before the reshape, OLMoE, MiniMax-M2), "" none. q_scale: Q scaled after RoPE
    (Phi-3). clamp_key: the key whose presence clamps Q, K, V (DBRX's attention.clamp_kqv).
    ffn_norm: the FFN norm's tensor. gating / gating_key: the router's function and whether
    `expert_gating_func` overrides it; norm_w / norm_w_key likewise for the weights' normalisation.
    shexp_gate: how the shared expert's gate applies ("silu_div": x * silu(g)/g, Qwen2-MoE).
    granite: embedding, residual and logit scales where their keys are present. residual_first:
    the FFN's residual is the ADD's first source (Phi-3)."""

    norm: str = "rms"
    qk_norm: str = ""
    q_scale: bool = False
    clamp_key: str = ""
    ffn_norm: str = "ffn_norm"
    gating: str = "softmax"
    gating_key: bool = False
    norm_w: bool = True
    norm_w_key: bool = False
    shexp_gate: str = ""
    granite: bool = False
    residual_first: bool = False
    mrope: bool = False  # multi-section RoPE: four positions per token (Qwen3-VL)
    deepstack: bool = False  # the first layers add back slices of the wider input embedding (Qwen3-VL)
    # the output rows taken after the final norm, which is a graph output (t_h_nextn, the MTP head's input;
    # cparams.embeddings_nextn_masked is off), not in the last layer (HY V3)
    h_nextn: bool = False
    iswa: bool = False  # attention through the sliding-window cache pair (build_attn_inp_kv_iswa)
    rope_swa_only: bool = False  # RoPE on the sliding-window layers only (EXAONE-MoE)


Build = Callable[[GraphContext, Facts], None]


@dataclass(frozen=True)
class Memory:
    """A composition's standing in `estimate` (absent: nodes only, the memory still an older replay's
    or refused). checked_on: what its figures were checked against. keys: the `{arch}.*` keys its
    loader reads beyond support.NO_MEMORY_EFFECT, each composed. replaces_replay: the architecture had
    an older replay (memory/support.py registers it) and its compute now comes from this graph.
    refuses: settings under which `estimate` leaves the compute out, saying why."""

    checked_on: str
    keys: frozenset[str] = frozenset()
    replaces_replay: bool = False
    # the settings the composition does not build (the reserve's ubatch tokens and streams -> why, or ""):
    # a branch of the engine's graph no recorded dump checked
    refuses: Callable[[int, int], str] | None = None
    # the files the composition does not build or the engine refuses (the inventory -> why; empty: it builds)
    unmodelled: Callable[[Inventory], list[str]] | None = None


# the architectures an older replay modelled, their compute now the graph's
REPLAYED = Memory("every recorded figure of its older replay, through the graph (tests/test_memory_graph.py)",
                  replaces_replay=True)
CHECKED = "llama-fit-params -fitp on (llama.cpp 0.3.36) on sparse full-size layouts"

GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def decoder(spec: Decoder) -> Build:
    def build(g: GraphContext, facts: Facts) -> None:
        c, w, hp = g.ctx, g.w, g.hp
        rms = spec.norm == "rms"
        inp = g.inp_embd(need(w.get("token_embd.weight")))
        pos = g.inp_pos(4 if spec.mrope else 1)
        full, swa = g.attn_inp_kv_iswa() if spec.iswa else (g.attn_inp_kv(), None)
        out_ids = g.inp_out_ids()
        gating = GATING.get(facts.gating or 0, spec.gating) if spec.gating_key else spec.gating
        norm_w = bool(facts.norm_w) if spec.norm_w_key and facts.norm_w is not None else spec.norm_w
        w_scale = "expert_weights_scale" in facts.floats
        res_scale = spec.granite and "residual_scale" in facts.floats
        clamp = bool(spec.clamp_key) and spec.clamp_key in facts.floats
        g.groups = facts.groups  # read for every architecture (llama-model.cpp)
        for il in range(hp.n_layer):
            res = inp
            cur = g.norm(inp, w.layer(il, "attn_norm"), w.layer(il, "attn_norm", "bias"), il, rms)
            n_head, n_kv = hp.n_head[il], hp.n_head_kv[il]
            if spec.qk_norm == "full":
                q, k, v = g.qkv(il, cur, n_head, n_kv, hp.head_k, hp.head_v, clamp, reshape=False)
                q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
                k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
                T = cur.ne[1]
                q, k, v = (c.reshape(q, hp.head_k, n_head, T), c.reshape(k, hp.head_k, n_kv, T),
                           c.reshape(v, hp.head_v, n_kv, T))
            else:
                q, k, v = g.qkv(il, cur, n_head, n_kv, hp.head_k, hp.head_v, clamp)
                if spec.qk_norm == "head" and w.layer(il, "attn_q_norm") is not None:
                    q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
                    k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
            if not spec.rope_swa_only or g.swa_layers.get(il):
                freqs = w.copy("rope_freqs.weight", il)
                q = c.rope(q, pos, freqs)
                k = c.rope(k, pos, freqs)
            if spec.qk_norm == "head_after_rope":
                k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
                q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
            if spec.q_scale:
                q = c.scale(q)
            attn_in = swa if swa is not None and g.swa_layers.get(il) else full
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v,
                         iswa=spec.iswa)
            if il == hp.n_layer - 1 and not spec.h_nextn:
                cur = c.get_rows(cur, out_ids)
                res = c.get_rows(res, out_ids)
            if res_scale:
                cur = c.scale(cur)
            ffn_inp = c.add(cur, res)
            cur = g.norm(ffn_inp, w.layer(il, spec.ffn_norm), w.layer(il, spec.ffn_norm, "bias"), il, rms)
            if w.layer(il, "ffn_gate_inp") is None:
                gate = w.layer(il, "ffn_gate")
                cur = g.ffn(cur, w.layer(il, "ffn_up"), gate, w.layer(il, "ffn_down"), il,
                            act="silu" if gate is not None else "swiglu",
                            up_b=w.layer(il, "ffn_up", "bias"), gate_b=w.layer(il, "ffn_gate", "bias"),
                            down_b=w.layer(il, "ffn_down", "bias"))
            else:
                cur = moe_shared(g, spec, il, cur, gating, norm_w, w_scale)
            if res_scale:
                cur = c.scale(cur)
            cur = c.add(ffn_inp, cur) if spec.residual_first else c.add(cur, ffn_inp)
            n_deep = hp.n_embd_inp // hp.n_embd - 1 if spec.deepstack and hp.n_embd_inp else 0
            if il < n_deep and g.t_inp_embd is not None:
                t = g.t_inp_embd
                cur = c.add(cur, c.view(t, (hp.n_embd, t.ne[1]), (t.nb[1],), (il + 1) * hp.n_embd * 4))
            inp = cur
        cur = g.norm(inp, w.get("output_norm.weight"), w.get("output_norm.bias"), -1, rms)
        if spec.h_nextn:
            cur.flags |= OUTPUT
            cur = c.get_rows(cur, out_ids)
        logits = g.mm(need(w.get("output.weight")), cur)
        out_b = w.get("output.bias")
        if out_b is not None:
            logits = c.add(logits, out_b)
        if spec.granite and "logit_scale" in facts.floats:
            logits = c.scale(logits)
        g.finish(cur, logits)

    return build


def moe_shared(g: GraphContext, spec: Decoder, il: int, cur: Tensor, gating: str, norm_w: bool,
               w_scale: bool) -> Tensor:
    """build_moe_ffn, then a shared expert (gated where the model has its gate) added to it."""
    c, w = g.ctx, g.w
    moe = g.moe_ffn(cur, il, gating=gating, norm_w=norm_w, w_scale=2.0 if w_scale else 0.0,
                    probs_bias=probs_bias(g, il), groups=g.groups)
    if w.layer(il, "ffn_up_shexp") is None:
        return moe
    gate_inp = w.layer(il, "ffn_gate_inp_shexp")
    gate = None
    if gate_inp is not None and spec.shexp_gate == "silu_div":
        logits = g.mm(gate_inp, cur)
        gate = c.div(c.unary(logits, "silu"), logits)
    sh = g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"), w.layer(il, "ffn_down_shexp"), il)
    if gate is not None:
        sh = c.mul(sh, gate)
    return c.add(moe, sh)


def probs_bias(g: GraphContext, il: int) -> Tensor | None:
    """The expert selection bias: `blk.N.exp_probs_b.bias`, or `blk.N.exp_probs_b` where the loader names
    it without a suffix (src/models/hy-v3.cpp)."""
    return g.w.layer(il, "exp_probs_b", "bias") or g.w.get(f"blk.{il}.exp_probs_b")


def need(t: Tensor | None) -> Tensor:
    assert t is not None
    return t
