"""A node-by-node replay of ggml-alloc over the DSA graphs (DeepSeek-V3.2 `deepseek32`, GLM-5
`glm-dsa`), whose compute buffers the phase model cannot place (issue 17).

llama.cpp 0.3.36 builds each layer (`src/models/deepseek32.cpp`, `glm-dsa.cpp`, graph::graph) as
the MLA attention of deepseek2 preceded by the lightning indexer, with the fused indexer
(`cparams.fused_lid` is true and never resolved off: `src/llama-context.cpp`):

- the indexer's K (a matmul, NORM, its weight and bias, RoPE of a view, the Hadamard rotation
  `attn_inp_k_rot`), stored into the indexer K cache before the attention;
- the indexer's Q (from the normed Q-LoRA), RoPE, rotation, and its head weights (a matmul, a SCALE
  of a view); `LIGHTNING_INDEXER` writes the scores, `n_kv x n_ubatch` f32, read against the
  indexer's own f16 mask, then TOP_K and a CONT of `top_k x n_ubatch` i32;
- `build_attn` for `llm_graph_input_attn_k_dsa` (`src/llama-graph.cpp`): a FILL of the MLA mask
  (`n_kv x n_ubatch` f16), a SET_ROWS of zeros (a graph leaf of `top_k x n_ubatch` f32 per layer,
  allocated with the graph's leaves before any node runs and filled in place) at the top-k,
  and an ADD of the original mask before flash attention.

Every layer's zeros leaf is allocated at the start of its buffer: the holes they leave when each
layer frees its own decide where later tensors land, which is why a phase model was 110 MiB off
in steps. The node lists were read off an instrumented ggml-alloc (every allocation's offset,
size and name, every free and in-place reuse) of `llama-fit-params -fitp on` on sparse
DeepSeek-V3.2 and GLM-5 layouts, and replay its offsets exactly (`tests/test_memory_dsa.py`
holds them to the recorded figures). The allocator's rules are `replay.Graph`'s."""

from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

from moeconf.engines import AUTO_GPU
from moeconf.memory.classic import output_device
from moeconf.memory.geometry import Geometry
from moeconf.memory.indexer import DSA_ARCHS, full_indexers, indexer_width
from moeconf.memory.replay import CPU, GPU, Graph, HostShape, _Node, device_runs, host_peak, split_experts
from moeconf.memory.replay_hybrid import ALL_CPU, DOWN_CPU, GATE_CPU, UP_CPU, HybridHostShape, hybrid_host_peak
from moeconf.model.inventory import Inventory
from moeconf.model.percache import per_inventory
from moeconf.placement import Placement


@dataclass(frozen=True)
class DsaShape:
    """What a DSA graph's tensor sizes depend on, for the GPU running layers `first` to `last` - 1."""

    n_embd: int
    n_vocab: int
    n_head: int
    q_lora: int  # Q-LoRA rank (attn_q_a's width)
    kv_lora: int
    head_k: int  # per-head query width before absorption (nope + rope)
    n_rot: int
    head_v: int
    idx_head: int  # indexer head width (attention.indexer.key_length)
    idx_heads: int  # indexer heads (indexer.proj's width)
    top_k: int  # min(attention.indexer.top_k, n_kv)
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    weights_scaled: bool  # expert_weights_scale not 0 or 1: a SCALE of the routing weights
    n_ff: tuple[int, ...]  # per layer: the dense FFN's width, 0 for a MoE layer
    experts_cpu: tuple[int, ...]  # per layer: which of its routed experts run on the CPU (GATE_CPU | UP_CPU | DOWN_CPU)
    n_tokens: int
    n_kv: int
    first: int = 0
    last: int = -1  # -1: every layer from `first` on, and the output
    after_cpu: bool = False  # the layer before `first` ran wholly on the CPU (else on another GPU)
    copies: int = 1  # the scheduler's copies of every input (4 with pipeline parallelism)
    host_head: bool = False  # this is the CPU running layers 0 to `last` - 1 whole (a partial -ngl)
    flash_attn: bool = True
    kv_el: int = 2  # bytes per K cache element (flash attention off: V is copied out of it)
    last_gpu: int = 0  # with `host_head`: the first layer of the last GPU's run (it copies the graph inputs last)
    # per layer: whether it runs its own indexer (glm-dsa's attention.indexer.types; empty: every layer);
    # a "shared" layer reads the top-k of the last full layer before it, which stays alive until then
    full: tuple[bool, ...] = ()


