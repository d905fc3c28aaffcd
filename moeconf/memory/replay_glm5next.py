"""A replay of ggml-alloc (see `replay`) over the GLM-5.3-Flash (`glm5-next`) graph: mHC residual
streams (four copies of the hidden state, mixed before and after each attention and FFN block by
the fused DSV4 HC ops), KDA layers (Kimi delta attention, the fused gated delta-net op) and DSA
layers (nope-only MLA latent attention whose mask is built from a k-pool lightning indexer), each
followed by a dense FFN (the leading layers) or routed experts with a selection bias, clamped
SwiGLU and a shared expert.

The node order is the graph's, read from the pinned llama.cpp (0.3.36): src/models/glm5-next.cpp
(`graph`, `glm5_conv1d`, `build_inp_kpool`, `build_hc_pre`/`build_hc_post` with the fused
DSV4_HC_PRE/COMB/POST ops that `resolve_fused_ops` enables on CPU and RPC backends,
`build_kda_layer`, `build_kpool_select` on the scatter path with the fused LIGHTNING_INDEXER,
`build_dsa_layer`), src/llama-memory-hybrid-idx.cpp (the full-cache context the scheduler reserves
with: `n_pool_real = cells / kpool * n_seq_max`, every pool counted as new, `kpool_pad`),
src/llama-graph.cpp (`build_rs`, `build_moe_ffn`). Facts that set the buffer:

- every k-pool graph input is a CPU leaf: pool cells (I32, n_pool), pool members (I32, kpool x
  n_pool), the pool mask (F16 with the fused indexer, n_pool x tokens), the tail cells (I32, kpool-1
  x tokens), the slot mask (F32, n_sel x tokens), the new pools' members (I32, kpool x n_new) and
  their cells (I64, n_new), with `n_pool = max(64, pad64(n_pool_real + 1))`, `n_new = n_pool_real`,
  `n_sel = kpool * min(n_pool, top_k / kpool) + kpool - 1`;
- each DSA layer reshapes the attention mask, the slot mask and the new pools' members anew, so a
  GPU's split copies all three once per DSA layer (at the start of the split running it) and keeps
  each mask copy until its layer (the mask copy then holds the layer's sparse mask: the ADD runs in
  place on it);
- with every layer on one GPU, the flash-attention output (heads x kv_lora_rank x tokens, F32) of
  the first DSA layer lands above everything else: the buffer's size.

The whole graph is replayed once with every buffer (the host's and each GPU's) and the scheduler's
splits between them (ggml-backend.cpp `ggml_backend_sched_split_graph`): a routed expert matmul runs
where its weights are, the SwiGLU and the weighted sum where `expert_devices` puts them;
at a boundary between two GPUs the next layer's first (weightless) RMS_NORM runs on the GPU before
("expand GPU down"), which copies it and the streams over; host layers first (a partial -ngl, or
-ngl 1 with the output on a GPU) turn the fused HC post off for every layer (`resolve_fused_ops`
finds the last host layer's post assigned to the GPU), and that post's weightless ops after the comb
run on the GPU, each reading a copy of the strided view it reads; pipeline parallelism pins 4 copies
of every graph input and split input before any node.

Checked against the allocations of an instrumented ggml-alloc of the pinned build (`AT_PRINTF`) and
`GGML_SCHED_DEBUG=2` on the sparse full-size GLM-5.3-Flash, every offset of every buffer on the
traced lines, and against `llama-fit-params -fitp on` (tests/data/glm5next_memory_oracle.json)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, TypeVar

from moeconf.memory.replay import CPU, GPU, Graph, _Node, sigmoid_router

if TYPE_CHECKING:
    from moeconf.memory.geometry import Geometry
    from moeconf.model.inventory import Inventory
    from moeconf.placement import Placement


def expert_devices(home: int, gate: int, up: int, down: int) -> tuple[int, int]:
    """Where the scheduler runs a layer's SwiGLU and the weighting and sum of its routed experts'
    outputs (ggml-backend.cpp `ggml_backend_sched_split_graph`, pass 2: GPU backends expand down,
    then up, over nodes without weights; the CPU only where no GPU reaches): the SwiGLU where up
    runs if that is a GPU, else where down runs if that is a GPU, else the CPU; the weighting and
    the sum where down runs if that is a GPU, else on the layer's device (the shared expert after
    them expands up). Devices as the replay numbers its buffers (`replay.CPU` the host's)."""
    act = up if up != CPU else (down if down != CPU else CPU)
    return act, (down if down != CPU else home)


@dataclass(frozen=True)
class Glm5NextShape:
    n_embd: int
    n_vocab: int
    hc: int  # hyper_connection.count (mHC streams)
    n_head: int  # attention heads (KDA and MLA)
    kda_head_dim: int
    d_conv: int
    q_lora_rank: int
    kv_lora_rank: int
    head_k_mla: int  # nope-only: the query width per head
    head_v_mla: int
    idx_heads: int  # attention.indexer.head_count
    idx_dim: int  # attention.indexer.key_length
    idx_top_k: int
    kpool: int
    select_tail: bool
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    n_ff: tuple[int, ...]  # per layer: the dense FFN's width, 0 for a MoE layer
    recurrent: tuple[bool, ...]  # per layer: a KDA layer (else DSA)
    n_tokens: int
    n_kv: int  # cells per stream (the mask's width)
    n_pool_real: int  # cells / kpool * n_seq_max
    n_seqs: int = 1
    on_host: bool = False  # every layer and the output on the host (-ngl 0): one buffer, no copies
    # per layer: the buffer of the GPU running it (GPU: the first, 2 on: the others; () every layer on GPU);
    # the output runs on the last layer's
    homes: tuple[int, ...] = ()
    # the fused DSV4 HC post (off for every layer when some layers run on the host and others on a GPU:
    # llama-context.cpp resolve_fused_ops finds the host layer's post assigned to the GPU)
    fused_post: bool = True
    # the scheduler's copies of every graph input and split input (4 with pipeline parallelism): all
    # allocated before any node and never freed (ggml-backend.cpp ggml_backend_sched_split_graph)
    copies: int = 1
    # the output's buffer when every layer runs on the host and the output on a GPU (-ngl 1); -1: the
    # last layer's
    out_home: int = -1
    # flash attention (off: an F32 mask, the latent's transposed copy, KQ and its softmax in place)
    flash_attn: bool = True
    cache_el: int = 2  # bytes per element of the K cache (with flash attention off: f16, bf16 or f32)
    kv_host: bool = False  # -nkvo: the caches and the state in host memory, their reads and writes on the host
    # the KV streams (the caches' rows: n_kv x n_stream), which size the transposed latent with -fa off and,
    # with `kv_host`, the GPU's copies of the caches' views; the cache type's block (bytes, elements)
    n_stream: int = 1
    cache_block: tuple[int, int] = (2, 1)
    # per layer: its routed experts' gate, up and down on the host (-ot exps=CPU, --n-cpu-moe); () none
    cpu_experts: tuple[tuple[bool, bool, bool], ...] = ()
    # per layer: the buffers of its gate, up and down experts (() for a dense layer), overriding
    # `cpu_experts` when given: the host, its own GPU or another GPU
    experts: tuple[tuple[int, ...], ...] = ()
    # the worst case's outputs: the ubatch before llama-context.cpp's graph_reserve rounds n_tokens up to
    # a multiple of the sequences (0: n_tokens)
    n_outputs: int = 0

    @property
    def n_pool(self) -> int:
        return max(64, (self.n_pool_real + 1 + 63) // 64 * 64)

    @property
    def n_sel(self) -> int:
        return self.kpool * min(self.n_pool, self.idx_top_k // self.kpool) + (self.kpool - 1 if self.select_tail else 0)


T_ = TypeVar("T_")


def glm5next_graph(s: Glm5NextShape) -> Graph:
    """The whole graph, each node in the buffer of the device running it (`homes`, `experts`,
    `out_home`; by default every layer and the output in buffer GPU), the embeddings and the graph
    inputs on the host (buffer CPU). Nodes on the host read the inputs themselves (a view where a
    layer reshapes one), nodes on a GPU the split's copies."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    hc = s.hc
    ns = max(1, s.n_seqs)
    used = s.n_expert_used
    n_layer = len(s.recurrent)
    d_inner = s.n_head * s.kda_head_dim
    n_embd_r = 3 * (s.d_conv - 1) * d_inner
    n_embd_s = s.kda_head_dim * s.kda_head_dim * s.n_head
    r = s.kv_lora_rank
    idx = s.idx_dim
    kp = s.kpool
    n_pool, n_new, n_sel = s.n_pool, max(s.n_pool_real, 1), s.n_sel
    n_top = min(n_pool, s.idx_top_k // kp)
    dsa = [il for il in range(n_layer) if not s.recurrent[il]]

    def home_of(il: int) -> int:
        return CPU if s.on_host else (s.homes[il] if s.homes else GPU)

    mask_el = 2 if s.flash_attn else 4  # the attention mask: f16 with flash attention, else f32

    # the graph's leaves in the order the graph meets them: host inputs, the GPU's zero pads
    leaves: dict[object, int] = {}

    pinned: dict[tuple[object, int], int] = {}

    def leaf(key: object, size: int, buf: int = CPU) -> int:
        if s.copies > 1 and buf == CPU:  # a graph input: each copy pinned (the first is the leaf itself)
            leaves[key] = len(g.nodes)
            for _ in range(s.copies):
                g.nodes.append(_Node(size, (), -1, False, True, CPU, (-2, 0)))
        else:
            leaves[key] = g.leaf(size, buf)
        return leaves[key]

    def split_input(key: object, size: int, src: int) -> int:
        """The current split's copy of `src` (another buffer's): `Graph.input`, or with pipeline
        parallelism the first of its pinned copies (made once per buffer)."""
        if s.copies == 1:
            return g.input(key, size, src)
        if (key, g.buf) not in pinned:
            pinned[(key, g.buf)] = len(g.nodes)
            for _ in range(s.copies):
                if not size:  # an empty copy, still allocated (see Graph.zeros)
                    g.zeros.add(len(g.nodes))
                g.nodes.append(_Node(size, (), -1, False, True, g.buf, (-2, 0)))
        return pinned[(key, g.buf)]

    tokens = leaf("tokens", f)
    leaf("embd", e * f)  # the embeddings input, unused with token ids
    leaf("pool_cells", 4 * n_pool)
    leaf("pool_idxs", 4 * kp * n_pool)
    leaf("pool_mask", 2 * n_pool * T)
    leaf("tail_idxs", 4 * (kp - 1) * T)
    leaf("gather_mask", 4 * n_sel * T)
    if any(s.recurrent):
        leaf("s_copy", 4 * ns)
    for i, il in enumerate(dsa):
        leaf(("pzero", il), 4 * idx * T, home_of(il))
        if i == 0:
            leaf("idx_k_idxs", 8 * T)
            leaf("new_pool_idxs", 4 * kp * n_new)
            leaf("new_pool_rep", 8 * n_new)
            leaf("k_idxs", 8 * T)
            leaf("mask", mask_el * s.n_kv * T)
    fo = 4 * (s.n_outputs or T)
    leaf("out_ids", fo)

    def graph_input(key: object, size: int, name: str | None = None) -> int:
        """This split's copy of a host input (`key`: its copy's identity, one per reshape); on the
        host, the input itself or (`name` given: a layer's reshape) a view of it."""
        if g.buf == CPU:
            return g.view(leaves[name]) if name is not None else leaves[key]
        return split_input(key, size, leaves[name if name is not None else key])

    g.split(CPU)
    embd = g.op(e * f, tokens)
    if home_of(0) != CPU:
        g.split(home_of(0))
        embd = split_input("embd_out", e * f, embd)
    # hc_init: REPEAT of (a view of) the embeddings
    x = g.op(hc * e * f, g.view(embd))

    def hc_pre(x: int, il: int = -1) -> tuple[int, int]:
        """DSV4 HC pre: the mixes of the flattened, normed streams and the block input. `il`: the
        first layer of a GPU after another GPU's, which runs the weightless RMS_NORM ("expand GPU
        down", ggml-backend.cpp ggml_backend_sched_split_graph); this GPU's split starts with
        copies of the norm and of the streams (returned in `x`'s place through `moved`)."""
        flat = g.op(hc * e * f, g.view(x))  # RMS_NORM of the reshaped streams
        if il >= 0:
            g.split(home_of(il))
            flat = split_input(("flat", il), hc * e * f, flat)
            moved[0] = x = split_input(("l_out", il), hc * e * f, x)
        mixes = g.op((2 + hc) * hc * f, flat)
        pre = g.op(hc * f, g.view(mixes))  # * scale
        for _ in range(3):  # + base, sigmoid, scale_bias
            pre = g.op(hc * f, pre, inplace=True)
        cur = g.op(e * f, x, pre)
        cur = g.op(e * f, cur, inplace=True)  # RMS_NORM
        return g.op(e * f, cur, inplace=True), mixes  # * norm weight

    def hc_post(out: int, residual: int, mixes: int, to: int = -1) -> int:
        """DSV4 HC post: fused, or (`fused_post` off) per destination stream the block output times
        its post weight plus each source stream times its comb weight, the streams concatenated.
        `to`: the GPU running the next layer, after this (host) layer: every weightless node after
        the comb runs there ("expand GPU up"), each reading a copy of the view it reads (strided:
        a view's copy spans from its first to its last element)."""
        post = g.op(hc * f, g.view(mixes))
        for _ in range(3):  # + base, sigmoid, scale
            post = g.op(hc * f, post, inplace=True)
        if s.fused_post:
            comb = g.op(hc * hc * f, mixes)  # DSV4_HC_COMB
            return g.op(hc * e * f, out, residual, post, comb)
        # the views' spans: a stream of the residual, a (src, dst) comb weight, a dst post weight
        res_span, comb_span, post_span = 4 * ((T - 1) * hc * e + e), 4 * ((T - 1) * hc * hc + 1), 4 * ((T - 1) * hc + 1)
        comb = -1
        acc = -1
        n = 0  # views copied so far (each its own copy)

        def moved(t: int, span: int) -> int:
            """A view of t here: itself, or (t made on another buffer) this split's copy of it."""
            nonlocal n
            if g.nodes[t].buf == g.buf:
                return g.view(t)
            n += 1
            return g.input(("view", out, n), span, g.view(t))

        for dst in range(hc):
            src_out = out if g.nodes[out].buf == g.buf else g.input(("post_out", out), e * f, out)
            cur = g.op(e * f, src_out, moved(post, post_span), inplace=True)
            for _ in range(hc):
                if comb < 0:
                    comb = g.op(hc * hc * f, mixes)  # DSV4_HC_COMB
                    if to >= 0:
                        g.split(to)
                m = g.op(e * f, moved(residual, res_span), moved(comb, comb_span))
                if g.nodes[cur].buf != g.buf:
                    cur = g.input(("post_cur", out), e * f, cur)
                cur = g.op(e * f, cur, m, inplace=True)
            cur = g.view(cur)
            acc = cur if acc < 0 else g.op((dst + 1) * e * f, acc, cur)
        return acc

    def at(buf: int) -> None:
        if g.buf != buf:
            g.split(buf)

    def moved_view(t: int, span: int, key: object) -> int:
        """A view of t here: itself, or (t made on another buffer) this split's copy of the view
        (`span`: the bytes from its first to its last element)."""
        if g.nodes[t].buf == g.buf:
            return g.view(t)
        return g.input(key, span, g.view(t))

    def kda(il: int, cur: int) -> int:
        home = g.buf
        kvb = CPU if s.kv_host else home  # where the state's reads and writes run (-nkvo: the host)
        at(kvb)
        s_copy = graph_input("s_copy", 4 * ns)
        # the other sequences' rows: none in the reserve (on the host, a second view of s_copy)
        extra = (g.view(leaves["s_copy"]) if g.buf == CPU else g.zero_input("s_copy_extra") if s.copies == 1
                 else split_input("s_copy_extra", 0, leaves["s_copy"]))
        conv_rows = g.op(n_embd_r * 4 * ns, s_copy)
        g.op(0, g.zero(extra))
        cat = []
        w_cat = s.d_conv - 1 + T // ns  # a sequence's conv input columns
        row_span = 4 * ((s.d_conv - 2) + (d_inner - 1) * (s.d_conv - 1) + (ns - 1) * n_embd_r + 1)
        cat_span = 4 * ((s.d_conv - 2) + (d_inner - 1) * w_cat + (ns - 1) * d_inner * w_cat + 1)
        for i in range(3):  # Q, K, V: projection, concat with the state rows, last columns saved
            at(home)
            proj = g.op(d_inner * f, cur)
            c = g.op((T + (s.d_conv - 1) * ns) * d_inner * 4, moved_view(conv_rows, row_span, ("conv_x", il, i)),
                     g.view(proj))
            at(kvb)
            g.op(0, moved_view(c, cat_span, ("conv_saved", il, i)))
            cat.append(c)
        state = g.op(n_embd_s * 4 * ns, s_copy)
        g.op(0, g.zero(extra))
        at(home)
        qkv = []
        for i, c in enumerate(cat):
            xc = g.op(d_inner * f, c)  # SSM_CONV
            xc = g.op(d_inner * f, g.view(xc))  # SiLU of the reshaped output
            if i < 2:  # Q and K: L2 norm (RMS_NORM of the 4d view, SCALE in place)
                xc = g.op(d_inner * f, g.view(xc))
                xc = g.op(d_inner * f, xc, inplace=True)
            else:
                xc = g.view(xc)
            qkv.append(xc)
        fa = g.op(s.kda_head_dim * f, cur)  # f_a
        g1 = g.op(d_inner * f, fa)  # f_b
        g1 = g.op(d_inner * f, g1, inplace=True)  # + dt bias
        g1 = g.op(d_inner * f, g.view(g1))  # * A (on the reshaped tensor)
        for _ in range(3):  # scale, sigmoid, scale (the gate's lower bound)
            g1 = g.op(d_inner * f, g1, inplace=True)
        beta = g.op(s.n_head * f, cur)
        beta = g.op(s.n_head * f, g.view(beta))  # sigmoid of the reshaped
        res = g.op((d_inner * T + n_embd_s * ns) * 4, qkv[0], qkv[1], qkv[2], g.view(g1), beta,
                   moved_view(state, n_embd_s * 4 * ns, ("state", il)))
        at(kvb)
        g.op(0, moved_view(res, n_embd_s * 4 * ns, ("new_state", il)))  # the new state copied into the cache
        at(home)
        out = g.op(d_inner * f, g.view(res))  # CONT of the output
        nrm = g.op(d_inner * f, g.view(out))  # o_norm: RMS_NORM of the reshaped output
        nrm = g.op(d_inner * f, nrm, inplace=True)
        ga = g.op(s.kda_head_dim * f, cur)  # g_a
        g2 = g.op(d_inner * f, ga)  # g_b
        g2 = g.op(d_inner * f, g.view(g2))  # sigmoid of the reshaped gate
        nrm = g.op(d_inner * f, nrm, g2, inplace=True)
        gated = g.op(d_inner * f, g.view(nrm))  # CONT
        return g.op(e * f, gated)  # wo

    def dsa_layer(il: int, cur: int) -> int:
        # the indexer's key | gate | zero row per token, into its cache
        ik = g.op(idx * f, cur)
        ik = g.op(idx * f, ik)  # NORM (never in place)
        ik = g.op(idx * f, ik, inplace=True)
        ik = g.op(idx * f, ik, inplace=True)
        ig = g.op(idx * f, cur)
        packed = g.op(2 * idx * f, ik, ig)
        pz = g.op(idx * f, leaves[("pzero", il)], inplace=True)  # FILL of the leaf, in place
        packed = g.op(3 * idx * f, packed, pz)
        home = g.buf
        kvb = CPU if s.kv_host else home  # where the caches' reads and writes run (-nkvo: the host)
        bb, be = s.cache_block
        n_rows = s.n_kv * s.n_stream

        def row(n: int) -> int:
            return n // be * bb

        def cache_view(key: str, span: int) -> tuple[int, ...]:
            """The split's copy of a view of a cache in host memory (none on the cache's device)."""
            return (g.input((key, il), span),) if g.buf != kvb else ()

        at(kvb)
        g.op(0, moved_view(packed, 3 * idx * f, ("packed", il)), graph_input("idx_k_idxs", 8 * T))  # SET_ROWS
        at(home)
        # pooling every new pool: key | gate rows of its members, softmax over the pool, weighted sum
        rows = g.op(2 * idx * kp * n_new * 4, *cache_view("key_gate", (n_rows - 1) * row(3 * idx) + row(2 * idx)),
                    graph_input(("new_pool_idxs", il), 4 * kp * n_new, "new_pool_idxs"))
        pool = idx * kp * n_new * 4
        logits = g.op(pool, g.view(rows))  # + ape
        logits = g.op(pool, g.view(logits))  # CONT of the permuted
        probs = g.op(pool, g.view(logits))  # SOFT_MAX of the reshaped
        pk = g.op(pool, g.view(g.view(rows)))  # CONT of the permuted keys
        pk = g.op(pool, g.view(probs), pk, inplace=True)
        pooled = g.op(idx * n_new * 4, pk)  # SUM_ROWS
        at(kvb)
        g.op(0, moved_view(pooled, idx * n_new * 4, ("pooled_new", il)),
             graph_input("new_pool_rep", 8 * n_new))  # SET_ROWS into the pooled slots
        at(home)
        # the absorbed query and the latent
        qr = g.op(s.q_lora_rank * f, cur)
        qr = g.op(s.q_lora_rank * f, qr, inplace=True)
        qr = g.op(s.q_lora_rank * f, qr, inplace=True)
        q = g.op(s.n_head * s.head_k_mla * f, qr)
        qa = g.op(s.n_head * r * f, g.view(q))  # wk_b
        kv = g.op(r * f, cur)
        kv = g.op(r * f, kv, inplace=True)
        kv = g.op(r * f, kv, inplace=True)
        at(kvb)
        g.op(0, moved_view(kv, r * f, ("latent", il)), graph_input("k_idxs", 8 * T))
        at(home)
        latent = row(r) * n_rows  # the layer's latent cache (K, and V a view of it)
        if not s.flash_attn:  # build_attn_mha: V (the latent, transposed) and KQ, before the mask
            v_cont = g.op(s.cache_el * r * n_rows, *cache_view("v_t", latent))
            kq = g.op(4 * s.n_kv * T * s.n_head, *cache_view("k_p", latent), g.view(qa))
        # the lightning indexer over the pooled keys, the top pools by score
        iq = g.op(s.idx_heads * idx * f, qr)
        pooled = g.op(idx * 4 * n_pool, *cache_view("pooled", (n_rows - 1) * row(3 * idx) + row(idx)),
                      graph_input("pool_cells", 4 * n_pool))  # GET_ROWS
        w = g.op(s.idx_heads * f, cur)
        w = g.op(s.idx_heads * f, w, inplace=True)
        score = g.op(4 * n_pool * T, g.view(iq), g.view(pooled), w, graph_input("pool_mask", 2 * n_pool * T))
        tf = 4 * n_top * T
        top = g.op(tf, score)  # TOP_K
        top_f = g.op(tf, top)  # cast to F32
        sel_score = g.op(tf, g.view(score), top)
        order = g.op(tf, g.view(sel_score))  # ARGSORT
        top = g.op(tf, g.view(top_f), order)  # GET_ROWS
        top = g.op(tf, g.view(top))  # CONT
        top = g.op(tf, top)  # cast to I32
        sel = g.op(kp * tf, graph_input("pool_idxs", 4 * kp * n_pool), g.view(top))
        if s.select_tail:
            sel = g.op(4 * n_sel * T, g.view(sel), graph_input("tail_idxs", 4 * (kp - 1) * T))
        # the scatter path: an all -inf mask with the selected cells set to 0, plus the causal mask
        seed = g.op(4, g.view(sel))  # cast of the first index
        zero_seed = g.op(4, seed)  # FILL (not in place: the seed has another consumer)
        zeros = g.op(4 * n_sel * T, zero_seed)  # REPEAT
        idx_f = g.op(4 * n_sel * T, sel)  # cast
        dump = g.op(4 * n_sel, )  # ARANGE
        idx_f = g.op(4 * n_sel * T, idx_f, dump, inplace=True)  # SUB
        live = g.op(4 * n_sel * T, graph_input(("gather_mask", il), 4 * n_sel * T, "gather_mask"),
                    inplace=True)  # EXP of the slot mask copy, in place
        idx_f = g.op(4 * n_sel * T, idx_f, live, inplace=True)
        idx_f = g.op(4 * n_sel * T, idx_f, dump, inplace=True)
        idx_i = g.op(4 * n_sel * T, idx_f)  # cast to I32
        if s.flash_attn:
            mseed = g.op(2, seed)  # cast to the mask's F16
            mseed = g.op(2, mseed, inplace=True)  # FILL -inf
        else:
            mseed = g.op(4, seed, inplace=True)  # FILL -inf of the F32 seed itself
        mask_all = g.op(mask_el * (s.n_kv + n_sel) * T, mseed)  # REPEAT
        rows_set = g.view(g.view(mask_all))
        g.nodes[rows_set].srcs += (zeros, idx_i)  # SET_ROWS: a view of the mask, from zeros at idx
        masked = g.op(mask_el * s.n_kv * T, g.view(rows_set),
                      graph_input(("mask", il), mask_el * s.n_kv * T, "mask"), inplace=True)
        if s.flash_attn:
            att = g.op(s.n_head * r * f, g.view(qa), *cache_view("k", latent), *cache_view("v", latent),
                       g.view(masked))  # FLASH_ATTN_EXT
            vb = g.op(s.n_head * s.head_v_mla * f, g.view(att))  # wv_b
        else:
            kq = g.op(4 * s.n_kv * T * s.n_head, kq, g.view(masked), inplace=True)  # SOFT_MAX
            att = g.op(s.n_head * r * f, v_cont, kq)  # KQV
            vb = g.op(s.n_head * s.head_v_mla * f, att)  # wv_b
        vb = g.op(s.n_head * s.head_v_mla * f, g.view(vb))  # CONT of the permuted
        return g.op(e * f, g.view(vb))  # wo

    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4  # the copy of the chosen ids (a strided view)
    ffe = s.n_ff_exp * used * f

    def routed(il: int, xr: int, topk: int, weights: int) -> int:
        """Layer il's routed experts, each of gate, up and down on its device (the layer's own, or
        the host: splits of their own with copies of what crosses), the SwiGLU and the weighting
        and sum where `expert_devices` puts them."""
        home = home_of(il)
        if s.experts and s.experts[il]:
            gate_d, up_d, down_d = s.experts[il]
        else:
            parts = s.cpu_experts[il] if s.cpu_experts else (False, False, False)
            gate_d, up_d, down_d = (CPU if p else home for p in parts)
        act_d, sum_d = expert_devices(home, gate_d, up_d, down_d)
        here = home
        made: dict[int, int] = {}

        def on(dev: int) -> None:
            nonlocal here
            if here != dev:
                g.split(dev)
                here = dev

        def use(key: str, t: int, size: int) -> int:
            src = made.get(t, home)
            return t if src == here else g.input((key, il), size, t)

        def op(dev: int, size: int, *srcs: tuple[str, int, int]) -> int:
            on(dev)
            t = g.op(size, *(use(k, x, n) for k, x, n in srcs))
            made[t] = dev
            return t

        xs, ts = ("x", xr, e * f), ("topk", topk, tk)
        gate = op(gate_d, ffe, xs, ts)
        up = op(up_d, ffe, xs, ts)
        act = op(act_d, ffe, ("gate", gate, ffe), ("up", up, ffe))  # SWIGLU_CLAMP
        down = op(down_d, e * used * f, ("act", act, ffe), ts)
        on(sum_d)
        weighted = g.op(e * used * f, use("down", down, e * used * f), g.view(use("weights", weights, used * f)),
                        inplace=True)
        moe = g.op(e * f, g.view(weighted), g.view(weighted))
        for _ in range(used - 2):
            moe = g.op(e * f, moe, g.view(weighted), inplace=True)
        made[moe] = sum_d
        on(home)
        return use("moe_out", moe, e * f)

    moved = [-1]
    for il in range(n_layer):
        moved[0] = x
        cur, mixes = hc_pre(x, il if il and CPU != home_of(il - 1) != home_of(il) else -1)
        # the fused post reads the streams' copy HC_PRE reads; the unfused one views the streams
        # themselves, each view copied on its own when they were made on the GPU before
        residual = moved[0] if s.fused_post else x
        x = moved[0]
        out = kda(il, cur) if s.recurrent[il] else dsa_layer(il, cur)
        x = hc_post(out, residual, mixes)
        residual = x
        cur, mixes = hc_pre(x)
        if s.n_ff[il]:
            ff = s.n_ff[il] * f
            gate, up = g.op(ff, cur), g.op(ff, cur)
            out = g.op(e * f, g.op(ff, gate, up))
        else:
            topk, wscaled = sigmoid_router(g, cur, s.n_expert * f, used * f, f)
            xr = g.view(cur)
            moe = routed(il, xr, topk, wscaled)
            ffs = s.n_ff_shexp * f
            sg, su = g.op(ffs, cur), g.op(ffs, cur)
            sh = g.op(e * f, g.op(ffs, sg, su))
            out = g.op(e * f, moe, sh, inplace=True)
        nxt = home_of(il + 1) if il + 1 < n_layer else (home_of(il) if s.out_home < 0 else s.out_home)
        x = hc_post(out, residual, mixes, nxt if home_of(il) == CPU and nxt != CPU else -1)
    # the outputs' rows of the streams, their mean, the output norm and the logits
    x = g.op(hc * e * fo, g.view(x), graph_input("out_ids", fo))
    acc = g.op(e * fo, g.view(x), g.view(x))
    for _ in range(hc - 2):
        acc = g.op(e * fo, acc, g.view(x), inplace=True)
    for _ in range(3):  # scale, RMS_NORM, * output norm
        acc = g.op(e * fo, acc, inplace=True)
    g.op(s.n_vocab * fo, acc, output=True)
    g.finish()
    return g


@lru_cache(maxsize=256)
def glm5next_peaks(s: Glm5NextShape, alignment: int) -> tuple[int, ...]:
    """Each buffer's compute size: the first GPU's, the host's, then the other GPUs' (`homes`)."""
    n_buf = max((*s.homes, CPU)) + 1
    return glm5next_graph(s).peaks((alignment, *(32 if b == CPU else alignment for b in range(1, n_buf))))


@lru_cache(maxsize=64)
def glm5next_host_peak(s: Glm5NextShape) -> int:
    """The host's compute buffer with every layer and the output on the host."""
    return glm5next_graph(dataclasses.replace(s, on_host=True)).peaks((32, 32))[1]


# the `{arch}.*` keys glm5-next's memory reads beyond the MLA, DSA and KDA ones (support.MODELLED)
KEYS = frozenset({"attention.indexer.kpool", "attention.indexer.kpool_select_tail", "hyper_connection.count",
                  "hyper_connection.epsilon", "hyper_connection.sinkhorn_iterations", "kda.gate_lower_bound"})
ARCH = "glm5-next"
_SCOPE = ("replayed: the first layers on the host or none (-ngl), the others on GPUs (each GPU one range of layers, "
          "the output on the last layer's) with each layer's routed experts there or on the host (-ot exps=CPU, "
          "--n-cpu-moe; pipeline parallelism over several GPUs too), or every layer on the host")
_ROUTED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class _Layout:
    homes: tuple[str, ...]  # per layer: the device running it ("CPU" for all: everything on the host)
    output: frozenset[str]  # the device of the output norm and matrix
    experts: tuple[tuple[str, ...], ...]  # per layer: the devices of its gate, up, down experts (() dense)


def _layout(placement: Placement, n_layer: int) -> _Layout | str:
    """The placement as the replay needs it, or what it has that the replay does not cover."""
    from collections import defaultdict

    from moeconf.engines import AUTO_GPU

    inv = placement.inventory
    own: dict[int, set[str]] = defaultdict(set)  # layer (-1: outside the layers) -> devices of its own tensors
    routed: dict[int, dict[str, str]] = defaultdict(dict)
    for t in inv.tensors:
        d = placement.devices.get(t.name)
        if d is None or t.name == "token_embd.weight":  # the nextn block's tensors are skipped (TENSOR_SKIP)
            continue
        il = t.layer if t.layer is not None and t.layer < n_layer else -1
        if il >= 0 and t.base in _ROUTED:
            routed[il][t.base] = d
        else:
            own[il].add(d)
    if any(AUTO_GPU in v for v in own.values()) or any(AUTO_GPU in r.values() for r in routed.values()):
        return "an automatic split over the GPUs (give -ts)"
    if placement.devices.get("token_embd.weight") != "CPU":
        return "the token embeddings off the host"
    homes: list[str] = []
    for il in range(n_layer):
        if len(own[il]) != 1:
            return f"layer {il}'s own tensors over several devices (-ot on its attention, KDA or norm tensors)"
        homes.append(next(iter(own[il])))
    if own[-1] != {homes[-1]} and not (set(homes) == {"CPU"} and len(own[-1]) == 1):
        return "the output on another device than the last layer"
    runs = [d for i, d in enumerate(homes) if i == 0 or homes[i - 1] != d]
    if "CPU" in runs[1:]:
        return "a layer on the host after a GPU's layers"
    if len(runs) != len(set(runs)):
        return "a GPU running two separate ranges of layers"
    experts: list[tuple[str, ...]] = []
    for il in range(n_layer):
        r = routed.get(il, {})
        if r and len(r) != len(_ROUTED):
            return f"layer {il}'s routed experts incomplete"
        if r and homes[il] == "CPU" and set(r.values()) != {"CPU"}:
            # the router's weightless ops then follow the experts to the GPU ("expand GPU up"): not replayed
            # (measured 1.1 MiB over the replay at -ngl 0)
            return f"layer {il} on the host with routed experts on a GPU"
        experts.append(tuple(r[b] for b in _ROUTED) if r else ())
    return _Layout(tuple(homes), frozenset(own[-1]), tuple(experts))


def _n_trunk(inv: Inventory) -> int:
    nextn = inv.metadata.hparam("nextn_predict_layers")
    return inv.metadata.block_count - (nextn if isinstance(nextn, int) else 0)


# the `{arch}.*` sizes the replay reads (each required by the engine's loader)
_SIZES = ("attention.q_lora_rank", "attention.indexer.head_count", "attention.indexer.key_length",
          "attention.indexer.top_k", "attention.indexer.kpool", "hyper_connection.count")
_CACHE_EL = {"f16": 2, "bf16": 2, "f32": 4}  # bytes per element of the cache types replayed with -fa off


def unmodelled(placement: Placement, *, flash_attn: bool, cache_type_k: str = "f16") -> list[str]:
    """Why glm5-next's compute on this placement and these settings is not modelled (empty: it is)."""
    inv = placement.inventory
    md = inv.metadata
    why: list[str] = []
    keys = set(md.arch_keys or ())
    if "kda.gate_lower_bound" not in keys:
        why.append("glm5-next without kda.gate_lower_bound (the softplus decay gate) is not replayed")
    if "attention.indexer.kpool_select_tail" not in keys or md.hparam("attention.indexer.kpool_select_tail") == 0:
        why.append("glm5-next without attention.indexer.kpool_select_tail (no tail cells in the selection) is not "
                   "replayed")
    missing = [k for k in _SIZES if not isinstance(md.hparam(k), int)]
    if missing:
        names = ", ".join(f"glm5-next.{k}" for k in missing)
        why.append(f"memory is not modelled for this glm5-next file: it lacks {names} (the engine needs them)")
    kpool, top_k = md.hparam("attention.indexer.kpool"), md.hparam("attention.indexer.top_k")
    if not isinstance(kpool, int) or not isinstance(top_k, int) or kpool < 2 or top_k % kpool:
        why.append("glm5-next's attention.indexer.kpool/top_k are missing or invalid: the engine refuses the file")
    if md.hparam("hyper_connection.count") != 4:
        why.append("glm5-next with hyper_connection.count other than 4: the engine refuses the file")
    if not flash_attn and cache_type_k not in _CACHE_EL:
        why.append(f"compute is not modelled for glm5-next with flash attention off and a {cache_type_k} K cache "
                   "(llama.cpp refuses a quantized V cache without flash attention; the latent's transposed copy "
                   "is replayed for f16, bf16 and f32)")
    lay = _layout(placement, _n_trunk(inv))
    if isinstance(lay, str):
        why.append(f"compute is not modelled for glm5-next with {lay}: {_SCOPE}; KV cache and compute are not "
                   "computed")
    return why


# layers of each device's run an approximate replay keeps (its last ones: two periods of the KDA/DSA
# pattern), with the leading dense layers
SEARCH_LAYERS = 8


def replayed_glm5next(placement: Placement, geo: Geometry, n_tokens: int, cells: int, n_seq: int, *,
                      pipeline: bool = False, flash_attn: bool = True, cache_type_k: str = "f16",
                      offload_kqv: bool = True, n_stream: int = 1, approximate: bool = False) -> dict[str, int]:
    """Each compute buffer (the GPU's and the host's, or the host's alone) by the replay above, for
    the placements `unmodelled` accepts; `n_tokens`: the worst-case ubatch (min(-b, -ub)), `cells`:
    KV cells per stream. `approximate` is for a fit's search over layer splits, which measures the
    splits it finishes exactly (fill.py `complete`): with several devices running layers, each
    device's run keeps only its last `SEARCH_LAYERS` layers (and the leading dense ones), so that
    candidates whose runs end alike share one cached replay. A run's working set repeats layer by
    layer; what the dropped layers change is where earlier ones left holes and how many zero pads
    the DSA layers keep allocated, so the figure may be off either way."""
    import moeconf.memory.recurrent as rec
    from moeconf.memory.settings import cache_row_bytes

    inv = placement.inventory
    md = inv.metadata
    dims = rec.kda_dims(inv)
    rl = rec.recurrent_layers(inv)
    n_layer = len(geo.layers)
    lead = md.hparam("leading_dense_block_count")
    lead = lead if isinstance(lead, int) else 0
    lay = _layout(placement, n_layer)
    if dims is None or isinstance(lay, str) or n_layer != _n_trunk(inv):
        return {}
    gpus = list(dict.fromkeys(lay.homes))
    ints = {k: md.hparam(k) for k in _SIZES}
    vals = {k: v for k, v in ints.items() if isinstance(v, int)}
    if len(vals) != len(ints):
        return {}
    kpool = vals["attention.indexer.kpool"]
    dense = [la.index < lead for la in geo.layers]
    shape = Glm5NextShape(
        n_embd=geo.n_embd, n_vocab=geo.n_vocab, hc=vals["hyper_connection.count"], n_head=dims.n_head,
        kda_head_dim=dims.head_dim, d_conv=dims.d_conv, q_lora_rank=vals["attention.q_lora_rank"],
        kv_lora_rank=geo.kv_lora_rank, head_k_mla=geo.head_k_mla, head_v_mla=geo.head_v_mla,
        idx_heads=vals["attention.indexer.head_count"], idx_dim=vals["attention.indexer.key_length"],
        idx_top_k=vals["attention.indexer.top_k"], kpool=kpool, select_tail=True,
        n_expert=geo.n_expert, n_expert_used=geo.n_expert_used, n_ff_exp=geo.n_ff_exp, n_ff_shexp=geo.n_ff_shexp,
        n_ff=tuple(geo.n_ff_dense if dn else 0 for dn in dense), recurrent=tuple(la.index in rl for la in geo.layers),
        n_tokens=-(-n_tokens // max(1, n_seq)) * max(1, n_seq), n_kv=cells,
        n_pool_real=cells // kpool * max(1, n_seq), n_seqs=max(1, n_seq),
        n_outputs=n_tokens, flash_attn=flash_attn, cache_el=_CACHE_EL.get(cache_type_k, 2),
        kv_host=not offload_kqv, n_stream=max(1, n_stream), cache_block=(cache_row_bytes(cache_type_k, 32), 32),
    )
    out_dev = next(iter(lay.output))
    gpus = [d for d in dict.fromkeys((*gpus, out_dev, *(d for ds in lay.experts for d in ds))) if d != "CPU"]
    if not gpus:
        return {"CPU": glm5next_host_peak(shape)}
    # a host layer followed by a GPU's (a partial -ngl) or the output on a GPU (-ngl 1): the fused HC
    # post is off for every layer (`fused_post`); routed experts alone on a GPU leave it on
    boundary = "CPU" in lay.homes and (set(lay.homes) != {"CPU"} or out_dev != "CPU")
    buf = {"CPU": CPU, **{d: (GPU if i == 0 else i + 1) for i, d in enumerate(gpus)}}
    shape = dataclasses.replace(shape, homes=tuple(buf[d] for d in lay.homes), fused_post=not boundary,
                                experts=tuple(tuple(buf[d] for d in ds) for ds in lay.experts),
                                out_home=buf[out_dev] if out_dev != lay.homes[-1] else -1,
                                copies=4 if pipeline else 1)
    if approximate and len(set(lay.homes)) > 1:
        runs_end = [il for il in range(n_layer) if il == n_layer - 1 or lay.homes[il + 1] != lay.homes[il]]
        keep = set(range(lead))
        start = 0
        for end in runs_end:
            keep.update(range(max(start, end + 1 - SEARCH_LAYERS), end + 1))
            start = end + 1
        kept = sorted(keep)

        def pick(t: tuple[T_, ...]) -> tuple[T_, ...]:
            return tuple(t[il] for il in kept) if t else t

        shape = dataclasses.replace(shape, n_ff=pick(shape.n_ff), recurrent=pick(shape.recurrent),
                                    homes=pick(shape.homes), experts=pick(shape.experts),
                                    cpu_experts=pick(shape.cpu_experts))
    peaks = glm5next_peaks(shape, 128 if gpus[0].startswith(("CUDA", "ROCm", "MUSA")) else 32)
    return {"CPU": peaks[CPU], **{d: peaks[buf[d]] for d in gpus}}
