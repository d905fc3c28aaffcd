"""What the architectures' compositions share: the facts a composition reads from the GGUF beyond the tensors
(`Facts`), the classic decoder layer as a row (`Decoder`), build_moe_ffn as the GGUF's keys set it (`routed`),
what a module declares about the memory `estimate` takes from it (`Memory`) and what the rest of moeconf's
memory model reads about its architecture (`Traits`), and the refusals of files no recorded dump checked."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from moeconf.memory.graph.blocks import AttnInput, GraphContext, MissingTensor, RsInput
from moeconf.memory.graph.ggml import Tensor

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
        v = dict(self.hparams).get(key, ())
        return v if isinstance(v, tuple) else (v,)

    def gating_or(self, default: str) -> str:
        """The router's function: expert_gating_func where the GGUF has it, else the architecture's."""
        return GATING.get(self.gating or 0, default)

    @property
    def w_scale(self) -> float:
        """build_moe_ffn's scale of the chosen weights: any value but 0 or 1 where expert_weights_scale is
        present (its value runs no differently), else none."""
        return 2.0 if "expert_weights_scale" in self.floats else 0.0

    def nonzero(self, key: str) -> bool:
        """Whether the float `{arch}.key` is present and not 0 (a manifest's float keys count as not 0)."""
        return key in self.floats or (key in self.units and key not in self.zeros)


@dataclass(frozen=True)
class Decoder:
    """The classic decoder layer (src/models/llama.cpp, qwen3moe.cpp, qwen2moe.cpp, olmoe.cpp, granite.cpp,
    phi3.cpp, dbrx.cpp, minimax-m2.cpp): a row says what an architecture's layer does differently."""

    norm: str = "rms"  # "rms" or "layer" (LLM_NORM)
    # "head": per head before RoPE (Qwen3); "head_after_rope": per head after it (Hunyuan); "full": over the
    # projection before the reshape (OLMoE, MiniMax-M2); "": none
    qk_norm: str = ""
    q_scale: bool = False  # Q scaled after RoPE (Phi-3)
    clamp_key: str = ""  # the key whose presence clamps Q, K, V (DBRX's attention.clamp_kqv)
    ffn_norm: str = "ffn_norm"  # the FFN norm's tensor
    gating: str = "softmax"  # the router's function
    gating_key: bool = False  # whether `expert_gating_func` overrides `gating`
    norm_w: bool = True  # the chosen weights normalised
    norm_w_key: bool = False  # whether `expert_weights_norm` overrides `norm_w`
    shexp_gate: str = ""  # how the shared expert's gate applies ("silu_div": x * silu(g)/g, Qwen2-MoE)
    granite: bool = False  # embedding, residual and logit scales where their keys are present
    residual_first: bool = False  # the FFN's residual is the ADD's first source (Phi-3)
    mrope: bool = False  # multi-section RoPE: four positions per token (Qwen3-VL)
    deepstack: bool = False  # the first layers add back slices of the wider input embedding (Qwen3-VL)
    # the output rows taken after the final norm, which is a graph output (t_h_nextn, the MTP head's input;
    # cparams.embeddings_nextn_masked is off), not in the last layer (HY V3)
    h_nextn: bool = False
    # attention through the sliding-window cache pair (build_attn_inp_kv_iswa); None: where the context has a window
    iswa: bool | None = False
    rope_swa_only: bool = False  # RoPE on the sliding-window layers only (EXAONE-MoE)
    # Q times the per-position temperature input after RoPE where attention.temperature_scale is not 0 (Ministral 3)
    temperature: bool = False


Build = Callable[[GraphContext, Facts], None]


@dataclass(frozen=True)
class Memory:
    """A composition's standing in `estimate`: its architecture's memory is modelled (absent: nodes only, the
    memory refused)."""

    checked_on: str  # what its figures were checked against
    keys: frozenset[str] = frozenset()  # the `{arch}.*` keys its loader reads beyond support.NO_MEMORY_EFFECT, composed
    # settings under which `estimate` leaves the compute out, saying why (the reserve's ubatch tokens and
    # streams -> why, or ""): a branch of the engine's graph no recorded dump checked
    refuses: Callable[[int, int], str] | None = None
    # the files the composition does not build or the engine refuses (the inventory -> why; empty: it builds)
    unmodelled: Callable[[Inventory], list[str]] | None = None
    # the files llama.cpp's loader for the architecture refuses beyond the tensors it requires or never creates
    # (model/required.py): not asked where the graph stands in for ik_llama.cpp's, whose loader differs
    loader_refuses: Callable[[Inventory], list[str]] | None = None


@dataclass(frozen=True)
class Swa:
    """Sliding-window attention as `load_arch_hparams` sets it up (src/models/<arch>.cpp; docs/memory.md, `Traits`)."""

    kind: Literal["standard", "chunked"] = "standard"
    window: int | None = None
    pattern: int = 0
    dense_first: bool = False


# how the engine marks an architecture's recurrent layers and sizes their state (memory/recurrent.py), and which
# layers keep a DSA lightning-indexer K cache (memory/indexer.py): docs/memory.md's `Traits` table says each value
Recurrent = Literal["", "delta_net", "mamba2", "mamba", "kda", "lightning"]
Indexer = Literal["", "all", "full", "typed", "kpool"]


@dataclass(frozen=True)
class Traits:
    """What moeconf's memory model outside the graph reads about an architecture that the GGUF does not carry (the
    engine decides it by the architecture's name): a module's `TRAITS` states what differs from these defaults
    (`archs.traits`; docs/memory.md's `Traits` table says what each field means)."""

    swa: Swa | None = None
    nextn_kv: bool = False
    recurrent: Recurrent = ""
    indexer: Indexer = ""
    flash_attn: bool = True
    nkvo_host_experts: bool = False


# the keys every sliding-window loader reads (memory/geometry.py)
SWA_KEYS = frozenset({"attention.sliding_window", "attention.sliding_window_pattern"})
# the Mamba state's sizes (memory/recurrent.py: ssm.group_count where the loader reads it)
SSM_KEYS = frozenset({"ssm.conv_kernel", "ssm.group_count", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank"})
CHECKED = "llama-fit-params -fitp on (llama.cpp 0.3.36) on sparse full-size layouts"

GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def decoder(spec: Decoder) -> Build:
    def build(g: GraphContext, facts: Facts) -> None:
        c, w, hp = g.ctx, g.w, g.hp
        rms = spec.norm == "rms"
        inp = g.inp_embd()
        pos = g.inp_pos(4 if spec.mrope else 1)
        temp = (g.ctx.input("F32", 1, 1, g.n_tokens, name="inp_attn_scale")
                if spec.temperature and facts.nonzero("attention.temperature_scale") else None)
        iswa = bool(g.cp.n_kv_swa) if spec.iswa is None else spec.iswa
        full, swa = g.attn_inp_kv_iswa() if iswa else (g.attn_inp_kv(), None)
        g.inp_out_ids()
        gating = facts.gating_or(spec.gating) if spec.gating_key else spec.gating
        norm_w = bool(facts.norm_w) if spec.norm_w_key and facts.norm_w is not None else spec.norm_w
        res_scale = spec.granite and "residual_scale" in facts.floats
        clamp = bool(spec.clamp_key) and spec.clamp_key in facts.floats
        for il in range(hp.n_layer):
            res = inp
            cur = g.norm(inp, w.layer(il, "attn_norm"), w.layer(il, "attn_norm", "bias"), il, rms)
            if spec.qk_norm == "full":
                q, k, v = g.qkv(il, cur, clamp=clamp, reshape=False)
                q, k = g.qk_norm(il, q, k)
                T, n_kv = cur.ne[1], hp.n_head_kv[il]
                q, k, v = (c.reshape(q, hp.head_k, hp.n_head[il], T), c.reshape(k, hp.head_k, n_kv, T),
                           c.reshape(v, hp.head_v, n_kv, T))
            else:
                q, k, v = g.qkv(il, cur, clamp=clamp)
                if spec.qk_norm == "head" and w.layer(il, "attn_q_norm") is not None:
                    q, k = g.qk_norm(il, q, k)
            if not spec.rope_swa_only or g.swa_layers.get(il):
                freqs = w.copy("rope_freqs.weight", il)
                q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
            if temp is not None:
                q = c.mul(q, temp)
            if spec.qk_norm == "head_after_rope":
                q, k = g.qk_norm(il, q, k)
            if spec.q_scale:
                q = c.scale(q)
            cur = g.attn(g.attn_inp(il, full, swa), il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"),
                         q, k, v, iswa=iswa)
            if not spec.h_nextn:
                cur, res = g.out_rows(il, cur, res)
            if res_scale:
                cur = c.scale(cur)
            ffn_inp = c.add(cur, res)
            cur = g.norm(ffn_inp, w.layer(il, spec.ffn_norm), w.layer(il, spec.ffn_norm, "bias"), il, rms)
            # a dense layer: build_ffn's SwiGLU over ffn_gate and ffn_up (LLM_FFN_SILU, LLM_FFN_PAR)
            cur = g.layer_ffn(cur, il) if g.dense(il) else moe_shared(g, spec, il, cur, gating, norm_w, facts.w_scale)
            if res_scale:
                cur = c.scale(cur)
            cur = c.add(ffn_inp, cur) if spec.residual_first else c.add(cur, ffn_inp)
            n_deep = hp.n_embd_inp // hp.n_embd - 1 if spec.deepstack and hp.n_embd_inp else 0
            if il < n_deep and g.t_inp_embd is not None:
                t = g.t_inp_embd
                cur = c.add(cur, c.view(t, (hp.n_embd, t.ne[1]), (t.nb[1],), (il + 1) * hp.n_embd * 4))
            inp = cur
        g.output(inp, rows="after" if spec.h_nextn else "", rms=rms,
                 scale=spec.granite and "logit_scale" in facts.floats)

    return build


def moe_shared(g: GraphContext, spec: Decoder, il: int, cur: Tensor, gating: str, norm_w: bool,
               w_scale: float) -> Tensor:
    """build_moe_ffn, then a shared expert (gated where the model has its gate) added to it."""
    c, w = g.ctx, g.w
    moe = g.moe_ffn(cur, il, gating=gating, norm_w=norm_w, w_scale=w_scale, probs_bias=probs_bias(g, il))
    gate_inp = w.layer(il, "ffn_gate_inp_shexp")
    if gate_inp is None or spec.shexp_gate != "silu_div" or w.layer(il, "ffn_up_shexp") is None:
        return g.add_shexp(moe, cur, il)
    logits = g.mm(gate_inp, cur)
    return c.add(moe, c.mul(g.layer_ffn(cur, il, part="_shexp"), c.div(c.unary(logits, "silu"), logits)))


def routed(g: GraphContext, facts: Facts, cur: Tensor, il: int, gating: str = "softmax", *,
           norm_w: bool | None = None, act: str = "silu", clamp: bool = False) -> Tensor:
    """build_moe_ffn as the GGUF's keys set it: the router's function from expert_gating_func (else the architecture's
    `gating`), the chosen weights normalised by expert_weights_norm (unless the architecture fixes `norm_w`) and
    scaled by expert_weights_scale, the selection bias where the layer has one."""
    return g.moe_ffn(cur, il, gating=facts.gating_or(gating), norm_w=bool(facts.norm_w) if norm_w is None else norm_w,
                     w_scale=facts.w_scale, act=act, probs_bias=probs_bias(g, il), clamp=clamp)


def probs_bias(g: GraphContext, il: int) -> Tensor | None:
    """The expert selection bias: `blk.N.exp_probs_b.bias`, or `blk.N.exp_probs_b` where the loader names
    it without a suffix (src/models/hy-v3.cpp)."""
    return g.w.layer(il, "exp_probs_b", "bias") or g.w.get(f"blk.{il}.exp_probs_b")


def hybrid_inputs(g: GraphContext, k_only: bool = False) -> tuple[Tensor, RsInput, AttnInput]:
    """The embeddings, then build_inp_mem_hybrid's inputs (build_inp_mem_hybrid_k's where `k_only`): the recurrent
    states' indices, then the KV cache's (the latent K-only cache's)."""
    return g.inp_embd(), g.rs_inp(), g.attn_inp_k() if k_only else g.attn_inp_kv()


def _unchecked(inv: Inventory, what: str) -> str:
    """The refusal of a file whose graph takes a branch the loader allows and no recorded dump checked."""
    return (f"memory is not modelled for this {inv.arch} file: {what}, a graph no recorded dump checked; measure it "
            "with llama.cpp's llama-fit-params -fitp on")


def _blocks_lacking(inv: Inventory, has: str, needs: tuple[str, ...],
                    skip: Collection[int] = ()) -> dict[str, list[int]]:
    """Each of `blk.N.{needs}` (tensor names after the block prefix) -> the trunk blocks, but those in `skip`,
    that have `blk.N.{has}.weight` without it (the MTP blocks are not run)."""
    names, nextn = {t.name for t in inv.tensors}, set(inv.layers_of_kind("nextn"))
    blocks: dict[str, list[int]] = {}
    for il in sorted({t.layer for t in inv.tensors if t.layer is not None and t.layer not in nextn
                      and t.layer not in skip and t.name == f"blk.{t.layer}.{has}.weight"}):
        for n in needs:
            if f"blk.{il}.{n}" not in names:
                blocks.setdefault(n, []).append(il)
    return blocks


def blocks_without(has: str, needs: tuple[str, ...], why: str) -> Callable[[Inventory], list[str]]:
    """A composition's `Memory.unmodelled`: the refusal of a file whose blocks have `blk.N.{has}.weight` without
    one of `blk.N.{needs}` (`_blocks_lacking`), a branch the loader allows (the tensor optional) that no recorded
    dump checked, `why` saying what the engine runs there; empty where every such trunk block has them all."""
    return lambda inv: [_unchecked(inv, f"block(s) {il} have {has} without {n} ({why})")
                        for n, il in _blocks_lacking(inv, has, needs).items()]


def older_mla(inv: Inventory) -> list[str]:
    """The refusal of MLA blocks with attn_kv_b in place of attn_k_b and attn_v_b, an older conversion the
    pinned llama.cpp crashes on (docs/memory.md, "The engine's graph": files no recorded dump checked)."""
    v_b = {t.layer for t in inv.tensors if t.layer is not None and t.name == f"blk.{t.layer}.attn_v_b.weight"}
    blocks = _blocks_lacking(inv, "attn_kv_b", ("attn_k_b.weight",), skip=v_b).get("attn_k_b.weight")
    if not blocks:
        return []
    return [f"memory is not modelled for this {inv.arch} file: block(s) {blocks} have attn_kv_b without attn_k_b "
            f"(an older conversion), which the pinned llama.cpp's {inv.arch} graph does not run (it crashes building "
            "the graph); reconvert it with a current convert_hf_to_gguf.py, which writes attn_k_b and attn_v_b"]


def mla_forms(inv: Inventory) -> list[str]:
    """The refusal of blocks with attn_kv_b beside attn_k_b or attn_v_b, which the loader refuses; empty where
    none has both (docs/memory.md, "The engine's graph": files no recorded dump checked)."""
    names = {t.name for t in inv.tensors}
    beside: dict[tuple[str, ...], list[int]] = {}
    for il in sorted({t.layer for t in inv.tensors if t.layer is not None and t.name.endswith(".attn_kv_b.weight")}):
        both = tuple(n for n in ("attn_k_b", "attn_v_b") if f"blk.{il}.{n}.weight" in names)
        if both:
            beside.setdefault(both, []).append(il)
    return [f"llama.cpp refuses to load this {inv.arch} file: block(s) {il} have attn_kv_b beside "
            f"{' and '.join(both)}; its loader creates a block's attn_kv_b or its attn_k_b and attn_v_b, never both, "
            "so the file holds tensors it never loads and it stops (done_getting_tensors: \"wrong number of "
            "tensors\"); keep one form: attn_k_b and attn_v_b as a current convert_hf_to_gguf.py writes them, or "
            "attn_kv_b alone" for both, il in beside.items()]


# the `.scale` tensors a loader creates of its own (not NVFP4's) that the recorded dumps checked: Gemma 4's
# router input scale and per-expert output scale
OWN_SCALES: dict[str, frozenset[str]] = {"gemma4": frozenset({"ffn_gate_inp", "ffn_down_exps"})}


def unchecked_scales(inv: Inventory) -> list[str]:
    """The refusal of per-tensor `NAME.scale` tensors but the architecture's own (`OWN_SCALES`); empty where the
    file has none (docs/memory.md, "The engine's graph": files no recorded dump checked)."""
    own = OWN_SCALES.get(inv.arch, frozenset())
    scaled = sorted({t.name.removeprefix(f"blk.{t.layer}.").removesuffix(".scale") for t in inv.tensors
                     if t.name.endswith(".scale")} - own)
    return [f"memory is not modelled for this {inv.arch} file: it has per-tensor scales ({', '.join(scaled)}: "
            "an NVFP4 conversion's .scale tensors), which multiply each projection's result in a graph no "
            "recorded dump checked; measure it with llama.cpp's llama-fit-params -fitp on"] if scaled else []


def unchecked_ffn_biases(inv: Inventory) -> list[str]:
    """The refusal of a dense FFN's or shared expert's biases (`blk.N.ffn_up.bias`...); empty where the file has
    none (docs/memory.md, "The engine's graph": files no recorded dump checked)."""
    parts = {f"ffn_{p}{s}" for p in ("up", "gate", "down") for s in ("", "_shexp")}
    blocks = sorted({t.layer for t in inv.tensors if t.layer is not None
                     and t.name.removeprefix(f"blk.{t.layer}.").removesuffix(".bias") in parts
                     and t.name.endswith(".bias")})
    why = f"block(s) {blocks} have FFN biases (ffn_up/gate/down.bias: an MLP with biases)"
    return [_unchecked(inv, why)] if blocks else []


def unchecked_fused_qkv_bias(inv: Inventory) -> list[str]:
    """The refusal of a fused attn_qkv with a bias, its own or Q's, K's and V's apart (docs/memory.md, "The
    engine's graph": files no recorded dump checked)."""
    names = {t.name for t in inv.tensors}
    blocks = sorted({t.layer for t in inv.tensors if t.layer is not None and t.name == f"blk.{t.layer}.attn_qkv.weight"
                     and any(f"blk.{t.layer}.attn_{p}.bias" in names for p in ("qkv", "q", "k", "v"))})
    return [_unchecked(inv, f"block(s) {blocks} have a fused attn_qkv with a bias (attn_qkv.bias, or attn_q/k/v.bias "
                            "beside it: a legacy or custom file)")] if blocks else []


def need(t: Tensor | None) -> Tensor:
    """A weight the graph reads (`w.get`, `w.layer`, `w.copy` just before): a file without it is refused
    (`MissingTensor`, named by that lookup). Not for what the composition builds itself (`built`)."""
    if t is None:
        raise MissingTensor(None)
    return t


def built(t: Tensor | None) -> Tensor:
    """An input or result the composition built itself (not a weight): None is moeconf's own bug."""
    assert t is not None
    return t