def _set_rows_view(g: Graph, target_view: int, *srcs: int) -> int:
    """SET_ROWS into a tensor of this buffer: its result is a view of that tensor (`view_src`)."""
    n = g.nodes[target_view]
    root = n.view_of if n.view_of >= 0 else target_view
    g.nodes.append(_Node(0, (*srcs, target_view), root, False, False, n.buf, (g._split, 1)))
    return len(g.nodes) - 1


def dsa_graph(s: DsaShape) -> Graph:
    """llama.cpp's deepseek32 / glm-dsa graph (every layer's indexer full), with flash attention or
    without (`flash_attn`), as the buffer running layers `first` to `last` - 1 sees it; with
    `first` 0 and the output here, buffer CPU holds the graph inputs and the token embeddings'
    rows (the host's share); with `host_head`, buffer GPU is the CPU running the first layers."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    used = s.n_expert_used
    n_layer = len(s.n_ff)
    last = n_layer if s.last < 0 else s.last
    whole = s.first == 0 and last == n_layer
    leaves: dict[str, int] = {}
    pinned: dict[tuple[object, int], int] = {}

    def split_input(key: object, size: int, src: int = -1) -> int:
        if s.copies == 1:
            return g.input(key, size, src)
        # pipeline parallelism: the scheduler adds every copy of a split's inputs to the graph's
        # leaves (ggml-backend.cpp, ggml_backend_sched_split_graph), allocated before any node
        # and never freed
        if (key, g.buf) not in pinned:
            for c in range(s.copies):
                g.nodes.append(_Node(size, (), -1, False, True, g.buf, (-2, 0)))
                if c == 0:
                    pinned[(key, g.buf)] = len(g.nodes) - 1
        return pinned[(key, g.buf)]

    def leaf(size: int) -> int:
        if s.copies == 1:
            return g.leaf(size, CPU)
        first = len(g.nodes)
        for _ in range(s.copies):
            g.nodes.append(_Node(size, (), -1, False, True, CPU, (-2, 0)))
        return first

    def graph_input(name: str, size: int) -> int:
        if s.host_head:  # the graph inputs are the CPU's own leaves, read in place
            if name not in leaves:
                leaves[name] = g.leaf(size, GPU)
            return leaves[name]
        if whole and name not in leaves:
            leaves[name] = leaf(size)
        return split_input(name, size, leaves.get(name, -1))

    def moe_sum(down: int, weights: int) -> int:
        weighted = g.op(e * used * f, down, weights, inplace=True)
        moe = g.op(e * f, g.view(weighted), g.view(weighted))
        for _ in range(used - 2):
            moe = g.op(e * f, moe, g.view(weighted), inplace=True)
        return moe

    if whole:
        tokens = leaf(f)
        leaf(e * f)  # the embeddings input, unused with token ids
        leaves["k_rot"] = leaf(4 * s.idx_head * s.idx_head)
    if s.host_head:
        tokens = g.leaf(f, GPU)
        g.leaf(e * f, GPU)  # the embeddings input, unused with token ids
        leaves["k_rot"] = g.leaf(4 * s.idx_head * s.idx_head, GPU)
        inp = g.op(e * f, tokens)
    elif whole:
        g.split(CPU)
        embd = g.op(e * f, tokens)  # GET_ROWS of the token embeddings
        g.split(GPU)
        inp = split_input("embd", e * f, embd)
    elif s.first == 0:
        inp = split_input("embd", e * f)
    elif not s.after_cpu:
        inp = -1  # the GPU before ran this layer's first RMS_NORM ("expand GPU down")
    else:
        prev = s.first - 1
        ffn_inp = split_input("ffn_inp", e * f)
        if s.n_ff[prev]:
            out = split_input("ffn_out", e * f)
        else:
            out = g.op(e * f, split_input("moe_out", e * f), split_input("shexp", e * f), inplace=True)
        inp = g.op(e * f, out, ffn_inp, inplace=True)
    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4  # the copy of the chosen ids (a strided view)

    def handed_over(*tail: int) -> None:
        """The CPU's last layer: the GPU after it runs the weightless tail ("expand GPU up"): its
        first split copies the FFN's outputs and input (then the graph inputs, `inputs_copied`:
        freed here once the last GPU reading them copied them)."""
        for t in tail:
            g.op(0, t)

    def inputs_copied() -> None:
        for name in ("pos", "k_rot", "k_idxs_lid", "k_idxs_mla", "mask_lid", "mask_mla"):
            g.op(0, leaves[name])

    ikf = s.idx_head * f
    iqf = s.idx_heads * s.idx_head * f
    mask = 2 * T * s.n_kv  # the fused indexer's mask: f16
    mask_mla = (2 if s.flash_attn else 4) * T * s.n_kv  # the attention's: f16 with flash attention, else f32
    topk = -1  # the last full layer's top-k on this device
    for il in range(s.first, last):
        full = not s.full or s.full[il]
        norm = split_input("norm", e * f) if inp < 0 else g.op(e * f, inp, inplace=True)
        cur = g.op(e * f, norm, inplace=True)  # attn_norm
        pos = graph_input("pos", f)
        # the full layer ran on the device before: each shared layer's view of its top-k is an input
        # of its own, copied in once per layer (the scheduler keys a split's inputs by tensor)
        shared_in = split_input(("top_k", il), 4 * s.top_k * T) if not full and topk < 0 else -1
        if full:
            rot = graph_input("k_rot", 4 * s.idx_head * s.idx_head)
            # the indexer's K: matmul, NORM (not in place), weight and bias, RoPE of a view, rotation
            ik = g.op(ikf, g.op(ikf, g.op(ikf, g.op(ikf, cur)), inplace=True), inplace=True)
            ik = g.op(ikf, rot, g.op(ikf, g.view(ik), pos, inplace=True))
            g.op(0, g.view(ik), graph_input("k_idxs_lid", 8 * T))  # SET_ROWS into the indexer's cache
        qr = g.op(s.q_lora * f, g.op(s.q_lora * f, g.op(s.q_lora * f, cur), inplace=True), inplace=True)
        q = g.op(s.n_head * s.head_k * f, qr)
        qna = g.op(s.n_head * s.kv_lora * f, g.view(g.view(q)))  # wk_b absorbed
        qpe = g.op(s.n_head * s.n_rot * f, g.view(q), pos, inplace=True)
        qcur = g.op(s.n_head * (s.kv_lora + s.n_rot) * f, g.view(qna), qpe)  # CONCAT
        kvpe = g.op((s.kv_lora + s.n_rot) * f, cur)
        kv = g.op(s.kv_lora * f, g.op(s.kv_lora * f, g.view(kvpe)), inplace=True)  # RMS_NORM of a view, MUL
        kpe = g.op(s.n_rot * f, g.view(kvpe), pos, inplace=True)
        kcur = g.op((s.kv_lora + s.n_rot) * f, g.view(kv), kpe)  # CONCAT
        g.op(0, g.view(kcur), graph_input("k_idxs_mla", 8 * T))
        qv = g.view(g.view(qcur))
        if not s.flash_attn:
            # build_attn_mha without flash attention: V (the latent, a view of the K cache)
            # transposed and made contiguous, in the cache's type, then KQ (f32, every head), which
            # frees the queries
            v_cont = g.op(s.n_kv * s.kv_lora * s.kv_el)
            kq = g.op(4 * s.n_kv * T * s.n_head, qv)
        # build_attn's zeros: a leaf of this buffer (allocated before any node, in the order the
        # graph reaches it), filled in place
        zero = g.op(4 * s.top_k * T, g.leaf(4 * s.top_k * T, GPU), inplace=True)
        if full:
            # the indexer's Q and head weights, its scores, the top-k
            iq = g.op(iqf, qr)
            iq = g.op(iqf, rot, g.op(iqf, g.view(iq), pos, inplace=True))
            iw = g.op(s.idx_heads * f, cur)
            iw = g.op(s.idx_heads * f, g.view(iw), inplace=True)  # SCALE of a view
            score = g.op(4 * s.n_kv * T, g.view(iq), iw, graph_input("mask_lid", mask))  # LIGHTNING_INDEXER
            topk = g.op(4 * s.top_k * T, g.op(4 * s.top_k * T, score))  # TOP_K, CONT
        # the attention's mask: FILL of the MLA mask, SET_ROWS of the zeros at the top-k, ADD the mask
        mla_mask = graph_input("mask_mla", mask_mla)
        filled = g.op(mask_mla, mla_mask)
        rows = _set_rows_view(g, g.view(filled), zero, g.view(topk if shared_in < 0 else shared_in))
        kq_mask = g.op(mask_mla, g.view(rows), mla_mask, inplace=True)
        if s.flash_attn:
            attn = g.view(g.op(s.n_head * s.kv_lora * f, qv, kq_mask))  # FLASH_ATTN_EXT
        else:
            soft = g.op(4 * s.n_kv * T * s.n_head, kq, kq_mask, inplace=True)  # SOFT_MAX in place
            attn = g.op(s.n_head * s.kv_lora * f, v_cont, soft)  # KQV
        vb = g.op(s.n_head * s.head_v * f, attn)  # wv_b
        cur = g.op(e * f, g.view(g.op(s.n_head * s.head_v * f, g.view(vb))))  # CONT, wo
        res = split_input("l_out", e * f) if inp < 0 else inp
        if il == n_layer - 1:
            out_ids = graph_input("out_ids", f)
            cur = g.op(e * f, cur, out_ids)
            res = g.op(e * f, res, out_ids)
        ffn_inp = g.op(e * f, cur, res, inplace=True)
        x = g.op(e * f, g.op(e * f, ffn_inp, inplace=True), inplace=True)  # the FFN's norm
        if s.n_ff[il]:
            ff = s.n_ff[il] * f
            out = g.op(e * f, g.op(ff, g.op(ff, x), g.op(ff, x)))
            if s.host_head and il == last - 1:
                handed_over(out, ffn_inp)
                break
        else:
            ne = s.n_expert * f
            probs = g.op(ne, g.op(ne, x), inplace=True)  # logits, sigmoid in place
            probs_r = g.view(probs)
            topk_e = g.view(g.op(ne, g.op(ne, probs)))  # the selection bias, ARGSORT, its top-k view
            weights = g.op(used * f, probs_r, topk_e)  # GET_ROWS
            wr = g.view(weights)
            wsum = g.op(f, g.op(f, wr), inplace=True)  # SUM_ROWS, CLAMP in place
            weights = g.view(g.op(used * f, wr, wsum, inplace=True))  # DIV
            if s.weights_scaled:
                weights = g.op(used * f, weights, inplace=True)  # SCALE of a view
            xr = g.view(x)
            ffe = s.n_ff_exp * used * f
            if s.experts_cpu[il] and s.experts_cpu[il] != ALL_CPU:
                down = split_experts(g, s.experts_cpu[il], il, xr, topk_e, tk, e * f, ffe, e * used * f,
                                     copy=split_input)
            elif s.experts_cpu[il]:
                g.split(CPU)
                xc = split_input(("x", il), e * f, xr)
                tc = split_input(("topk", il), tk, topk_e)
                down = g.op(e * used * f, g.op(ffe, g.op(ffe, xc, tc), g.op(ffe, xc, tc)), tc)
                g.split(GPU)
                down = split_input(("down", il), e * used * f, down)
            else:
                down = g.op(e * used * f, g.op(ffe, g.op(ffe, xr, topk_e), g.op(ffe, xr, topk_e)), topk_e)
            out = moe_sum(down, weights)
            ffs = s.n_ff_shexp * f
            sh = g.op(e * f, g.op(ffs, g.op(ffs, x), g.op(ffs, x)))
            if s.host_head and il == last - 1:
                handed_over(out, sh, ffn_inp)
                break
            out = g.op(e * f, out, sh, inplace=True)
        inp = g.op(e * f, out, ffn_inp, inplace=True)  # l_out
    if s.host_head:
        # then the routed experts of the GPU's layers that run here, each split copying the FFN
        # input and the chosen ids, its output copied back; the output ids stay until the GPU's
        # split holding the last layer's attention copies them
        out_ids = g.leaf(f, GPU)
        for il in range(last, n_layer):
            if il == max(s.last_gpu, last):
                inputs_copied()
            if il == n_layer - 1 and s.experts_cpu[il]:
                g.op(0, out_ids)
            if not s.experts_cpu[il]:
                continue
            xc = g.op(e * f)  # the copies, made at the split's start
            tc = g.op(tk)
            ffe = s.n_ff_exp * used * f
            g.op(0, g.op(e * used * f, g.op(ffe, g.op(ffe, xc, tc), g.op(ffe, xc, tc)), tc))
        if not s.experts_cpu[n_layer - 1]:
            g.op(0, out_ids)
    elif last == n_layer:
        x = g.op(e * f, g.op(e * f, inp, inplace=True), inplace=True)  # output norm
        g.op(s.n_vocab * f, x, output=True)
    else:
        g.op(0, g.op(e * f, inp))
        g.op(0, inp)
    g.finish()
    return g


@lru_cache(maxsize=512)
def dsa_peaks(s: DsaShape, alignment: int) -> tuple[int, int]:
    """(GPU, CPU) compute buffer sizes; CPU is the host's only when `first` is 0 and the output
    is on this GPU."""
    gpu, cpu = dsa_graph(s).peaks((alignment, 32))
    return gpu, cpu


# --- which placements and settings the replay covers -------------------------------------------
# (each form below was traced node by node and matched the engine's buffers to the byte; anything
# else is refused with the reason `dsa_unmodelled` gives, never estimated)

_HOST = "CPU"


@dataclass(frozen=True)
class _Layout:
    dev_of: tuple[str, ...]  # per layer: the device running its attention, router and shared expert
    experts_cpu: tuple[int, ...]  # per layer: which of its routed experts run on the CPU (bits)
    n_ff: tuple[int, ...]  # per layer: the dense FFN's width, 0 for a MoE layer


_BITS = {"ffn_gate_exps": GATE_CPU, "ffn_up_exps": UP_CPU, "ffn_down_exps": DOWN_CPU}


def _is_gpu(d: str) -> bool:
    return d != _HOST


# the last few placements' layouts: `estimate` asks twice per placement (the check, the replay);
# keyed by the placement object itself (a weak reference: an id alone could be reused)
_LAYOUTS: dict[int, tuple[weakref.ReferenceType[Placement], Geometry, _Layout | str]] = {}


def _layout(placement: Placement, geo: Geometry) -> _Layout | str:
    """The per-layer devices the replay needs, or why this placement is not one it covers."""
    hit = _LAYOUTS.get(id(placement))
    if hit is not None and hit[0]() is placement and hit[1] is geo:
        return hit[2]
    out = _layout_of(placement, geo)
    if len(_LAYOUTS) >= 8:
        _LAYOUTS.clear()
    _LAYOUTS[id(placement)] = (weakref.ref(placement), geo, out)
    return out


def _layout_of(placement: Placement, geo: Geometry) -> _Layout | str:
    inv = placement.inventory
    n_layer = len(geo.layers)
    if not n_layer or [la.index for la in geo.layers] != list(range(n_layer)):
        return "the layers with a KV cache are not blocks 0 to n - 1"
    home: dict[int, set[str | None]] = defaultdict(set)
    routed: dict[int, set[str | None]] = defaultdict(set)
    on_cpu: dict[int, int] = defaultdict(int)
    trunk = _trunk(inv, n_layer)
    if isinstance(trunk, str):
        return trunk
    tensors, dense = trunk
    devices = placement.devices
    for il, name, bit in tensors:
        d = devices[name]
        if bit:
            routed[il].add(d)
            if d == _HOST:
                on_cpu[il] |= bit
        else:
            home[il].add(d)
    dev_of: list[str] = []
    experts_cpu: list[int] = []
    for il in range(n_layer):
        devs = home[il]
        d = next(iter(devs)) if len(devs) == 1 else None
        if d == AUTO_GPU:
            return "layers the engine splits over the GPUs by their free memory (give -ts)"
        if d is None:
            return f"layer {il}'s attention, router and shared expert are not on one device"
        if not routed[il] <= {d, _HOST}:
            return f"layer {il}'s routed experts on another GPU than its attention"
        if not routed[il] and il not in dense:
            return f"layer {il} has neither routed experts nor a dense FFN"
        dev_of.append(d)
        experts_cpu.append(on_cpu[il])
    return _Layout(tuple(dev_of), tuple(experts_cpu), tuple(0 if routed[il] else dense[il] for il in range(n_layer)))


@per_inventory
def _trunk(inv: Inventory, n_layer: int) -> tuple[tuple[tuple[int, str, int], ...], dict[int, int]] | str:
    """The trunk's tensors (layer, name, the routed-expert bit or 0) and each dense layer's FFN
    width; or why the replay does not cover the model. The nextn block (a layer past n_layer) is
    not in the trunk's graph."""
    if any(t.base == "ffn_gate_up_exps" for t in inv.tensors if t.layer is not None and t.layer < n_layer):
        return "fused gate-up expert tensors"
    return (tuple((t.layer, t.name, _BITS.get(t.base, 0)) for t in inv.tensors
                  if t.layer is not None and t.layer < n_layer),
            {t.layer: t.shape[-1] for t in inv.tensors
             if t.layer is not None and t.layer < n_layer and t.base == "ffn_up" and t.shape})


