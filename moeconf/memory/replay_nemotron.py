"""A replay of ggml-alloc (see `replay`) over Nemotron-3's graph (`nemotron_h_moe`): Mamba-2
layers, attention layers (no RoPE) and FFN-only layers with gate-less routed experts (squared
ReLU, optionally run in a latent: `ffn_latent_down` / `ffn_latent_up`) and a gate-less shared
expert, one kind per layer.

The node order is the graph's (a depth-first walk from each `ggml_build_forward_expand`), read
from the pinned llama.cpp: src/models/nemotron-h.cpp (`graph`, `build_attention_layer`,
`build_ffn_layer`), src/models/mamba-base.cpp (`build_mamba2_layer`), src/llama-graph.cpp
(`build_rs`, `build_attn` expanding Q, V, K, the K and V stores and the attention's output,
`build_moe_ffn` expanding the routing weights, the experts' output and their sum). What a layer
builds without expanding (a Mamba-2 layer's gate, D skip, gated norm and output projection; an
attention layer's output projection; an FFN layer's shared expert and latent up projection; every
layer's residual add) is walked only by the next expand, so a Mamba-2 layer's first expands (the
conv state's rows and the empty copy of the other sequences' rows, `build_rs`) come before the
previous layer's tail. Checked node by node against an instrumented ggml-alloc of the pinned build.

The replay covers what it was checked on (docs/memory-architectures.md, "Nemotron-3"): one or
several GPUs, the CPU running the first layers, routed experts on the CPU (up and down together
or either alone), pipeline parallelism, flash attention on or off, `-nkvo` on GPUs running every
layer and expert.
`unmodelled` names what else a placement or setting asks for; the estimate then refuses rather
than guess."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from moeconf.memory.replay import CPU, GPU, Graph, _Node, device_runs, host_layers

if TYPE_CHECKING:
    from moeconf.memory.geometry import Geometry
    from moeconf.memory.settings import MemorySettings
    from moeconf.placement import Placement

MAMBA, ATTENTION, FFN = "M", "A", "E"
UP_CPU, DOWN_CPU = 1, 2  # a layer's routed experts on the CPU, as bits
_ROUTED = ("ffn_up_exps", "ffn_down_exps")
# the `{arch}.*` keys the replay reads beyond recurrent.KEYS (moeconf.memory.support)
KEYS = frozenset({"moe_latent_size"})


@dataclass(frozen=True)
class NemotronShape:
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    latent: int  # moe_latent_size: the routed experts' width (0: n_embd, no latent projections)
    d_conv: int
    d_inner: int
    d_state: int
    n_group: int
    n_ssm_head: int
    kinds: tuple[str, ...]  # per layer: MAMBA, ATTENTION or FFN
    experts_cpu: tuple[int, ...]  # per layer: which of its routed experts run on the CPU (UP_CPU | DOWN_CPU)
    n_tokens: int
    n_kv: int  # KV cells the mask spans (per stream: the mask is n_kv x n_tokens over the streams)
    n_seqs: int = 1  # sequences in the worst-case ubatch: one state row each
    first: int = 0
    last: int = -1  # -1: every layer from `first` on, and the output
    after_cpu: bool = False  # the layers before `first` ran on the CPU
    # Hadamard rotations of Q/K and V for a quantized cache (replay_hybrid.rotation): the side, 0 = off
    rot_k: int = 0
    rot_v: int = 0
    # pipeline parallelism (GGML_SCHED_MAX_COPIES): each split input and graph input in this many
    # copies, allocated before any node and never freed
    copies: int = 1
    fa: bool = True  # flash attention; off: the KQ matrix, an f32 mask, V stored transposed
    # -nkvo: the KV cache and the Mamba-2 state in host memory (one GPU running the whole graph):
    # bytes of one cell's K and V rows, 0 when the cache is offloaded
    nkvo_k_row: int = 0
    nkvo_v_row: int = 0
    n_stream: int = 1  # KV streams (-np without a unified cache): -nkvo copies every stream's view
    n_outputs: int = 0  # the rows the output computes (0: n_tokens)

    def attn_inputs(self) -> tuple[tuple[str, int], ...]:
        """The attention layers' graph inputs in the order they read them: the Hadamard rotations
        of a quantized cache, the K and V cell indices (V transposed with flash attention off: one
        index per element), the mask (f16 with flash attention, else f32)."""
        T = self.n_tokens
        v_idx = 8 * T * (1 if self.fa else self.n_head_kv * self.head_v)
        rot = tuple((name, 4 * r * r) for name, r in (("k_rot", self.rot_k), ("v_rot", self.rot_v)) if r)
        return (*rot, ("k_idxs", 8 * T), ("v_idxs", v_idx), ("mask", (2 if self.fa else 4) * T * self.n_kv))


def nemotron_graph(s: NemotronShape) -> Graph:
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    m = s.latent or e
    used = s.n_expert_used
    ns = s.n_seqs
    n_layer = len(s.kinds)
    last = n_layer if s.last < 0 else s.last
    whole = s.first == 0 and last == n_layer
    leaves: dict[str, int] = {}
    chans = s.d_inner + 2 * s.n_group * s.d_state
    n_embd_r = (s.d_conv - 1) * chans
    n_embd_s = s.d_state * s.d_inner
    d_in_proj = 2 * s.d_inner + 2 * s.n_group * s.d_state + s.n_ssm_head
    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4  # the copy of the chosen ids (a strided view)

    def graph_input(name: str, size: int) -> int:
        if whole and name not in leaves:
            leaves[name] = g.leaf(size, CPU)
        return g.input(name, size, leaves.get(name, -1))

    def leaf(name: str, size: int) -> int:  # a graph input read on the CPU itself (-nkvo)
        if name not in leaves:
            leaves[name] = g.leaf(size, CPU)
        return leaves[name]

    if whole:
        tokens = g.leaf(f, CPU)
        g.leaf(e * f, CPU)  # the embeddings input, unused with token ids
        g.split(CPU)
        embd = g.op(e * f, tokens)
        g.split(GPU)
    # the previous layer's tail: it builds the residual stream's next value
    pending: Callable[[], int] | None = None
    inp = -1
    moe_in = -1  # the CPU layer's experts' sum, computed here (after_cpu)
    for il in range(s.first, last):
        kind = s.kinds[il]
        rows = s_copy = extra = -1
        if s.after_cpu and il == s.first and s.kinds[il - 1] == FFN:
            # the CPU layer's routed experts' weighting and sum run here ("expand GPU up"), on
            # copies of their output and weights, before this layer's first expands
            weighted = g.op(m * used * f, g.input("down", m * used * f), g.input("weights", used * f), inplace=True)
            moe_in = g.op(m * f, g.view(weighted), g.view(weighted))
            for _ in range(used - 2):
                moe_in = g.op(m * f, moe_in, g.view(weighted), inplace=True)
        if kind == MAMBA and s.nkvo_k_row:  # the state in host memory: its rows read on the CPU
            g.split(CPU)
            s_copy = leaf("s_copy_main", 4 * ns)
            rows = g.op(n_embd_r * 4 * ns, s_copy)
            g.op(0, g.zero(s_copy))
            g.split(GPU)
        elif kind == MAMBA:  # build_rs: the conv state's rows, the other sequences' (none) copied
            s_copy = graph_input("s_copy_main", 4 * ns)
            extra = g.zero_input("s_copy_extra")
            rows = g.op(n_embd_r * 4 * ns, s_copy)
            g.op(0, g.zero(extra))
        if pending is not None:
            inp = pending()
        elif il == 0:
            inp = g.input("embd", e * f, embd if whole else -1)
        elif s.after_cpu:
            inp = _after_cpu(g, s, moe_in)
        if inp < 0:  # the previous GPU ran this layer's first norm ("expand GPU down")
            norm = g.input("norm", e * f)
            res_in = -1  # copied from the previous GPU where the tail first reads it (`_residual`)
        else:
            norm = g.op(e * f, inp, inplace=True)
            res_in = inp
        cur = g.op(e * f, norm, inplace=True)  # attn_norm
        if kind == MAMBA and s.nkvo_k_row:
            pending = _mamba_nkvo(g, s, il, cur, res_in, rows, s_copy, d_in_proj, chans, n_embd_s)
        elif kind == MAMBA:
            pending = _mamba(g, s, cur, res_in, rows, s_copy, extra, d_in_proj, chans, n_embd_s)
        elif kind == ATTENTION and s.nkvo_k_row:
            pending = _attention_nkvo(g, s, il, cur, res_in, graph_input, leaf)
        elif kind == ATTENTION:
            pending = _attention(g, s, cur, res_in, graph_input)
        else:
            ne = s.n_expert * f
            probs = g.op(ne, g.op(ne, cur), inplace=True)  # router logits, sigmoid in place
            biased = g.op(ne, probs)  # + exp_probs_b (selection only)
            topk = g.view(g.op(ne, biased))  # ARGSORT, its top-k view
            w = g.op(used * f, g.view(probs), topk)  # GET_ROWS of the weights
            wsum = g.op(f, g.op(f, g.view(w)), inplace=True)  # SUM_ROWS, CLAMP
            w = g.op(used * f, g.view(w), wsum)  # DIV
            w = g.op(used * f, g.view(w))  # SCALE (expert_weights_scale)
            x = g.view(g.op(m * f, cur)) if s.latent else g.view(cur)  # ffn_latent_down
            ffe = s.n_ff_exp * used * f
            cpu = s.experts_cpu[il]
            if cpu == UP_CPU | DOWN_CPU:
                g.split(CPU)
                xc = g.input(("x", il), m * f, x)
                tc = g.input(("topk", il), tk, topk)
                up = g.op(ffe, g.op(ffe, g.op(ffe, xc, tc), inplace=True), inplace=True)  # up, ReLU, square
                down = g.op(m * used * f, up, tc)
                g.split(GPU)
                down = g.input(("down", il), m * used * f, down)
            elif cpu == UP_CPU:  # the ReLU and square run where the down projection does
                g.split(CPU)
                up = g.op(ffe, g.input(("x", il), m * f, x), g.input(("topk", il), tk, topk))
                g.split(GPU)
                up = g.op(ffe, g.op(ffe, g.input(("up", il), ffe, up), inplace=True), inplace=True)
                down = g.op(m * used * f, up, topk)
            elif cpu == DOWN_CPU:
                up = g.op(ffe, g.op(ffe, g.op(ffe, x, topk), inplace=True), inplace=True)
                g.split(CPU)
                down = g.op(m * used * f, g.input(("act", il), ffe, up), g.input(("topk", il), tk, topk))
                g.split(GPU)
                down = g.input(("down", il), m * used * f, down)
            else:
                up = g.op(ffe, g.op(ffe, g.op(ffe, x, topk), inplace=True), inplace=True)
                down = g.op(m * used * f, up, topk)
            weighted = g.op(m * used * f, down, w, inplace=True)
            moe = g.op(m * f, g.view(weighted), g.view(weighted))
            for _ in range(used - 2):
                moe = g.op(m * f, moe, g.view(weighted), inplace=True)
            pending = _ffn_tail(g, s, cur, res_in, moe)
    assert pending is not None
    out = pending()
    if last == n_layer:
        fo = 4 * (s.n_outputs or T)
        x = g.op(e * f, g.op(e * f, out, inplace=True), inplace=True, output=True)  # output norm (t_h_nextn)
        rows_out = g.op(e * fo, x, graph_input("out_ids", fo))
        g.op(s.n_vocab * fo, rows_out, output=True)
    else:
        g.op(0, g.op(e * f, out))  # the next GPU's first norm runs here; it copies it and the residual
        g.op(0, out)
    if s.copies > 1:
        _pin_inputs(g, s.copies)
    g.finish()
    return g


def _pin_inputs(g: Graph, copies: int) -> None:
    """Pipeline parallelism (ggml-backend.cpp, ggml_backend_sched_split_graph passes 5 and 6, and
    the graph copy): every split input and graph input gets `copies` copies flagged input and
    output, added to the graph as leafs, so ggml-alloc allocates them all before the first node
    (ggml_gallocr_alloc_graph_impl allocates leafs first) and never frees them."""
    pinned = sorted(set(g._copies.values()) | {i for i, n in enumerate(g.nodes) if n.order == (-1, 0)})
    for i in pinned:
        n = g.nodes[i]
        n.order, n.output = (-1, 0), True
        for _ in range(copies - 1):
            g.nodes.append(_Node(n.size, (), -1, False, True, n.buf, (-1, 0)))


def _after_cpu(g: Graph, s: NemotronShape, moe: int) -> int:
    """The first GPU layer's input after a layer run on the CPU: that layer's weightless tail runs
    here on copies ("expand GPU up" in ggml_backend_sched_split_graph): after an FFN layer, the
    experts' sum (already built; with latent experts copied back to the CPU for ffn_latent_up,
    whose output comes here) plus the shared expert's output, then the residual add; after a Mamba-2 or
    attention layer, the residual add of its output projection. Traced on an FFN layer
    (llama-fit-params -ngl 30); the others follow the same rule."""
    f, e = 4 * s.n_tokens, s.n_embd
    g.split(CPU)  # the CPU layer's shared expert (or output projection)
    if moe >= 0 and s.latent:
        g.input("moe_sum", s.latent * f, moe)  # copied back for ffn_latent_up (CPU)
    g.split(GPU)
    if moe >= 0 and s.latent:
        out = g.op(e * f, g.input("moe_out", e * f), g.input("shexp", e * f), inplace=True)
    elif moe >= 0:
        out = g.op(e * f, moe, g.input("shexp", e * f), inplace=True)
    else:
        out = g.input("layer_out", e * f)
    return g.op(e * f, out, g.input("l_out", e * f), inplace=True)


def _residual(g: Graph, s: NemotronShape, res_in: int) -> int:
    """The residual stream a layer's tail adds to: after another GPU's layer, its copy, made where
    the tail first reads it (the split's inputs are copied in the order its nodes first use them)."""
    return res_in if res_in >= 0 else g.input("l_out", s.n_embd * 4 * s.n_tokens)


def _mamba(g: Graph, s: NemotronShape, cur: int, res_in: int, rows: int, s_copy: int, extra: int, d_in_proj: int,
           chans: int, n_embd_s: int) -> Callable[[], int]:
    T, f, ns = s.n_tokens, 4 * s.n_tokens, s.n_seqs
    zx = g.op(d_in_proj * f, cur)  # ssm_in: z, xBC, dt
    conv_in = g.op((T + (s.d_conv - 1) * ns) * chans * 4, g.view(rows), g.view(zx))  # CONCAT
    g.op(0, g.view(conv_in))  # the last columns copied into the conv state
    conv = g.op(chans * f, conv_in)  # SSM_CONV
    conv = g.op(chans * f, conv, inplace=True)  # + bias
    conv = g.op(chans * f, conv, inplace=True)  # SiLU
    dt = g.op(s.n_ssm_head * f, g.view(zx))  # CONT
    dt = g.op(s.n_ssm_head * f, dt, inplace=True)  # + dt bias
    scan = g.op((s.d_inner * T + n_embd_s * ns) * 4, g.view(conv), dt, g.view(conv), g.view(conv), s_copy)
    g.op(0, g.zero(extra))  # the other sequences' SSM rows (none)
    g.op(0, g.view(scan))  # the new state copied into the cache
    return _mamba_tail(g, s, zx, conv, scan, res_in)


def _mamba_tail(g: Graph, s: NemotronShape, zx: int, conv: int, scan: int, res_in: int) -> Callable[[], int]:
    f = 4 * s.n_tokens

    def tail() -> int:
        z = g.op(s.d_inner * f, g.view(zx))  # CONT of z
        y = g.op(s.d_inner * f, g.view(conv))  # x * D
        y = g.op(s.d_inner * f, g.view(scan), y, inplace=True)
        y = g.op(s.d_inner * f, z, y)  # SWIGLU
        y = g.op(s.d_inner * f, g.op(s.d_inner * f, g.view(y)), inplace=True)  # grouped RMS norm
        o = g.op(s.n_embd * f, g.view(y))  # ssm_out
        return g.op(s.n_embd * f, o, _residual(g, s, res_in), inplace=True)

    return tail


def _mamba_nkvo(g: Graph, s: NemotronShape, il: int, cur: int, res_in: int, rows: int, s_copy: int,
                d_in_proj: int, chans: int, n_embd_s: int) -> Callable[[], int]:
    """A Mamba-2 layer with its state in host memory (-nkvo): the conv state's rows come from the
    CPU, the last columns go back to it (a copy of the strided view), the SSM scan runs here on a
    copy of the whole SSM state (and a second one for the other sequences' empty GET_ROWS), and
    the new state is copied back. Traced on Nemotron-3-Nano (llama-fit-params -nkvo)."""
    T, f, ns = s.n_tokens, 4 * s.n_tokens, s.n_seqs
    zx = g.op(d_in_proj * f, cur)
    conv_in = g.op((T + (s.d_conv - 1) * ns) * chans * 4,
                   g.view(g.input(("rows", il), (s.d_conv - 1) * chans * 4 * ns, rows)), g.view(zx))
    nb1 = (T // ns + s.d_conv - 1) * 4
    last_cols = 4 + (s.d_conv - 2) * 4 + (chans - 1) * nb1 + (ns - 1) * nb1 * chans  # the view's nbytes
    g.split(CPU)
    g.op(0, g.input(("conv_last", il), last_cols, g.view(conv_in)))
    g.split(GPU)
    conv = g.op(chans * f, g.op(chans * f, g.op(chans * f, conv_in), inplace=True), inplace=True)
    dt = g.op(s.n_ssm_head * f, g.op(s.n_ssm_head * f, g.view(zx)), inplace=True)
    state = g.input(("ssm_state", il), n_embd_s * 4 * ns)
    scan = g.op((s.d_inner * T + n_embd_s * ns) * 4, state, g.view(conv), dt, g.view(conv), g.view(conv),
                g.input("s_copy_main", 4 * ns, s_copy))
    empty = g.zero(g.input(("ssm_state_rows", il), n_embd_s * 4 * ns), g.zero_input("s_copy_extra"))
    g.split(CPU)
    empty_copy = g.input(("empty", il), 0, empty)
    g.zeros.add(empty_copy)
    g.op(0, empty_copy)
    g.op(0, g.input(("new_state", il), n_embd_s * 4 * ns, g.view(scan)))
    g.split(GPU)
    return _mamba_tail(g, s, zx, conv, scan, res_in)


def _qvk(g: Graph, s: NemotronShape, cur: int, graph_input: Callable[[str, int], int]) -> tuple[int, int, int]:
    """An attention layer's Q, V and K projections in the graph's order, each rotated (Hadamard)
    where the cache type asks for it."""
    f = 4 * s.n_tokens
    hq, hkv, hv = s.n_head * s.head_k, s.n_head_kv * s.head_k, s.n_head_kv * s.head_v
    q = g.op(hq * f, cur)
    if s.rot_k:
        q = g.op(hq * f, g.view(q), graph_input("k_rot", 4 * s.rot_k * s.rot_k))
    v = g.op(hv * f, cur)
    if s.rot_v:
        v = g.op(hv * f, g.view(v), graph_input("v_rot", 4 * s.rot_v * s.rot_v))
    k = g.op(hkv * f, cur)
    if s.rot_k:
        k = g.op(hkv * f, g.view(k), graph_input("k_rot", 4 * s.rot_k * s.rot_k))
    return q, v, k


def _attention_nkvo(g: Graph, s: NemotronShape, il: int, cur: int, res_in: int,
                    graph_input: Callable[[str, int], int], leaf: Callable[[str, int], int]) -> Callable[[], int]:
    """An attention layer with its KV cache in host memory (-nkvo, flash attention): K and V are
    copied to the CPU and stored there (SET_ROWS), and the attention runs here on copies of the
    whole cache's K and V views and of the mask."""
    T, f = s.n_tokens, 4 * s.n_tokens
    hkv, hv = s.n_head_kv * s.head_k, s.n_head_kv * s.head_v
    q, v, k = _qvk(g, s, cur, graph_input)
    kview = g.view(k)
    g.split(CPU)
    g.op(0, g.input(("k", il), hkv * f, kview), leaf("k_idxs", 8 * T))
    g.op(0, g.input(("v", il), hv * f, g.view(v)), leaf("v_idxs", 8 * T))
    g.split(GPU)
    cells = s.n_kv * s.n_stream
    attn = g.op(s.n_head * s.head_v * f, g.view(q), g.input(("k_cache", il), cells * s.nkvo_k_row),
                g.input(("v_cache", il), cells * s.nkvo_v_row), graph_input("mask", 2 * T * s.n_kv))

    def tail() -> int:
        a = attn
        if s.rot_v:
            a = g.op(s.n_head * s.head_v * f, g.view(a), graph_input("v_rot", 4 * s.rot_v * s.rot_v))
        o = g.op(s.n_embd * f, g.view(a))
        return g.op(s.n_embd * f, o, _residual(g, s, res_in), inplace=True)

    return tail


def _attention(g: Graph, s: NemotronShape, cur: int, res_in: int,
               graph_input: Callable[[str, int], int]) -> Callable[[], int]:
    T, f = s.n_tokens, 4 * s.n_tokens
    q, v, k = _qvk(g, s, cur, graph_input)
    sizes = dict(s.attn_inputs())
    g.op(0, g.view(k), graph_input("k_idxs", sizes["k_idxs"]))
    g.op(0, g.view(v), graph_input("v_idxs", sizes["v_idxs"]))
    mask = graph_input("mask", sizes["mask"])
    if s.fa:
        attn = g.op(s.n_head * s.head_v * f, g.view(q), mask)
    else:  # build_attn_mha: KQ, its soft_max in place, KQV, the permuted result made contiguous
        kq = g.op(s.n_kv * T * s.n_head * 4, g.view(q))
        kq = g.op(s.n_kv * T * s.n_head * 4, kq, mask, inplace=True)
        attn = g.op(s.n_head * s.head_v * f, g.view(g.op(s.n_head * s.head_v * f, kq)))

    def tail() -> int:
        a = attn
        if s.rot_v:
            a = g.op(s.n_head * s.head_v * f, g.view(a), graph_input("v_rot", 4 * s.rot_v * s.rot_v))
        o = g.op(s.n_embd * f, g.view(a))  # wo
        return g.op(s.n_embd * f, o, _residual(g, s, res_in), inplace=True)

    return tail


def _ffn_tail(g: Graph, s: NemotronShape, cur: int, res_in: int, moe: int) -> Callable[[], int]:
    f, e = 4 * s.n_tokens, s.n_embd

    def tail() -> int:
        out = g.op(e * f, moe) if s.latent else moe  # ffn_latent_up
        ffs = s.n_ff_shexp * f
        sh = g.op(ffs, g.op(ffs, g.op(ffs, cur), inplace=True), inplace=True)  # up, ReLU, square
        out = g.op(e * f, out, g.op(e * f, sh), inplace=True)
        return g.op(e * f, out, _residual(g, s, res_in), inplace=True)

    return tail


@dataclass(frozen=True)
class HostShape:
    """The host's share where several GPUs run the layers and the CPU some routed experts."""

    n_embd: int
    n_tokens: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    latent: int
    # per layer: the GPU running it (1, 2, ...), the graph inputs it reads (name, bytes), which of
    # its routed experts run on the CPU (UP_CPU | DOWN_CPU)
    layers: tuple[tuple[int, tuple[tuple[str, int], ...], int], ...]


def host_graph(s: HostShape) -> Graph:
    """The host's buffer: the graph inputs (each freed once the last GPU reading it copied it), the
    token embeddings' rows and the routed experts' CPU splits, as `nemotron_graph` places them
    (`replay.host_layers` walks the GPUs' splits)."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    m = s.latent or s.n_embd
    used = s.n_expert_used
    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4
    ffe = s.n_ff_exp * used * f
    for il, gpu, cpu in host_layers(g, s.layers, s.n_embd, T, s.n_embd):
        if not cpu:
            continue
        g.split(CPU)
        if cpu == UP_CPU | DOWN_CPU:
            up = g.op(ffe, g.op(ffe, g.op(ffe, g.input(("x", il), m * f), g.input(("topk", il), tk)),
                                inplace=True), inplace=True)
            down = g.op(m * used * f, up, g.input(("topk", il), tk))
            g.split(gpu)
            g.input(("down", il), m * used * f, down)
        elif cpu == UP_CPU:
            up = g.op(ffe, g.input(("x", il), m * f), g.input(("topk", il), tk))
            g.split(gpu)
            g.input(("up", il), ffe, up)
        else:
            down = g.op(m * used * f, g.input(("act", il), ffe), g.input(("topk", il), tk))
            g.split(gpu)
            g.input(("down", il), m * used * f, down)
    g.finish()
    return g


@dataclass(frozen=True)
class NkvoHostShape:
    """The host's share with -nkvo where several GPUs run the layers: per layer (its GPU 1, 2,
    ..., its kind) and the graph's sizes."""

    shape: NemotronShape
    layers: tuple[tuple[int, str], ...]


def nkvo_host_graph(h: NkvoHostShape) -> Graph:
    """The host's buffer with the state and the KV cache in host memory (as `_mamba_nkvo` and
    `_attention_nkvo` place the ops): the graph inputs, the embeddings' rows, per Mamba-2 layer
    the conv state's rows (kept until its GPU copied them), the copy of the conv input's last
    columns and of the new SSM state (each freed once stored), per attention layer the copies
    of K and V stored by SET_ROWS (reading the K and V indices here, never copied)."""
    s = h.shape
    g = Graph()
    T, f, e, ns = s.n_tokens, 4 * s.n_tokens, s.n_embd, s.n_seqs
    chans = s.d_inner + 2 * s.n_group * s.d_state
    rows_bytes = (s.d_conv - 1) * chans * 4 * ns
    nb1 = (T // ns + s.d_conv - 1) * 4
    last_cols = 4 + (s.d_conv - 2) * 4 + (chans - 1) * nb1 + (ns - 1) * nb1 * chans
    kinds = [k for _, k in h.layers]
    tokens = g.leaf(f, CPU)
    g.leaf(e * f, CPU)  # the embeddings input, unused with token ids
    sizes = dict(s.attn_inputs())
    leaves = {name: g.leaf(size, CPU) for name, size in (
        ("s_copy", 4 * ns if MAMBA in kinds else 0), ("k_idxs", sizes["k_idxs"]), ("v_idxs", sizes["v_idxs"]),
        ("mask", sizes["mask"]),
        ("out_ids", 4 * (s.n_outputs or T))) if size and (ATTENTION in kinds or name in ("s_copy", "out_ids"))}
    rots = [(name, n) for name, n in s.attn_inputs() if name.endswith("_rot")]
    for name, n in rots:
        leaves[name] = g.leaf(n, CPU)
    g.split(CPU)
    embd = g.op(e * f, tokens)
    gpu = -1
    for il, (dev, kind) in enumerate(h.layers):
        rows = -1
        if kind == MAMBA:
            g.split(CPU)
            rows = g.op(rows_bytes, leaves["s_copy"])
            g.op(0, g.zero(leaves["s_copy"]))
        g.split(dev)
        if dev != gpu:
            gpu = dev
            g.input("embd" if il == 0 else ("l_out", il), e * f, embd if il == 0 else -1)
        if kind == MAMBA:
            g.input(("rows", il), rows_bytes, rows)
            g.split(CPU)
            g.op(0, g.input(("conv_last", il), last_cols))
            g.split(dev)
            g.input("s_copy", 4 * ns, leaves["s_copy"])
            g.split(CPU)
            empty = g.input(("empty", il), 0)
            g.zeros.add(empty)
            g.op(0, empty)
            g.op(0, g.input(("new_state", il), s.d_state * s.d_inner * 4 * ns))
            g.split(dev)
        elif kind == ATTENTION:
            for name, n in rots:
                g.input(name, n, leaves[name])
            g.split(CPU)
            g.op(0, g.input(("k", il), s.n_head_kv * s.head_k * f), leaves["k_idxs"])
            g.op(0, g.input(("v", il), s.n_head_kv * s.head_v * f), leaves["v_idxs"])
            g.split(dev)
            g.input("mask", sizes["mask"], leaves["mask"])
    g.input("out_ids", 4 * (s.n_outputs or T), leaves["out_ids"])
    g.finish()
    return g


@lru_cache(maxsize=64)
def nkvo_host_peak(h: NkvoHostShape) -> int:
    bufs = max(CPU, *(dev for dev, _ in h.layers)) + 1
    return nkvo_host_graph(h).peaks(tuple([32] * bufs))[CPU]


@lru_cache(maxsize=256)
def host_peak(s: HostShape) -> int:
    bufs = max(CPU, *(dev for dev, _, _ in s.layers)) + 1
    return host_graph(s).peaks(tuple([32] * bufs))[CPU]


@lru_cache(maxsize=512)
def nemotron_peaks(s: NemotronShape, alignment: int) -> tuple[int, int]:
    """(GPU, CPU) compute buffer sizes; CPU is the host's only for the whole graph."""
    gpu, cpu = nemotron_graph(s).peaks((alignment, 32))
    return gpu, cpu


def layer_kinds(placement: Placement) -> tuple[str, ...]:
    """Each trunk layer's kind, as the pinned loader decides it (memory/recurrent.py); the MTP
    block after the trunk (`nextn_predict_layers`) is not in the trunk's graph (the loader skips
    its tensors, graph::graph runs the first n_layer() blocks)."""
    from moeconf.memory.recurrent import recurrent_layers

    inv = placement.inventory
    ff = inv.metadata.hparam("feed_forward_length")
    nextn = inv.metadata.hparam("nextn_predict_layers")
    recurrent = recurrent_layers(inv)
    out = []
    for il in range(inv.metadata.block_count - (nextn if isinstance(nextn, int) else 0)):
        width = ff[il] if isinstance(ff, tuple) and il < len(ff) else ff
        out.append(MAMBA if il in recurrent else ATTENTION if not width else FFN)
    return tuple(out)


@dataclass(frozen=True)
class _Layout:
    kinds: tuple[str, ...]
    dev_of: tuple[str, ...]  # each layer's device (its non-expert tensors)
    experts_cpu: tuple[int, ...]


def _layout(placement: Placement, geo: Geometry) -> _Layout | str:
    """Where each layer runs, or why the replay does not cover this placement."""
    from moeconf.engines import AUTO_GPU

    inv = placement.inventory
    kinds = layer_kinds(placement)
    n_layer = len(kinds)
    if [la.index for la in geo.layers] != list(range(n_layer)) or not n_layer:
        return "its layers are not one trunk"
    home: dict[int, set[str | None]] = defaultdict(set)
    routed: dict[int, dict[str, str | None]] = defaultdict(dict)
    for t in inv.tensors:
        if t.layer is None or t.layer >= n_layer:
            continue
        if t.base in _ROUTED:
            routed[t.layer][t.base] = placement.devices[t.name]
        else:
            home[t.layer].add(placement.devices[t.name])
    md = inv.metadata
    if any(isinstance(md.hparam(k), tuple) for k in ("expert_used_count", "expert_feed_forward_length")) or len(
            {t.shape for t in inv.tensors if t.base == "ffn_up_exps"}) > 1:
        return "experts that differ per layer (Nemotron-3 Puzzle's per-layer expert widths and counts)"
    if (md.expert_used_count or 0) < 2:
        return "fewer than two routed experts per token"
    dev_of: list[str] = []
    cpu: list[int] = []
    for il, kind in enumerate(kinds):
        devs = home[il]
        if AUTO_GPU in devs:
            return "layers the engine splits over the GPUs by free memory (give -ts)"
        if len(devs) != 1 or None in devs:
            return f"layer {il}'s tensors split between devices"
        d = next(iter(devs))
        assert d is not None
        where = set(routed[il].values())
        if kind == FFN and (len(routed[il]) != 2 or f"blk.{il}.ffn_gate_inp.weight" not in inv.by_name):
            return f"layer {il} is an FFN layer without gate-less routed experts (a dense MLP)"
        if kind == FFN and not where <= {d, "CPU"}:
            return (f"layer {il}'s routed experts are on another GPU (ffn_up_exps on "
                    f"{routed[il].get('ffn_up_exps')}, ffn_down_exps on {routed[il].get('ffn_down_exps')}, "
                    f"the layer on {d})")
        dev_of.append(d)
        bits = 0
        if kind == FFN and d != "CPU":
            bits = (UP_CPU if routed[il]["ffn_up_exps"] == "CPU" else 0) | (
                DOWN_CPU if routed[il]["ffn_down_exps"] == "CPU" else 0)
        cpu.append(bits)
    return _Layout(kinds, tuple(dev_of), tuple(cpu))


def unmodelled(placement: Placement, geo: Geometry, settings: MemorySettings, pipeline: bool) -> list[str]:
    """Why Nemotron-3's compute is not replayed for this placement and these settings (empty: it is)."""
    why = []
    if not settings.offload_kqv and settings.flash_attn == "off":
        why.append("-nkvo and -fa off together")
    lay = _layout(placement, geo)
    if isinstance(lay, str):
        why.append(lay)
    else:
        runs = device_runs(lay.dev_of)
        gpus = [r for r in runs if r[0] != "CPU"]
        if len({r[0] for r in gpus}) != len(gpus):
            why.append("a GPU runs two separate ranges of layers")
        if any(r[0] == "CPU" for r in runs[1:]):
            why.append("the CPU runs layers after a GPU's")
        if runs[0][0] == "CPU" and len(gpus) > 1 and any(lay.experts_cpu):
            # the later GPUs' graph inputs stay in host memory across the first GPU's expert splits:
            # Nemotron-3-Super -ngl 60 -ts 1,1 -ot exps=CPU -ctk/-ctv q8_0 measured 263.59 MiB, the
            # CPU layers' share 234.59 (not replayed)
            why.append("the CPU running the first layers, several GPUs and routed experts on the CPU")
        if runs[0][0] == "CPU" and any(lay.experts_cpu) and FFN not in lay.kinds[:runs[0][2]]:
            # the host's buffer is the CPU layers' share when they include an FFN layer (its
            # experts' activations are the larger; measured -ngl 30/40/45/51 with experts on the CPU)
            why.append("the CPU running the first layers, none of them an FFN layer, and routed experts of "
                       "later ones")
        if not gpus:
            why.append("no GPU (the CPU runs every layer)")
        from moeconf.memory.classic import output_device
        if gpus and output_device(placement) != gpus[-1][0]:
            why.append("the output on another device than the last layer")
        if placement.devices.get("token_embd.weight") not in ("CPU", None):
            why.append("token_embd on a GPU")
        if not settings.offload_kqv and (runs[0][0] == "CPU" or any(lay.experts_cpu)):
            why.append("-nkvo (the state and the KV cache in host memory) with the CPU running layers or routed "
                       "experts")
    if not why:
        return []
    return [f"memory is not modelled for nemotron_h_moe with {w}: Nemotron-3's compute is replayed only for the "
            "placements and settings checked (moeconf/memory/replay_nemotron.py)" for w in why]


def replayed_nemotron(placement: Placement, geo: Geometry, n_tokens: int, cells: int, n_seq: int,
                      ctk: str, ctv: str, copies: int = 1, fa: bool = True, offload_kqv: bool = True,
                      n_stream: int = 1, n_outputs: int = 0) -> dict[str, int]:
    """Each device's compute buffer (the host's too) by the replay, for a placement `unmodelled`
    accepts."""
    from moeconf.memory.recurrent import shape
    from moeconf.memory.replay_hybrid import rotation

    # the worst-case ubatch holds n_seq equal sequences of ceil(n_tokens / n_seq) tokens
    # (llama-context.cpp graph_reserve; measured: -ub 512 -np 3 builds 513 tokens), the output
    # the ubatch's n_tokens rows (llama-server's fewer: settings.n_outputs)
    n_outputs = n_outputs or n_tokens
    n_tokens = -(-n_tokens // max(1, n_seq)) * max(1, n_seq)
    lay = _layout(placement, geo)
    rs = shape(placement.inventory)
    assert not isinstance(lay, str) and rs is not None
    attn = [la for la in geo.layers if lay.kinds[la.index] == ATTENTION] or list(geo.layers)
    n_head, n_head_kv, head_k, head_v = attn[0].n_head, attn[0].n_head_kv, attn[0].head_k, attn[0].head_v
    latent = placement.inventory.metadata.hparam("moe_latent_size")
    runs = device_runs(lay.dev_of)
    k_row = v_row = 0
    if not offload_kqv:  # the cache's rows in host memory, copied whole (memory/settings.py cache types)
        from moeconf.memory.settings import CACHE_TYPES

        def row(cache_type: str, n: int) -> int:
            size, block = CACHE_TYPES[cache_type]
            return (n + block - 1) // block * size

        k_row, v_row = row(ctk, n_head_kv * head_k), row(ctv, n_head_kv * head_v)
    out: dict[str, int] = {}
    for d, first, end in runs:
        head = d == "CPU"  # the CPU running the first layers (partial -ngl)
        shape_ = NemotronShape(
            n_embd=geo.n_embd, n_vocab=geo.n_vocab, n_head=n_head, n_head_kv=n_head_kv, head_k=head_k, head_v=head_v,
            n_expert=geo.n_expert, n_expert_used=geo.n_expert_used, n_ff_exp=geo.n_ff_exp, n_ff_shexp=geo.n_ff_shexp,
            latent=latent if isinstance(latent, int) else 0, d_conv=rs.d_conv, d_inner=rs.d_inner,
            d_state=rs.d_state, n_group=rs.n_group, n_ssm_head=rs.n_v_heads, kinds=lay.kinds,
            experts_cpu=lay.experts_cpu, n_tokens=n_tokens, n_kv=cells, n_seqs=max(1, n_seq), first=first,
            last=-1 if end == len(lay.kinds) else end, after_cpu=first > 0 and lay.dev_of[first - 1] == "CPU",
            rot_k=rotation(ctk, head_k, True), rot_v=rotation(ctv, head_v, False), copies=copies, fa=fa,
            nkvo_k_row=k_row, nkvo_v_row=v_row, n_stream=n_stream, n_outputs=n_outputs)
        gpu, host = nemotron_peaks(shape_, 128 if d.startswith(("CUDA", "ROCm", "MUSA")) else 32)
        if head:
            # its share of the graph in its own buffer, plus the unused embeddings input (as
            # archgraph.cpu_head for the classic MoEs) and the graph inputs its layers do not read
            # (allocated first, freed when a GPU copies them): measured 109.01 MiB, replayed 109.008
            out["CPU"] = gpu + 4 * n_tokens * geo.n_embd + _unread_inputs(shape_, lay.kinds[:end])
            continue
        out[d] = gpu
        if first == 0 and end == len(lay.kinds):
            out["CPU"] = host
    if copies > 1:
        out["CPU"] = _pipeline_host(shape_, lay, copies)
    elif len(runs) > 1 and runs[0][0] != "CPU" and k_row:  # several GPUs, -nkvo
        ids: dict[str, int] = {}
        for d in lay.dev_of:
            ids.setdefault(d, 0 if not ids else len(ids) + 1)  # buffer 1 is the host's
        out["CPU"] = nkvo_host_peak(NkvoHostShape(shape_, tuple((ids[d], k) for d, k in zip(
            lay.dev_of, lay.kinds, strict=True))))
    elif len(runs) > 1 and runs[0][0] != "CPU":  # several GPUs: the host's share by replay.host_layers
        gpu_ids: dict[str, int] = {}
        layers = []
        for il, (kind, d) in enumerate(zip(lay.kinds, lay.dev_of, strict=True)):
            gpu_ids.setdefault(d, 0 if not gpu_ids else len(gpu_ids) + 1)  # buffer 1 is the host's
            if kind == MAMBA:
                reads: tuple[tuple[str, int], ...] = (("s_copy", 4 * max(1, n_seq)),)
            elif kind == ATTENTION:
                reads = shape_.attn_inputs()
            else:
                reads = ()
            layers.append((gpu_ids[d], reads, lay.experts_cpu[il]))
        out["CPU"] = host_peak(HostShape(geo.n_embd, n_tokens, geo.n_expert, geo.n_expert_used, geo.n_ff_exp,
                                         shape_.latent, tuple(layers)))
    return out


def _unread_inputs(s: NemotronShape, kinds: tuple[str, ...]) -> int:
    """Bytes of the graph inputs no layer of `kinds` reads (the output's row ids always)."""
    def a(n: int) -> int:
        return (n + 31) // 32 * 32

    out = a(4 * (s.n_outputs or s.n_tokens))
    if MAMBA in s.kinds and MAMBA not in kinds:
        out += a(4 * s.n_seqs)
    if ATTENTION in s.kinds and ATTENTION not in kinds:
        out += sum(a(n) for _, n in s.attn_inputs())
    return out


def _pipeline_host(s: NemotronShape, lay: _Layout, copies: int) -> int:
    """The host's buffer under pipeline parallelism with every layer on GPUs: each graph input in
    `copies` copies, never freed, plus the token embeddings' rows (measured 154.30 MiB on
    Nemotron-3-Nano over two GPUs at -c 32768)."""
    f = 4 * s.n_tokens

    def a(n: int) -> int:
        return (n + 31) // 32 * 32

    inputs = [f, s.n_embd * f, 4 * (s.n_outputs or s.n_tokens)]  # tokens, the embeddings input, out_ids
    if MAMBA in lay.kinds:
        inputs.append(4 * s.n_seqs)
    if ATTENTION in lay.kinds:
        inputs += [n for _, n in s.attn_inputs()]
    return copies * sum(a(n) for n in inputs) + a(s.n_embd * f)
