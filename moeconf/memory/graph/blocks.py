"""llama.cpp's graph blocks (`llm_graph_context`, src/llama-graph.cpp, and the KV cache's views,
src/llama-kv-cache.cpp) emitting the tensors the engine's blocks emit, in the order they expand them
into the graph, and the steps every src/models/*.cpp repeats (docs/memory.md lists them). An
architecture composes them (`archs`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from moeconf.memory.graph.ggml import OUTPUT, CGraph, Ctx, Tensor, is_contiguous, nelements, row_size
from moeconf.memory.rshape import RecurrentShape

# the GLU op of each gated activation (build_ffn, build_moe_ffn; any other: REGLU)
GLU = {"silu": "swiglu", "gelu": "geglu", "swiglu_oai": "swiglu_oai", "silu_clamp": "swiglu_clamp", "relu": "reglu"}
GLU_ONLY = ("swiglu_oai", "silu_clamp")  # build_moe_ffn runs these as one GLU op whether or not the experts have a gate


def rotation_width(n: int) -> int:
    """llama_kv_cache::build_input_k_rot's Hadamard side for a row n wide: the largest power of two
    from 64 dividing it."""
    side = 64
    while n % (side * 2) == 0:
        side *= 2
    return side


@dataclass(frozen=True)
class Hparams:
    n_embd: int
    n_layer: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: int
    head_v: int
    n_expert: int = 0
    n_expert_used: int = 0
    n_embd_inp: int = 0  # 0: n_embd
    embedding_scale: float = 0.0
    # per-layer head widths where layers differ (the sliding-window layers' key_length_swa): else head_k/head_v
    head_k_l: tuple[int, ...] = ()
    head_v_l: tuple[int, ...] = ()

    def hk(self, il: int) -> int:
        return self.head_k_l[il] if 0 <= il < len(self.head_k_l) else self.head_k

    def hv(self, il: int) -> int:
        return self.head_v_l[il] if 0 <= il < len(self.head_v_l) else self.head_v


@dataclass(frozen=True)
class Cparams:
    """The context's settings the graph depends on (`model.Setup`: llama.cpp's worst-case reserve)."""

    n_tokens: int  # the ubatch reserved
    n_outputs: int
    n_kv: int  # KV cells the mask spans (per stream)
    n_kv_swa: int = 0  # the sliding-window cache's cells per stream (0: none)
    n_stream: int = 1
    n_seq: int = 1  # n_seq_max: the sequences the context serves (ubatch_reserve splits the ubatch among them)
    flash_attn: bool = True
    offload_kqv: bool = True
    cache_k: str = "f16"
    cache_v: str = "f16"
    pipeline: bool = False
    op_offload: bool = True
    norm_pins: bool = False  # the norms' and -nkvo's pins kept (docs/memory.md, "The graph blocks")
    fa_auto: bool = False  # -fa auto: the engine resolves it per placement (`model.fa_auto_off`)
    v_flat: bool = False  # the V cache laid out for flash attention, run without (docs/memory.md, "The graph blocks")
    n_rs: int = 1  # the recurrent states' rows (-np: the sequences kept; 1 without recurrent layers)
    unfused: frozenset[str] = frozenset()  # fused ops turned off, built unfused (docs/memory.md, "The graph blocks")
    # what the graph's prologue derives from the placement and the caches' head widths (`model._prologue`):
    rot_k: int = 0  # Hadamard rotation sides (0: none)
    rot_v: int = 0
    rot_k_swa: int = 0  # the sliding-window cache's (its own head width's)
    rot_v_swa: int = 0
    full_offload: bool = False  # -ngl above the layer count: the norms pinned to their layer's device

    @property
    def v_trans(self) -> bool:
        """The V cache is transposed (llama_kv_cache's v_trans: created without flash attention)."""
        return not (self.flash_attn or self.v_flat)


@dataclass(frozen=True)
class Mla:
    """DeepSeek's attention dimensions: the per-head Q/K width (nope + rope) and V width, the RoPE
    part, the KV latent rank, and whether the GGUF asks for the absorbed form (key_length_mla)."""

    head_k: int = 0
    head_v: int = 0
    rope: int = 0
    kv_lora_rank: int = 0
    absorbed: bool = False


@dataclass
class AttnInput:
    k_idxs: Tensor
    v_idxs: Tensor
    mask: Tensor
    k_rot: Tensor | None
    v_rot: Tensor | None
    n_kv: int  # the cells its cache's views span


class MissingTensor(Exception):
    """The graph reads a weight the file lacks: the estimate and the traffic refuse it (docs/memory.md, "The graph
    blocks")."""

    def __init__(self, name: str | None) -> None:
        super().__init__(name or "a weight")
        self.name = name


@dataclass
class Weights:
    """The weights as graph leafs by GGUF name (absent: None); `missed`: the last absent one asked for (a nameless
    MissingTensor's)."""

    by_name: dict[str, Tensor]
    missed: str | None = None

    def get(self, name: str) -> Tensor | None:
        t = self.by_name.get(name)
        if t is None:
            self.missed = name
        return t

    def layer(self, il: int, base: str, suffix: str = "weight") -> Tensor | None:
        return self.get(f"blk.{il}.{base}.{suffix}")

    def copy(self, name: str, il: int) -> Tensor | None:
        """Layer il's copy of a tensor the loader duplicates per layer (docs/memory.md, "The graph blocks")."""
        return self.by_name.get(f"{name}#{il}") or self.get(name)


@dataclass
class RsInput:
    """llm_graph_input_rs: the views of the state copy indices."""

    main: Tensor
    extra: Tensor
    n_rs: int
    n_seqs: int


@dataclass
class GraphContext:
    """One graph build: the context, the graph, the model's weights and KV cache tensors, and the
    backends the callback pins tensors to (`pinned`: tensor -> backend index)."""

    hp: Hparams
    cp: Cparams
    w: Weights
    kv: dict[int, tuple[Tensor, Tensor]]  # layer -> (K cache, V cache)
    layer_backend: dict[int, int]  # layer -> backend index of its home device
    cpu_backend: int
    ctx: Ctx = field(default_factory=Ctx)
    gf: CGraph = field(default_factory=CGraph)
    pinned: dict[Tensor, int] = field(default_factory=dict)
    groups: tuple[int, int] = (0, 0)  # expert groups and groups used
    t_inp_embd: Tensor | None = None  # the input embeddings as the graph reads them (res->t_inp_embd)
    t_inp_tokens: Tensor | None = None  # the token ids input (res->t_inp_tokens)
    t_out_ids: Tensor | None = None  # the output rows' ids (build_inp_out_ids)
    swa_layers: dict[int, bool] = field(default_factory=dict)  # layer -> in the sliding-window cache
    mla: Mla = field(default_factory=Mla)
    kq_softcap: bool = False  # build_attn_mha's KQ soft-cap, no flash attention (docs/memory.md, "The graph blocks")
    rs: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # layer -> (conv state, recurrent state)
    rec: RecurrentShape | None = None  # the gated delta-net's sizes (ssm.* keys)
    lid: dict[int, Tensor] = field(default_factory=dict)  # layer -> the DSA indexer's K cache
    lid_rot: int = 0  # the Hadamard rotation's side the indexer's Q and K go through (0: none)
    # the fused ops built, as the graph result records them for resolve_fused_ops: (op, node, layer)
    fused: list[tuple[str, Tensor, int]] = field(default_factory=list)
    unweighted: set[int] = field(default_factory=set)  # layers of weightless norms (docs/memory.md, "The graph blocks")

    @property
    def n_tokens(self) -> int:
        return self.cp.n_tokens

    def expand(self, t: Tensor) -> None:
        self.gf.expand(t)

    def cb(self, t: Tensor, name: str, il: int) -> None:
        t.name = f"{name}-{il}" if il >= 0 else name
        if (self.n_tokens < 32 or self.cp.full_offload) and il != -1 and name in ("norm", "l_last"):
            self.pinned[t] = self.layer_backend.get(il, self.cpu_backend)

    # -- inputs
    def inp_embd(self, scale: bool = False) -> Tensor:
        """build_inp_embd: the token rows of token_embd, scaled where the model's embedding_scale or the
        architecture (`scale`) says."""
        c = self.ctx
        tok_embd = self.w.get("token_embd.weight")
        if tok_embd is None:
            raise MissingTensor("token_embd.weight")
        n_inp = self.hp.n_embd_inp or self.hp.n_embd
        tokens = self.t_inp_tokens = c.input("I32", self.n_tokens, name="inp_tokens")
        embd = c.input("F32", n_inp, self.n_tokens, name="inp_embd")
        cur = c.get_rows(tok_embd, tokens)
        if n_inp != self.hp.n_embd:
            cur = c.pad(cur, n_inp - self.hp.n_embd)
        self.expand(cur)  # ggml_build_forward_select: both paths in the graph, the token path first
        self.expand(embd)
        if n_inp != self.hp.n_embd:
            cur = c.view(cur, (self.hp.n_embd, self.n_tokens), (cur.nb[1],), 0)
        self.t_inp_embd = cur
        if scale or self.hp.embedding_scale:
            cur = c.scale(cur)
        cur.name = cur.name or "embd"
        self.expand(cur)
        return cur

    def rs_inp(self) -> RsInput:
        """build_rs_inp: the state copy indices, viewed as the ubatch's sequences and the rest (every state row
        read, docs/memory.md, "The graph blocks")."""
        c = self.ctx
        n_rs = n_seqs = self.cp.n_rs
        s_copy = c.input("I32", n_rs, name="rs_s_copy")
        return RsInput(c.view(s_copy, (n_seqs,), (), 0),
                       c.view(s_copy, (n_rs - n_seqs,), (), n_seqs * s_copy.nb[0]), n_rs, n_seqs)

    def rs_states(self, inp: RsInput, s: Tensor, state_size: int,
                  rows: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
        """build_rs: the cleared state (in place), the sequences' states gathered (by `rows`, the
        caller's get_state_rows, where given: Mamba's scan reads them itself), the others copied back."""
        c = self.ctx
        states = c.reshape(s, state_size, s.ne[1])
        self.expand(c.inplace("SCALE", c.view(states, (state_size,), (), 0)))
        out = rows(states, inp.main) if rows is not None else c.get_rows(states, inp.main)
        self.expand(out)
        extra = c.get_rows(states, inp.extra)
        self.expand(c.cpy(extra, c.view(s, (state_size, inp.n_rs - inp.n_seqs), (s.nb[1],), inp.n_seqs * s.nb[1])))
        return out

    def inp_pos(self, per_embd: int = 1) -> Tensor:
        return self.ctx.input("I32", self.n_tokens * per_embd, name="inp_pos")

    def inp_out_ids(self) -> Tensor:
        self.t_out_ids = self.ctx.input("I32", self.cp.n_outputs, name="out_ids")
        return self.t_out_ids

    def inputs(self, iswa: bool = False, scale: bool = False) -> tuple[Tensor, Tensor, AttnInput, AttnInput | None]:
        """The embeddings, the positions, the KV cache's inputs (the full cache's and, where `iswa`, the window's),
        then the output ids (not returned), in the order most src/models/*.cpp make them."""
        inp, pos = self.inp_embd(scale), self.inp_pos()
        full, swa = self.attn_inp_kv_iswa() if iswa else (self.attn_inp_kv(), None)
        self.inp_out_ids()
        return inp, pos, full, swa

    def out_rows(self, il: int, cur: Tensor, res: Tensor) -> tuple[Tensor, Tensor]:
        """The last layer keeps only the output rows (inp_out_ids) of its output and of its residual."""
        if il != self.hp.n_layer - 1:
            return cur, res
        ids = self.t_out_ids
        assert ids is not None
        return self.ctx.get_rows(cur, ids), self.ctx.get_rows(res, ids)

    def attn_inp(self, il: int, full: AttnInput, swa: AttnInput | None) -> AttnInput:
        """The layer's cache inputs: the sliding window's on its windowed layers, else the full cache's."""
        return swa if swa is not None and self.swa_layers.get(il) else full

    def kq_mask(self, n_kv: int, f16: bool = False) -> Tensor:
        """A cache's KQ mask input: n_kv cells by each stream's tokens (F16 for flash attention or where `f16`)."""
        cp = self.cp
        return self.ctx.input("F16" if cp.flash_attn or f16 else "F32", n_kv, self.n_tokens // cp.n_stream, 1,
                              cp.n_stream, name="attn_inp_kq_mask")

    def rot_input(self, n: int, v: bool = False) -> Tensor | None:
        """A cache's Hadamard rotation input (n by n; none where n is 0): K's, or V's (`v`)."""
        return self.ctx.input("F32", n, n, name="attn_inp_v_rot" if v else "attn_inp_k_rot") if n else None

    def _kv_inputs(self, n_kv: int, rot_k: int, rot_v: int) -> AttnInput:
        """A K/V cache's store indices (V's one per element where V is stored transposed, as wide as the
        widest layer's row), its mask and its rotations."""
        c = self.ctx
        k_idxs = c.input("I64", self.n_tokens, name="attn_inp_k_idxs")
        v_width = max((self.hp.n_head_kv[il] * self.hp.hv(il) for il in self.kv), default=0)
        v_idxs = c.input("I64", self.n_tokens * (v_width if self.cp.v_trans else 1), name="attn_inp_v_idxs")
        return AttnInput(k_idxs, v_idxs, self.kq_mask(n_kv), self.rot_input(rot_k), self.rot_input(rot_v, v=True),
                         n_kv)

    def attn_inp_kv(self) -> AttnInput:
        """build_attn_inp_kv (one cache of the context's cells)."""
        return self._kv_inputs(self.cp.n_kv, self.cp.rot_k, self.cp.rot_v)

    def attn_inp_k(self, n_kv: int = 0) -> AttnInput:
        """build_attn_inp_k: a K-only cache (MLA's latent): its indices and mask (over `n_kv` cells where
        given: a sliding window's, else the context's)."""
        n_kv = n_kv or self.cp.n_kv
        k_idxs = self.ctx.input("I64", self.n_tokens, name="attn_inp_k_idxs")
        return AttnInput(k_idxs, k_idxs, self.kq_mask(n_kv), None, None, n_kv)

    def attn_k(self, inp: AttnInput, il: int, wo: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
               v_mla: Tensor | None, mask: Tensor | None = None, sinks: Tensor | None = None) -> Tensor:
        """build_attn with a K-only cache: V a view of K's first columns, decompressed by `v_mla`; through
        `mask` where given (DSA's sparse one), else the input's; with per-head `sinks` where given (Hy4)."""
        c = self.ctx
        for t in (q, v, k):
            self.expand(t)
        kc, _ = self.kv[il]
        self.expand(self._cpy_k(kc, k, inp.k_idxs))
        kview = self._get_k(kc, il, inp.n_kv)
        vview = c.view(kview, (v.ne[0], kview.ne[1], kview.ne[2], kview.ne[3]),
                       (kview.nb[1], kview.nb[2], kview.nb[3]), 0)
        cur = self.attn_mha(q, kview, vview, inp.mask if mask is None else mask, sinks, v_mla)
        return self.mm(wo, cur) if wo is not None else cur

    def attn_inp_kv_iswa(self) -> tuple[AttnInput, AttnInput]:
        """build_attn_inp_kv_iswa: the full cache's inputs and the sliding window's."""
        return self.attn_inp_kv(), self._kv_inputs(self.cp.n_kv_swa, self.cp.rot_k_swa, self.cp.rot_v_swa)

    # -- norms, projections
    def _need(self, il: int, base: str) -> Tensor:
        t = self.w.layer(il, base)
        if t is None:
            raise MissingTensor(f"blk.{il}.{base}.weight")
        return t

    def mm(self, w: Tensor, cur: Tensor) -> Tensor:
        """build_lora_mm (no adapters: memory refuses them; nor NVFP4's scales: archs/common.unchecked_scales)."""
        return self.ctx.mul_mat(w, cur)

    def linear(self, w: Tensor, b: Tensor | None, cur: Tensor) -> Tensor:
        """`mm`, plus the bias where there is one."""
        cur = self.mm(w, cur)
        return self.ctx.add(cur, b) if b is not None else cur

    def norm(self, cur: Tensor, w: Tensor | None, b: Tensor | None, il: int, rms: bool = True) -> Tensor:
        """build_norm: RMS (or layer) norm, times the weight (else recorded `unweighted`), plus any bias."""
        c = self.ctx
        if w is None:
            self.unweighted.add(il)
        cur = c.rms_norm(cur) if rms else c.norm(cur)
        if w is not None or b is not None:
            self.cb(cur, "norm", il)
        if w is not None:
            cur = c.mul(cur, w)
        if b is not None:
            cur = c.add(cur, b)
        return cur

    def qk_norm(self, il: int, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Q and K normed per head by the layer's attn_q_norm and attn_k_norm."""
        w = self.w
        return self.norm(q, w.layer(il, "attn_q_norm"), None, il), self.norm(k, w.layer(il, "attn_k_norm"), None, il)

    def qkv(self, il: int, cur: Tensor, n_head: int = 0, n_head_kv: int = 0, head_k: int = 0, head_v: int = 0,
            clamp: bool = False, reshape: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """build_qkv: a fused QKV projection (views of it) or separate Q, K, V (each + bias, clamped where the
        model clamps them), reshaped per head unless `reshape` is False (the layer's heads, the model's widths,
        unless given)."""
        c, w, hp = self.ctx, self.w, self.hp
        n_head, n_head_kv = n_head or hp.n_head[il], n_head_kv or hp.n_head_kv[il]
        head_k, head_v = head_k or hp.head_k, head_v or hp.head_v
        T = cur.ne[1]
        wqkv = w.layer(il, "attn_qkv")
        if wqkv is not None:
            qkv = self.linear(wqkv, w.layer(il, "attn_qkv", "bias"), cur)
            if clamp:
                qkv = c.clamp(qkv)
            rs = row_size(qkv.type, 1)
            q = c.view(qkv, (head_k, n_head, T), (rs * head_k, qkv.nb[1]), 0)
            k = c.view(qkv, (head_k, n_head_kv, T), (rs * head_k, qkv.nb[1]), rs * head_k * n_head)
            v = c.view(qkv, (head_v, n_head_kv, T), (rs * head_v, qkv.nb[1]), rs * head_k * (n_head + n_head_kv))
            return q, k, v
        q, k, v = (self.linear(self._need(il, base), w.layer(il, base, "bias"), cur)
                   for base in ("attn_q", "attn_k", "attn_v"))
        if not reshape:
            return q, k, v
        if clamp:
            q, k, v = c.clamp(q), c.clamp(k), c.clamp(v)
        return c.reshape(q, head_k, n_head, T), c.reshape(k, head_k, n_head_kv, T), c.reshape(v, head_v, n_head_kv, T)

    # -- MLA (src/models/deepseek2.cpp and the compositions after it)
    def mla_q(self, il: int, cur: Tensor) -> Tensor:
        """MLA's query: the low-rank one (attn_q_a, its norm, attn_q_b) or a plain attn_q (the lite models)."""
        q_a = self.w.layer(il, "attn_q_a")
        if q_a is None:
            return self.mm(self._need(il, "attn_q"), cur)
        q = self.norm(self.mm(q_a, cur), self.w.layer(il, "attn_q_a_norm"), None, il)
        return self.mm(self._need(il, "attn_q_b"), q)

    def mla_kv(self, il: int, cur: Tensor, rank: int = 0, rope: int = 0) -> tuple[Tensor, Tensor]:
        """The compressed KV (`rank` wide, normed by attn_kv_a_norm) and the shared rope key (`rope` wide,
        one head): views of one projection, attn_kv_a_mqa (the widths the model's MLA ones unless given)."""
        c = self.ctx
        rank, rope, T = rank or self.mla.kv_lora_rank, rope or self.mla.rope, cur.ne[1]
        kv_pe = self.mm(self._need(il, "attn_kv_a_mqa"), cur)
        row = kv_pe.nb[1]
        kv = self.norm(c.view(kv_pe, (rank, T), (row,), 0), self.w.layer(il, "attn_kv_a_norm"), None, il)
        return kv, c.view(kv_pe, (rope, 1, T), (row, row), row_size(kv_pe.type, rank))

    def mla_q_parts(self, q: Tensor, n_head: int, nope: int = 0, rope: int = 0) -> tuple[Tensor, Tensor]:
        """Q's per-head nope and rope parts, views of its nope + rope wide heads (the model's widths unless given)."""
        c = self.ctx
        rope = rope or self.mla.rope
        nope = nope or self.mla.head_k - rope
        rq, T = row_size(q.type, nope + rope), q.ne[1]
        return (c.view(q, (nope, n_head, T), (rq, rq * n_head), 0),
                c.view(q, (rope, n_head, T), (rq, rq * n_head), row_size(q.type, nope)))

    def mla_absorbed(self, il: int, q_nope: Tensor, q_pe: Tensor, kv_cmpr: Tensor,
                     k_pe: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The absorbed form's query (Q's nope part through attn_k_b, then its rope part), key (the latent,
        then the rope key) and the latent per token (V's source in the K-only cache)."""
        c = self.ctx
        absorbed = c.permute(c.mul_mat(self._need(il, "attn_k_b"), c.permute(q_nope, 0, 2, 1, 3)), 0, 2, 1, 3)
        q = c.concat(absorbed, q_pe, 0)
        kv = c.reshape(kv_cmpr, kv_cmpr.ne[0], 1, kv_cmpr.ne[1])
        return q, c.concat(kv, k_pe, 0), kv

    # -- attention through the KV cache
    def _hadamard(self, cur: Tensor, rot: Tensor) -> Tensor:
        c = self.ctx
        n = rot.ne[0]
        n_rows = nelements(cur) // n
        res = c.cont(cur, n, n_rows) if not is_contiguous(cur) else c.reshape(cur, n, n_rows)
        res = c.mul_mat(rot, res)
        return c.reshape(res, *cur.ne)

    def attn(self, inp: AttnInput, il: int, wo: Tensor | None, wo_b: Tensor | None, q: Tensor, k: Tensor,
             v: Tensor, sinks: Tensor | None = None, iswa: bool = False) -> Tensor:
        """build_attn with a KV cache (llm_graph_input_attn_kv; `iswa`: the sliding-window pair's form,
        which expands K before V)."""
        c = self.ctx
        q, kview, vview = self.store_kv(inp, il, q, k, v, iswa)
        cur = self.attn_mha(q, kview, vview, inp.mask, sinks)
        if inp.v_rot is not None:
            cur = self._hadamard(cur, inp.v_rot)
        if wo is not None:
            cur = self.mm(wo, cur)
        if wo_b is not None:
            cur = c.add(cur, wo_b)
        return cur

    def store_kv(self, inp: AttnInput, il: int, q: Tensor, k: Tensor, v: Tensor,
                 iswa: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """build_attn's first half: Q, K, V rotated where the cache rotates, expanded (K before V in the iSWA form),
        K and V stored into the layer's cache; Q and the cache views the attention reads."""
        if inp.k_rot is not None:
            q = self._hadamard(q, inp.k_rot)
            k = self._hadamard(k, inp.k_rot)
        if inp.v_rot is not None:
            v = self._hadamard(v, inp.v_rot)
        for t in (q, k, v) if iswa else (q, v, k):
            self.expand(t)
        kc, vc = self.kv[il]
        self.expand(self._cpy_k(kc, k, inp.k_idxs))
        self.expand(self._cpy_v(vc, v, inp.v_idxs))
        return q, self._get_k(kc, il, inp.n_kv), self._get_v(vc, il, inp.n_kv)

    def _cpy_k(self, kc: Tensor, k: Tensor, idxs: Tensor) -> Tensor:
        c = self.ctx
        n_gqa = k.ne[0] * k.ne[1]
        view = c.view(k, (n_gqa, k.ne[2]), (k.nb[2],), 0)
        if kc.ne[2] > 1:
            kc = c.reshape(kc, n_gqa, kc.ne[1] * kc.ne[2])
        return c.set_rows(kc, view, idxs)

    def _cpy_v(self, vc: Tensor, v: Tensor, idxs: Tensor) -> Tensor:
        if not self.cp.v_trans:
            return self._cpy_k(vc, v, idxs)
        c = self.ctx
        n_gqa = v.ne[0] * v.ne[1]
        contiguous = row_size(v.type, n_gqa) == v.nb[2]
        flat = c.reshape(v, n_gqa, v.ne[2]) if contiguous else c.cont(v, n_gqa, v.ne[2])
        if n_gqa < vc.ne[0]:
            flat = c.pad(flat, vc.ne[0] - n_gqa)
        vv = c.reshape(vc, 1, nelements(vc))
        flat = c.reshape(flat, 1, nelements(flat))
        return c.set_rows(vv, flat, idxs)

    def _get_k(self, kc: Tensor, il: int, n_kv: int, head: int = 0) -> Tensor:
        """llama_kv_cache::get_k (and get_v of an untransposed V: `head` its width, else K's)."""
        hp = self.hp
        gqa, t, head = kc.ne[0], kc.type, head or hp.hk(il)
        return self.ctx.view(kc, (head, hp.n_head_kv[il], n_kv, kc.ne[2]),
                             (row_size(t, head), row_size(t, gqa), row_size(t, gqa * kc.ne[1])), 0)

    def get_k_one(self, kc: Tensor, n_kv: int) -> Tensor:
        """llama_kv_cache::get_k of a K-only cache of one head (MLA's latent, an indexer's keys)."""
        rs = row_size(kc.type, kc.ne[0])
        return self.ctx.view(kc, (kc.ne[0], 1, n_kv, kc.ne[2]), (rs, rs, rs * kc.ne[1]), 0)

    def _get_v(self, vc: Tensor, il: int, n_kv: int) -> Tensor:
        hp = self.hp
        gqa, size, t, hv = vc.ne[0], vc.ne[1], vc.type, hp.hv(il)
        if not self.cp.v_trans:
            return self._get_k(vc, il, n_kv, hv)
        return self.ctx.view(vc, (n_kv, hp.n_head_kv[il], hv, vc.ne[2]),
                             (row_size(t, size * hv), row_size(t, size), row_size(t, size * gqa)), 0)

    def top_k_mask(self, mask: Tensor, top_k: Tensor, zeros: str = "F32") -> Tensor:
        """build_attn's sparse form (DSA): `mask`, open only where each token chose (`top_k`; `zeros`: the
        type of the rows that open them, docs/memory.md, "The graph blocks")."""
        c = self.ctx
        every = c.fill(mask)
        every = c.view(every, (1, every.ne[0], every.ne[1], every.ne[3]), (every.nb[0], every.nb[1], every.nb[2]), 0)
        ne, nb = top_k.ne, top_k.nb
        idx = c.view(top_k, (ne[0], ne[1], ne[3], 1), (nb[1], nb[2], ne[3] * nb[3]), 0)
        chosen = c.set_rows(every, c.fill(c.new(zeros, 1, idx.ne[0], idx.ne[1], idx.ne[2])), idx)
        chosen = c.view(chosen, (chosen.ne[1], chosen.ne[2], 1, chosen.ne[3]),
                        (chosen.nb[2], chosen.nb[3], chosen.nb[3]), 0)
        return c.add(chosen, mask)

    def gate_heads(self, cur: Tensor, gate: Tensor, n_head: int) -> Tensor:
        """The attention's output scaled per head by one gate value each (`gate`: heads by tokens)."""
        c = self.ctx
        hv, T = cur.ne[0] // n_head, cur.ne[1]
        return c.reshape(c.mul(c.reshape(cur, hv, n_head, T), c.reshape(gate, 1, n_head, T)), hv * n_head, T)

    def attn_mha(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor | None,
                 v_mla: Tensor | None = None) -> Tensor:
        c = self.ctx
        v_trans = v.nb[1] > v.nb[2]
        ns = k.ne[3]
        q = c.view(q, (q.ne[0], q.ne[1], q.ne[2] // ns, ns), (q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // ns)), 0)
        q, k, v = (c.permute(t, 0, 2, 1, 3) for t in (q, k, v))
        if self.cp.flash_attn:
            if v_trans:
                v = c.transpose(v)
            cur = c.flash_attn_ext(q, k, v, mask)
            if sinks is not None:
                cur.src.append(sinks)
            if v_mla is not None:
                cur = c.cont(c.permute(c.mul_mat(v_mla, c.permute(cur, 0, 2, 1, 3)), 0, 2, 1, 3))
            cur = c.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = c.mul_mat(k, q)
            if self.kq_softcap:
                kq = c.scale(c.unary(c.scale(kq), "tanh"))
            kq = c.soft_max(kq, mask)
            if sinks is not None:
                kq.src.append(sinks)
            if not v_trans:
                v = c.cont(c.transpose(v))
            kqv = c.mul_mat(v, kq)
            if v_mla is not None:
                kqv = c.mul_mat(v_mla, kqv)
            cur = c.permute(kqv, 0, 2, 1, 3)
            cur = c.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
            if not self.cp.offload_kqv and self.cp.norm_pins:
                self.pinned[cur] = self.cpu_backend
        self.expand(cur)
        return cur

    # -- feed-forward
    def layer_ffn(self, cur: Tensor, il: int, act: str = "silu", part: str = "", clamp: bool = False,
                  linear: bool = True) -> Tensor:
        """build_ffn (LLM_FFN_PAR) with the layer's own up, gate and down projections (`part` "_shexp": its shared
        expert's); `clamp` and `linear` as `activation`'s (docs/memory.md, "The graph blocks")."""
        up, gate, down = (self.w.layer(il, f"ffn_{p}{part}") for p in ("up", "gate", "down"))
        tmp = self.mm(up, cur) if up is not None else cur
        cur = self.mm(gate, cur) if gate is not None else tmp
        cur = self.activation(cur, tmp, gate is not None, act, clamp, linear)
        return self.mm(down, cur) if down is not None else cur

    def dense(self, il: int) -> bool:
        """The layer has no router: its FFN is dense (the leading dense layers)."""
        return self.w.layer(il, "ffn_gate_inp") is None

    def ffn_input(self, il: int, cur: Tensor, res: Tensor, rows: bool = True,
                  norm: str = "ffn_norm") -> tuple[Tensor, Tensor]:
        """The attention's residual added (the last layer's output rows taken first unless `rows` is False)
        and the FFN norm (`norm`, its tensor): the FFN's residual (ffn_inp) and its normed input."""
        if rows:
            cur, res = self.out_rows(il, cur, res)
        ffn_inp = self.ctx.add(cur, res)
        return ffn_inp, self.norm(ffn_inp, self.w.layer(il, norm), None, il)

    def add_shexp(self, moe: Tensor, cur: Tensor, il: int, act: str = "silu", clamp: bool = False,
                  linear: bool = True) -> Tensor:
        """The routed experts' output plus the shared expert's on the same input, where the layer has one."""
        if self.w.layer(il, "ffn_up_shexp") is None:
            return moe
        return self.ctx.add(moe, self.layer_ffn(cur, il, act, "_shexp", clamp, linear))

    def moe_ffn(self, cur: Tensor, il: int, *, gating: str = "softmax", norm_w: bool = True, w_scale: float = 0.0,
                act: str = "silu", probs_bias: Tensor | None = None, gate_inp_b: Tensor | None = None,
                weight_before: bool = False, logits: Tensor | None = None, clamp: bool = False,
                situ_linear: bool = True, selected: Tensor | None = None, exps: str = "exps",
                grove: bool = False) -> Tensor:
        """build_moe_ffn: the router (logits, softmax/sigmoid/sqrt(softplus), a selection bias), top-k (within
        the context's expert `groups`), the chosen weights (normalised, scaled), the experts (separate or fused
        gate/up, biases, per-expert `.scale` tensors), weighted, summed; `logits` (the caller's), `selected` (no
        top-k), `clamp`, `act`, `exps` (the experts' suffix) and `grove`: docs/memory.md, "The graph blocks"."""
        c, w, hp = self.ctx, self.w, self.hp
        n_embd, T = cur.ne[0], cur.ne[1]
        used = hp.n_expert_used
        if logits is None:
            logits = self.mm(self._need(il, "ffn_gate_inp"), cur)
            logits.name = f"ffn_moe_logits-{il}"
        if gate_inp_b is not None:
            logits = c.add(logits, gate_inp_b)
        if gating == "softmax":
            probs = c.soft_max(logits)
        elif gating == "sigmoid":
            probs = c.unary(logits, "sigmoid")
        elif gating == "sqrt_softplus":
            probs = c.sqrt(c.unary(logits, "softplus"))
        else:  # softmax_weight: the logits themselves
            probs = logits
        selection = c.add(probs, probs_bias) if probs_bias is not None else probs
        if weight_before:
            selection = logits
        if grove:
            selection = c.unary(logits, "sigmoid")
        n_expert = probs.ne[0]
        n_groups, n_group_used = self.groups
        if n_groups > 1 and T > 0:  # the top groups' experts only (DeepSeek-V3's group-limited routing)
            per = n_expert // n_groups
            sel_groups = c.reshape(selection, per, n_groups, T)
            scores = c.argsort_top_k(sel_groups, 2)
            scores = c.get_rows(c.reshape(sel_groups, 1, per, n_groups, T), scores)
            scores = c.sum_rows(c.reshape(scores, scores.ne[1], scores.ne[2], scores.ne[3]))
            scores = c.reshape(scores, scores.ne[1], scores.ne[2])
            top_groups = c.argsort_top_k(scores, n_group_used)
            kept = c.get_rows(sel_groups, top_groups)
            selection = c.reshape(c.set_rows(c.fill(sel_groups), kept, top_groups), n_expert, T)
        if selected is None:
            selected = c.argsort_top_k(selection, used)
        down_w = self._need(il, f"ffn_down_{exps}")
        if grove and down_w.ne[2] != n_expert:  # the adjugate expert of the chosen one's group
            selected = c.cast(c.scale(c.cast(selected, "F32")), "I32")
        weights = c.get_rows(c.reshape(probs, 1, n_expert, T), selected)
        if gating == "softmax_weight":
            weights = c.reshape(c.soft_max(c.reshape(weights, used, T)), 1, used, T)
        if norm_w:
            w2 = c.reshape(weights, used, T)
            weights = c.reshape(c.div(w2, c.clamp(c.sum_rows(w2))), 1, used, T)
        if w_scale not in (0.0, 1.0):
            weights = c.scale(weights)
        self.expand(weights)
        cur = c.reshape(cur, n_embd, 1, T)
        if weight_before:
            cur = c.mul(c.repeat(cur, n_embd, used, T, 1), weights)
        def mm_id(wt: Tensor, x: Tensor, base: str, bias: str = "") -> Tensor:
            """build_lora_mm_id, a per-expert scale (`base`'s), the experts' bias (`bias`'s, else `base`'s)."""
            res = c.mul_mat_id(wt, x, selected)
            s = w.layer(il, base, "scale")
            if s is not None:
                s = c.repeat(c.reshape(s, 1, s.ne[0], 1), 1, s.ne[0], x.ne[2], 1)
                res = c.mul(res, c.get_rows(s, selected))
            b = w.layer(il, bias or base, "bias")
            return c.add_id(res, b, selected) if b is not None else res

        gate_up = w.layer(il, f"ffn_gate_up_{exps}")
        if gate_up is not None:
            gu = mm_id(gate_up, cur, f"ffn_up_{exps}", f"ffn_gate_up_{exps}")
            n_ff = gu.ne[0] // 2
            g = c.view(gu, (n_ff, gu.ne[1], gu.ne[2]), (gu.nb[1], gu.nb[2]), 0)
            up = c.view(gu, (n_ff, gu.ne[1], gu.ne[2]), (gu.nb[1], gu.nb[2]), n_ff * gu.nb[0])
            has_gate = True
        else:
            up = mm_id(self._need(il, f"ffn_up_{exps}"), cur, f"ffn_up_{exps}")
            gate_w = w.layer(il, f"ffn_gate_{exps}")
            g = mm_id(gate_w, cur, f"ffn_gate_{exps}") if gate_w is not None else up
            has_gate = gate_w is not None
        # gpt-oss's and DeepSeek-V4's activations a GLU op whatever the gate; the clamped SwiGLU unfused only
        h = self.activation(g, up, has_gate or act in GLU_ONLY, act, clamp and gate_up is None, situ_linear)
        experts = mm_id(down_w, h, f"ffn_down_{exps}")
        if not weight_before:
            experts = c.mul(experts, weights)
        self.expand(experts)
        views = [c.view(experts, (n_embd, T), (experts.nb[2],), i * experts.nb[1]) for i in range(used)]
        for v in views:
            self.expand(v)
        out = views[0]
        for v in views[1:]:
            out = c.add(out, v)
            self.expand(out)
        if used == 1:
            out = c.cont(out)
        return out

    def activation(self, x: Tensor, up: Tensor, gated: bool, act: str, clamp: bool, linear: bool) -> Tensor:
        """build_ffn's and build_moe_ffn's activation of `x` (the gate's output, else the up projection's) and `up`:
        docs/memory.md, "The graph blocks"."""
        c = self.ctx
        if gated and clamp and act == "silu":
            return c.mul(c.clamp(c.unary(x, "silu")), c.clamp(up))
        if act == "situ":  # build_moe_ffn's LLM_FFN_SITU (`linear`: its up branch's tanh)
            if linear:
                up = c.scale(c.unary(c.scale(up), "tanh"))
            return c.mul(c.mul(c.scale(c.unary(c.scale(x), "tanh")), c.unary(x, "sigmoid")), up)
        if gated:
            return c.glu_split(x, up, GLU.get(act, "reglu"))
        if act == "relu_sqr":
            return c.sqr(c.unary(x, "relu"))
        if act == "swiglu":  # LLM_FFN_SWIGLU over one projection: its two halves, gate and up
            return c.glu(x, "swiglu")
        return c.unary(x, act)

    # -- output
    def output(self, cur: Tensor, rows: str = "", rms: bool = True, norm: str = "output_norm",
               scale: bool = False, softcap: bool = False) -> None:
        """The head every src/models/*.cpp ends with: the final norm (`norm`, and its bias), the logits (plus
        output.bias), scaled, soft-capped; the output rows taken before or after the final norm (`rows`; docs/memory.md,
        "The graph blocks")."""
        c, w = self.ctx, self.w
        if rows == "before":
            assert self.t_out_ids is not None
            cur.flags |= OUTPUT
            cur = c.get_rows(cur, self.t_out_ids)
        cur = self.norm(cur, w.get(f"{norm}.weight"), w.get(f"{norm}.bias"), -1, rms)
        if rows == "after":
            assert self.t_out_ids is not None
            cur.flags |= OUTPUT
            cur = c.get_rows(cur, self.t_out_ids)
        out = w.get("output.weight")
        if out is None:
            raise MissingTensor("output.weight")
        logits = self.linear(out, w.get("output.bias"), cur)
        if scale:
            logits = c.scale(logits)
        if softcap:
            logits = c.scale(c.unary(c.scale(logits), "tanh"))
        self.finish(cur, logits)

    def finish(self, norm: Tensor, logits: Tensor) -> None:
        """The graph's outputs (the final norm and the logits: never freed) and its last expansion."""
        norm.name = "result_norm"
        logits.name = "result_output"
        norm.flags |= OUTPUT
        logits.flags |= OUTPUT
        self.expand(logits)