_KV_EL = {"f16": 2, "bf16": 2, "f32": 4}  # K cache types whose V copy flash attention off was traced with


def dsa_unmodelled(placement: Placement, geo: Geometry, *, flash_attn: bool, offload_kqv: bool, n_stream: int,
                   pipeline: bool, cache_type_k: str = "f16") -> list[str]:
    """Why the DSA replay does not cover these settings and this placement (empty: it does)."""
    if placement.inventory.arch not in DSA_ARCHS:
        return []
    what = _unmodelled(placement, geo, flash_attn=flash_attn, offload_kqv=offload_kqv, n_stream=n_stream,
                       pipeline=pipeline, cache_type_k=cache_type_k)
    if not what:
        return []
    return [f"compute is not modelled for {placement.inventory.arch} (DSA) with {what}: KV cache and compute "
            "are not computed (modelled: the KV cache on the GPUs; every layer on GPUs, or the CPU running the "
            "first layers whole and GPUs the rest; docs/memory-architectures.md)"]


def _unmodelled(placement: Placement, geo: Geometry, *, flash_attn: bool, offload_kqv: bool, n_stream: int,
                pipeline: bool, cache_type_k: str = "f16") -> str:
    if not flash_attn and cache_type_k not in _KV_EL:
        return f"flash attention off with a {cache_type_k} K cache (the latent V is copied out of it)"
    if not offload_kqv:
        return "the KV cache in host memory (-nkvo)"
    # a KV stream per sequence (-np above 1 without a unified cache): the same sizes per stream
    inv = placement.inventory
    bases = {t.base for t in inv.tensors if t.layer == 0}
    if not {"attn_q_a", "indexer.proj"} <= bases or not isinstance(inv.metadata.hparam("attention.indexer.top_k"), int):
        return "a layer 0 without attn_q_a or indexer.proj, or no attention.indexer.top_k (the engine needs them)"
    if placement.inventory.metadata.hparam("expert_weights_norm") != 1:
        return "the routing weights not normalised (expert_weights_norm is not 1; the graph was traced with it)"
    lay = _layout(placement, geo)
    if isinstance(lay, str):
        return f"this placement ({lay})"
    runs = device_runs(lay.dev_of)
    n_layer = len(lay.dev_of)
    out = output_device(placement)
    if not _is_gpu(runs[-1][0]):
        return "the last layers on the CPU (-ngl 0, or the output layer alone offloaded)"
    if out != runs[-1][0] or placement.devices.get("output_norm.weight") != out:
        return "the output off the GPU running the last layer"
    if placement.devices.get("token_embd.weight") != _HOST:
        return "the token embeddings off the CPU"
    gpus = [d for d, _, _ in runs if _is_gpu(d)]
    if len(set(gpus)) != len(gpus):
        return "a GPU running two separate ranges of layers"
    head = runs[0][0] == _HOST
    if head and any(lay.experts_cpu[il] not in (0, ALL_CPU) for il in range(runs[1][1], n_layer)):
        return "the CPU running the first layers and a GPU layer's routed experts partly on the CPU"
    if any(not _is_gpu(d) for d, _, _ in runs[1 if head else 0:]):
        return "a layer on the CPU after a GPU's layers"
    return ""


def _shape(placement: Placement, geo: Geometry, lay: _Layout, n_tokens: int, cells: int, **kw: object) -> DsaShape:
    """The replay's shape for this model and layout (`kw`: the DsaShape fields of one buffer)."""
    inv = placement.inventory
    width = {t.base: t.shape[-1] for t in inv.tensors if t.layer == 0 and t.shape}
    top_k = inv.metadata.hparam("attention.indexer.top_k")
    return DsaShape(
        n_embd=geo.n_embd, n_vocab=geo.n_vocab, n_head=geo.n_head, q_lora=width["attn_q_a"],
        kv_lora=geo.kv_lora_rank, head_k=geo.head_k_mla, n_rot=geo.n_rot, head_v=geo.head_v_mla,
        idx_head=indexer_width(inv), idx_heads=width["indexer.proj"],
        top_k=min(top_k if isinstance(top_k, int) else 0, cells), n_expert=geo.n_expert,
        n_expert_used=geo.n_expert_used, n_ff_exp=geo.n_ff_exp, n_ff_shexp=geo.n_ff_shexp,
        # both published models scale the routing weights (routed_scaling_factor 2.5; the float key
        # is not kept in the manifest): a 16 KiB SCALE per layer either way
        weights_scaled=True, n_ff=lay.n_ff, experts_cpu=lay.experts_cpu, n_tokens=n_tokens, n_kv=cells,
        **({"full": full_indexers(inv) or ()} | kw),  # type: ignore[arg-type]
    )


# layers of a GPU's run that an approximate replay keeps (the run's last ones)
SEARCH_LAYERS = 4


def replayed_dsa(placement: Placement, geo: Geometry, n_tokens: int, cells: int, *, pipeline: bool,
                 flash_attn: bool = True, cache_type_k: str = "f16", approximate: bool = False) -> dict[str, int]:
    """Every device's compute buffer (the host's included) by the replay, for a placement and
    settings `dsa_unmodelled` accepts. `approximate` is for a fit's search, which ranks candidate
    splits and then measures the ones it finishes exactly (fill.py `complete`): each GPU's run is
    replayed from its last `SEARCH_LAYERS` layers only. A layer's working set repeats, so that
    peak differs from the whole run's only by where earlier layers left holes in the buffer; it
    may be lower, which is why a finished candidate is measured again first."""
    lay = _layout(placement, geo)
    assert not isinstance(lay, str), lay
    runs = device_runs(lay.dev_of)
    n_layer = len(lay.dev_of)
    copies = 4 if pipeline else 1
    out: dict[str, int] = {}
    attn = {"flash_attn": flash_attn, "kv_el": _KV_EL.get(cache_type_k, 2)}
    mask_mla = (2 if flash_attn else 4) * n_tokens * cells
    for d, first, last in runs:
        align = 128 if d.startswith(("CUDA", "ROCm", "MUSA")) else 32
        if d == _HOST:
            # the CPU's own layers' experts run in its own splits: no copies; the GPU layers' experts
            # on the CPU follow
            own = _Layout(lay.dev_of, tuple(0 if il < last else c for il, c in enumerate(lay.experts_cpu)), lay.n_ff)
            shape = _shape(placement, geo, own, n_tokens, cells, last=last, host_head=True, last_gpu=runs[-1][1],
                           **attn)
            out[_HOST] = dsa_peaks(shape, 32)[0]
            continue
        if approximate and len(runs) > 1 and last - first > SEARCH_LAYERS:
            first = last - SEARCH_LAYERS
        after_cpu = first > 0 and lay.dev_of[first - 1] == _HOST
        # a GPU's graph reads the expert placement of its own layers only: the others' are left out
        # of the shape, so that a search's candidates which differ elsewhere share the cached replay
        if len(runs) > 1:
            # the graph reads the layer before the run (what it hands over), the run's own layers and
            # whether the output follows: the shape keeps just those, renumbered from 0, so runs of
            # the same layers at other depths share one cached replay
            lo = first - 1 if first > 0 else 0
            hi = last + 1 if last < n_layer else n_layer
            mine = _Layout(lay.dev_of[lo:hi], tuple(c if first <= il < last else 0 for il, c in
                                                    enumerate(lay.experts_cpu))[lo:hi], lay.n_ff[lo:hi])
            full = full_indexers(placement.inventory) or ()
            shape = _shape(placement, geo, mine, n_tokens, cells, first=first - lo,
                           last=-1 if last == n_layer else last - lo, after_cpu=after_cpu, copies=copies,
                           full=full[lo:hi], **attn)
        else:
            shape = _shape(placement, geo, lay, n_tokens, cells, first=first, last=-1 if last == n_layer else last,
                           after_cpu=after_cpu, copies=copies, **attn)
        gpu, host = dsa_peaks(shape, align)
        out[d] = gpu
        if len(runs) == 1:
            out[_HOST] = host
    if _HOST not in out and copies == 1:
        # several GPUs, each copying the graph inputs it reads, and the CPU running routed experts
        # between them: the host's share as `replay.host_graph` replays it (traced on
        # DeepSeek-V3.2 over two GPUs with -ot exps=CPU: 300.58 MiB, exact)
        shape = _shape(placement, geo, lay, n_tokens, cells)
        f = 4 * n_tokens
        reads = (("k_rot", 4 * shape.idx_head * shape.idx_head), ("pos", f), ("k_idxs_lid", 8 * n_tokens),
                 ("k_idxs_mla", 8 * n_tokens), ("mask_lid", 2 * n_tokens * cells), ("mask_mla", mask_mla))
        buffer = {d: (0 if i == 0 else i + 1) for i, d in enumerate(dict.fromkeys(lay.dev_of))}  # 1: the host's
        keep: list[int] | range = range(n_layer)
        if approximate:  # each run's last layers, as for the GPUs above
            keep = [il for _, f0, l0 in runs for il in range(max(f0, l0 - SEARCH_LAYERS), l0)]
        layers = tuple((buffer[lay.dev_of[il]], reads, lay.experts_cpu[il]) for il in keep)
        if all(cpu in (0, ALL_CPU) for _, _, cpu in layers):
            out[_HOST] = host_peak(HostShape(
                n_embd=geo.n_embd, n_tokens=n_tokens, n_expert=geo.n_expert, n_expert_used=geo.n_expert_used,
                n_ff_exp=geo.n_ff_exp, biased=False, x_size=f * geo.n_embd,
                layers=tuple((b, r, cpu == ALL_CPU) for b, r, cpu in layers)))
        else:  # some layers' experts partly on the CPU: as the hybrids' host replay places them
            out[_HOST] = hybrid_host_peak(HybridHostShape(
                n_embd=geo.n_embd, n_tokens=n_tokens, n_expert=geo.n_expert, n_expert_used=geo.n_expert_used,
                n_ff_exp=geo.n_ff_exp, layers=layers))
    if _HOST not in out:
        # pipeline parallelism: every copy of every graph input, never freed, and the embeddings' rows
        shape = _shape(placement, geo, lay, n_tokens, cells)
        f = 4 * n_tokens
        # tokens, the unused embeddings input, the rotation, positions, two KV index sets, two masks,
        # output ids
        inputs = (f, shape.n_embd * f, 4 * shape.idx_head * shape.idx_head, f, 8 * n_tokens, 8 * n_tokens,
                  2 * n_tokens * cells, mask_mla, f)
        out[_HOST] = copies * sum(-(-x // 32) * 32 for x in inputs) + shape.n_embd * f
    return out
