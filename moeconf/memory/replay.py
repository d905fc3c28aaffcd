"""A node-by-node replay of ggml-alloc over a device's share of the worst-case graph, for the
architectures whose compute buffer the phase model in `estimate` cannot place exactly.

Where a tensor lands in a compute buffer depends on every allocation and free before it: the
scheduler reserves the buffer by running ggml-alloc's graph allocator (`ggml-alloc.c`,
`ggml_gallocr_alloc_graph_impl`) over the graph once, and the buffer's size is the highest offset
it ever used. Llama 4's one routed expert leaves the residual stream either in a hole of exactly
n_embd x ubatch floats or 0.75 MiB of router scratch higher, depending on where earlier layers
left it; the logits (the largest tensor) go above it. Only a replay decides that, so this module
rebuilds the graph's nodes (sizes, sources, views, in-place candidates) as llama.cpp's graph
builders emit them, and runs the allocator's rules over them:

- a node is allocated before it runs, unless it is a view, or it can run in place (`ggml_op_can_inplace`:
  ADD, MUL, RMS_NORM, ROPE, UNARY, SCALE, SOFT_MAX, ...) on a source of the same layout that is
  not a view, not a graph output, has this node as its only consumer and no views;
- a source is freed once its last consumer ran and no view of it is left (a view's last consumer
  frees the tensor it views);
- the dynamic allocator (`ggml_dyn_tallocr_alloc`) takes the smallest free block that fits among
  all but the last (ties: the higher one), else the last block, which reaches the buffer's end;
  a freed range merges with the free block it touches;
- the scheduler's copies of a split's inputs are nodes of the split, allocated in the order the
  split's nodes first use them (`ggml_backend_sched_split_graph`).

The node lists were read off an instrumented ggml-alloc printing every allocation's offset, size
and name, every free and every in-place reuse (llama.cpp b7000 series, `llama-fit-params`), and
replay its offsets exactly. Results are cached: a `fit` calls `estimate` many times."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

_LAST_BLOCK = 1 << 62  # the last free block reaches the end of a buffer that grows on demand


class Allocator:
    """ggml_dyn_tallocr with one chunk: free blocks sorted by offset, the last one open-ended."""

    __slots__ = ("alignment", "blocks", "max_size")

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, _LAST_BLOCK]]
        self.max_size = 0

    def _aligned(self, size: int) -> int:
        a = self.alignment
        return (size + a - 1) // a * a

    def alloc(self, size: int) -> int:
        size = self._aligned(size)
        blocks = self.blocks
        best = -1
        best_size = _LAST_BLOCK
        for i in range(len(blocks) - 1):
            bs = blocks[i][1]
            if size <= bs <= best_size:  # best fit; a tie goes to the later block
                best, best_size = i, bs
        if best < 0:
            best = len(blocks) - 1
        block = blocks[best]
        off = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del blocks[best]
        self.max_size = max(self.max_size, off + size)
        return off

    def free(self, off: int, size: int) -> None:
        size = self._aligned(size)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == off:  # the freed range ends this block: extend it
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if off + size == block[0]:  # the freed range starts this block
                block[0] = off
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == off:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < off:
            pos += 1
        blocks.insert(pos, [off, size])


@dataclass(slots=True)
class _Node:
    size: int  # bytes; 0 for a view
    srcs: tuple[int, ...]
    view_of: int  # the tensor a view's data belongs to (-1: not a view)
    inplace: bool  # the op may reuse a source of the same size in place
    output: bool = False
    buf: int = 0  # the buffer (device) it is allocated in
    order: tuple[int, int] = (0, 1)  # (split, 0 for the split's input copies, 1 for its nodes)


class Graph:
    """The nodes of a graph in execution order (indices into `nodes`), each in a buffer, grouped in
    the scheduler's splits: `split(buf)` starts one, `input` adds a copy to the current one."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self._copies: dict[tuple[object, int], int] = {}
        self._split = 0
        self.buf = 0
        # empty tensors ggml-alloc still allocates and frees with 0 bytes (`zero`): freeing one where
        # no free block touches it inserts an empty free block, which later keeps neighbouring
        # blocks from merging (`ggml_dyn_tallocr_free_bytes`); other 0-byte nodes take no memory
        self.zeros: set[int] = set()

    def op(self, size: int, *srcs: int, inplace: bool = False, output: bool = False) -> int:
        """A node computing `size` bytes from `srcs` (0: it writes into a tensor outside the
        buffers, as SET_ROWS writes into the KV cache, or it only keeps its sources alive)."""
        self.nodes.append(_Node(size, srcs, -1, inplace, output, self.buf, (self._split, 1)))
        return len(self.nodes) - 1

    def view(self, src: int) -> int:
        """A VIEW, RESHAPE or PERMUTE of `src` (no memory of its own)."""
        n = self.nodes[src]
        root = n.view_of if n.view_of >= 0 else src
        self.nodes.append(_Node(0, (src,), root, False, False, n.buf, (self._split, 1)))
        return len(self.nodes) - 1

    def leaf(self, size: int, buf: int) -> int:
        """A graph input (positions, KV indices, masks, ...): allocated before any node runs."""
        self.nodes.append(_Node(size, (), -1, False, False, buf, (-1, 0)))
        return len(self.nodes) - 1

    def split(self, buf: int) -> None:
        self._split += 1
        self.buf = buf

    def zero(self, *srcs: int) -> int:
        """An empty tensor computed from `srcs` (a GET_ROWS of no rows), allocated as ggml-alloc does."""
        i = self.op(0, *srcs)
        self.zeros.add(i)
        return i

    def zero_input(self, key: object) -> int:
        """The current split's copy of an empty graph input, allocated as ggml-alloc does."""
        i = self.input(key, 0)
        self.zeros.add(i)
        return i

    def input(self, key: object, size: int, src: int = -1) -> int:
        """The current split's copy of a tensor computed in another buffer (`src`, kept alive until
        the copy by a node of the scheduler's) or of a graph input, made at the split's start and
        shared by the later splits on the same buffer."""
        k = (key, self.buf)
        if k not in self._copies:
            if src >= 0:
                self.nodes.append(_Node(0, (src,), -1, False, False, self.nodes[src].buf, (self._split, -1)))
            self.nodes.append(_Node(size, (), -1, False, False, self.buf, (self._split, 0)))
            self._copies[k] = len(self.nodes) - 1
        return self._copies[k]

    def finish(self) -> None:
        """The execution order: the graph inputs, then each split's copies before its nodes."""
        keys = [n.order for n in self.nodes]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        if order == list(range(len(keys))):
            return  # already in execution order
        new = [0] * len(order)  # old index -> new
        for i, old in enumerate(order):
            new[old] = i
        at = new.__getitem__
        nodes = [self.nodes[i] for i in order]
        for n in nodes:
            if n.srcs:
                n.srcs = tuple(map(at, n.srcs))
            if n.view_of >= 0:
                n.view_of = new[n.view_of]
        self.nodes = nodes
        self._copies = {k: new[v] for k, v in self._copies.items()}
        self.zeros = {new[i] for i in self.zeros}

    def peak(self, alignment: int) -> int:
        """ggml_gallocr_alloc_graph_impl over the nodes: buffer 0's size."""
        return self.peaks((alignment,))[0]

    def peaks(self, alignments: tuple[int, ...]) -> tuple[int, ...]:
        """ggml_gallocr_alloc_graph_impl over the nodes: each buffer's size."""
        nodes = self.nodes
        n = len(nodes)
        zeros = self.zeros
        size = [node.size for node in nodes]
        view_of = [node.view_of for node in nodes]
        buf = [node.buf for node in nodes]
        output = [node.output for node in nodes]
        children = [0] * n
        views = [0] * n
        for node in nodes:
            if node.view_of >= 0:
                views[node.view_of] += 1
            for s in node.srcs:
                children[s] += 1
        allocs = [Allocator(a) for a in alignments]
        alloc = [a.alloc for a in allocs]
        free = [a.free for a in allocs]
        addr = [-1] * n  # offset while allocated, -1 otherwise
        for i, node in enumerate(nodes):
            srcs = node.srcs
            sz = size[i]
            if view_of[i] < 0 and (sz or i in zeros):
                for s in srcs if node.inplace else ():
                    if (view_of[s] < 0 and addr[s] >= 0 and not output[s] and size[s] == sz
                            and children[s] == 1 and views[s] == 0):
                        addr[i], addr[s] = addr[s], -1
                        break
                else:
                    addr[i] = alloc[buf[i]](sz)
            for s in srcs:
                children[s] -= 1
                if children[s] or views[s]:
                    continue
                root = view_of[s]
                if root >= 0:
                    views[root] -= 1
                    # a graph output is never freed, through a view of it either
                    if views[root] == 0 and children[root] == 0 and addr[root] >= 0 and not output[root]:
                        free[buf[root]](addr[root], size[root])
                        addr[root] = -1
                elif addr[s] >= 0 and not output[s]:
                    free[buf[s]](addr[s], size[s])
                    addr[s] = -1
        return tuple(a.max_size for a in allocs)


@dataclass(frozen=True)
class Llama4Shape:
    """What the llama4 graph's tensor sizes depend on (bytes are 4 per float unless noted)."""

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
    n_ff: tuple[int, ...]  # per layer: the dense FFN's width, 0 for a MoE layer
    full_attn: tuple[bool, ...]  # per layer: full attention, no RoPE (else chunked, RoPE)
    n_tokens: int  # the ubatch
    n_kv: int  # KV cells the full-attention mask spans
    n_kv_swa: int  # KV cells the chunked mask spans (0: no chunked layers)
    first: int  # the first layer this buffer runs; the output runs here too
    after_cpu: bool  # the layer before `first` ran on the CPU (not another GPU)
    # Hadamard rotations (see MoeShape): each cache (full, chunked) has its own matrices
    rot_k: int = 0
    rot_v: int = 0
    n_outputs: int = 0  # the output rows after the last layer's out_ids (0: the ubatch; settings.n_outputs)


def llama4_graph(s: Llama4Shape) -> Graph:
    """llama.cpp's `llama_model_llama4::graph` (src/models/llama4.cpp) with flash attention, from
    layer `first` to the logits, as the buffer holding them sees it. With flash attention the
    masks are f16, KV indices int64; the worst-case graph outputs every token."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    n_layer = len(s.full_attn)
    # the split's inputs are copied at its start, in the order its nodes first use them
    # (`g.input`). After a layer run on the CPU, that layer's weightless tail (the residual ADD,
    # in a MoE layer the ADD of the shared and routed experts too) runs here (the scheduler's
    # "expand GPU up" pass in ggml_backend_sched_split_graph), so the split starts with the copies
    # of its sources; after a layer run on another GPU, that GPU takes this layer's first
    # weightless op, the attention's RMS_NORM ("expand GPU down"): the split copies the norm, and
    # the residual stream when the attention's output is added to it
    prev_gpu = s.first > 0 and not s.after_cpu
    if s.first == 0:
        inp = g.input("embd", e * f)
    elif prev_gpu:
        inp = -1
    elif s.n_ff[s.first - 1]:
        inp = g.op(e * f, g.input("ffn_out", e * f), g.input("ffn_inp", e * f), inplace=True)
    else:
        merged = g.op(e * f, g.input("moe_out", e * f), g.input("shexp", e * f), inplace=True)
        inp = g.op(e * f, merged, g.input("ffn_inp", e * f), inplace=True)
    hq, hkv = s.n_head * s.head_k, s.n_head_kv * s.head_k
    for il in range(s.first, n_layer):
        full = s.full_attn[il]
        cells = s.n_kv if full else s.n_kv_swa
        norm = g.input("norm", e * f) if inp < 0 else g.op(e * f, inp, inplace=True)
        cur = g.op(e * f, norm, inplace=True)  # attn_norm
        q = g.view(g.op(hq * f, cur))
        if full:  # no RoPE: the attention temperature scales the queries
            q = g.op(hq * f, q, g.input("attn_scale", f), inplace=True)
        else:
            q = g.op(hq * f, q, g.input("pos", f), inplace=True)
        rk, rv = g.input(("k_rot", full), 4 * s.rot_k ** 2) if s.rot_k else -1, -1
        if s.rot_k:  # the iSWA attention rotates Q, K, then V (llm_graph_context::build_attn)
            q = g.view(g.op(hq * f, g.view(q), rk))
        k = g.view(g.op(hkv * f, cur))
        if not full:
            k = g.op(hkv * f, k, g.input("pos", f), inplace=True)
        if s.rot_k:
            k = g.view(g.op(hkv * f, g.view(k), rk))
        v = g.view(g.op(s.n_head_kv * s.head_v * f, cur))
        if s.rot_v:
            rv = g.input(("v_rot", full), 4 * s.rot_v ** 2)
            v = g.view(g.op(s.n_head_kv * s.head_v * f, g.view(v), rv))
        # SET_ROWS into the cache (a view of the cache, no memory here), by int64 cell indices
        g.op(0, g.view(k), g.input(("k_idxs", full), 8 * T))
        g.op(0, g.view(v), g.input(("v_idxs", full), 8 * T))
        mask = g.input(("mask", full), 2 * T * cells)  # f16 with flash attention
        attn = g.op(s.n_head * s.head_v * f, g.view(q), mask)  # FLASH_ATTN_EXT
        if s.rot_v:
            attn = g.op(s.n_head * s.head_v * f, g.view(attn), rv)
        cur = g.op(e * f, g.view(attn))  # wo
        res = g.input("l_out", e * f) if inp < 0 else inp
        if il == n_layer - 1:
            f = 4 * (s.n_outputs or T)  # from here on, only the output rows
            out_ids = g.input("out_ids", f)
            cur = g.op(e * f, cur, out_ids)  # GET_ROWS: only the outputs go on
            res = g.op(e * f, res, out_ids)
        ffn_inp = g.op(e * f, cur, res, inplace=True)
        x = g.op(e * f, g.op(e * f, ffn_inp, inplace=True), inplace=True)  # ffn_norm
        if s.n_ff[il]:
            ff = s.n_ff[il] * f
            glu = g.op(ff, g.op(ff, x), g.op(ff, x))
            out = g.op(e * f, glu)
        else:
            # build_moe_ffn: sigmoid gating, experts chosen on the logits, the input weighted
            # before the experts (repeated per chosen expert), one expert's output a CONT copy
            used = s.n_expert_used
            logits = g.op(s.n_expert * f, x)
            probs = g.op(s.n_expert * f, logits, inplace=True)
            topk = g.view(g.op(s.n_expert * f, logits))  # ARGSORT, its top-k view
            weights = g.op(used * f, g.view(probs), topk)
            rep = g.op(e * used * f, g.view(x))
            xw = g.op(e * used * f, rep, weights, inplace=True)
            ffe = s.n_ff_exp * used * f
            glu = g.op(ffe, g.op(ffe, xw, topk), g.op(ffe, xw, topk))
            down = g.op(e * used * f, glu, topk)
            moe = g.op(e * f, g.view(down))
            ffs = s.n_ff_shexp * f
            sh = g.op(e * f, g.op(ffs, g.op(ffs, x), g.op(ffs, x)))
            out = g.op(e * f, moe, sh, inplace=True)
        inp = g.op(e * f, out, ffn_inp, inplace=True)  # l_out
    x = g.op(e * f, g.op(e * f, inp, inplace=True), inplace=True)  # output norm
    g.op(s.n_vocab * f, x, output=True)
    g.finish()
    return g


@lru_cache(maxsize=256)
def llama4_peak(s: Llama4Shape, alignment: int) -> int:
    return llama4_graph(s).peak(alignment)


GPU, CPU = 0, 1  # buffer ids in the two-buffer graphs


@dataclass(frozen=True)
class MoeShape:
    """What a Qwen3-MoE or GLM-4.5 style graph's tensor sizes depend on, for the GPU running
    layers `first` to `last` - 1 (routed experts there or on the CPU)."""

    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int  # 0: no shared expert
    qk_norm: bool  # RMS norms of Q and K per head before RoPE (Qwen3)
    biased_selection: bool  # sigmoid gating, experts chosen on scores plus a bias (GLM-4.5); else softmax
    n_ff: tuple[int, ...]  # per layer: the dense FFN's width, 0 for a MoE layer
    experts_cpu: tuple[bool, ...]  # per layer: its routed experts run on the CPU
    n_tokens: int
    n_kv: int
    first: int = 0
    last: int = -1  # -1: every layer from `first` on, and the output
    after_cpu: bool = False  # the layer before `first` ran wholly on the CPU (else on another GPU)
    # Hadamard rotations of Q/K and of V for a quantized cache: the rotation matrix's side, 0 when
    # off (settings.rotation; src/llama-kv-cache.cpp `attn_rot_k`/`attn_rot_v`, src/llama-graph.cpp
    # `build_attn`: Q and K, V, and the attention's output each multiplied by it)
    rot_k: int = 0
    rot_v: int = 0
    # the buffer is the host's, running layers `first` (0) to `last` - 1 whole before the GPUs
    # (archgraph.cpu_head): the graph inputs are its own leaves, alive until the GPUs copy them
    host_head: bool = False
    n_outputs: int = 0  # the output rows after the last layer's out_ids (0: the ubatch; settings.n_outputs)
    # per layer, where its routed experts are split between this GPU and the CPU: which of gate,
    # up, down run on the CPU (GATE_CPU | UP_CPU | DOWN_CPU below); () or 0: `experts_cpu`
    experts_split: tuple[int, ...] = ()
    # the output matrix on the CPU (-ot output=CPU): this GPU runs the output norm, the CPU's split
    # copies its result and computes the logits
    output_cpu: bool = False


def moe_graph(s: MoeShape) -> Graph:
    """llama.cpp's qwen3moe and glm4moe graphs (src/models/qwen3moe.cpp, glm4-moe.cpp,
    `build_moe_ffn` in llama-graph.cpp) with flash attention, the nextn block left out: the
    router (softmax, or sigmoid with a selection bias), the chosen experts' weights normalised and
    applied after the experts, their outputs summed by a chain of ADDs over views, a shared expert.
    Buffer GPU holds the device's share; with `first` 0 and the output here, buffer CPU holds the
    graph inputs, the token embeddings' rows and the routed experts' splits (copies of the FFN
    input and of the chosen ids, the experts' matmuls)."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    used = s.n_expert_used
    n_layer = len(s.n_ff)
    last = n_layer if s.last < 0 else s.last
    whole = s.first == 0 and last == n_layer  # the host's share is replayed too
    leaves: dict[str, int] = {}

    def graph_input(name: str, size: int) -> int:
        if s.host_head:
            return leaves[name]
        if whole and name not in leaves:
            leaves[name] = g.leaf(size, CPU)
        return g.input(name, size, leaves.get(name, -1))

    def moe_sum(down: int, weights: int) -> int:
        weighted = g.op(e * used * f, down, weights, inplace=True)
        moe = g.op(e * f, g.view(weighted), g.view(weighted))
        for _ in range(used - 2):
            moe = g.op(e * f, moe, g.view(weighted), inplace=True)
        return moe

    if s.host_head:
        # the graph inputs in the order the graph reaches them (the K rotation before the
        # positions), the unused embeddings input among them, then the embeddings' rows
        tokens = g.leaf(f, GPU)
        g.leaf(e * f, GPU)
        for name, size in (("k_rot", 4 * s.rot_k ** 2), ("pos", f), ("v_rot", 4 * s.rot_v ** 2),
                           ("k_idxs", 8 * T), ("v_idxs", 8 * T), ("mask", 2 * T * s.n_kv),
                           ("out_ids", 4 * (s.n_outputs or T))):
            if size:
                leaves[name] = g.leaf(size, GPU)
        inp = g.op(e * f, tokens)  # GET_ROWS
    elif whole:
        tokens = g.leaf(f, CPU)
        g.leaf(e * f, CPU)  # the embeddings input, unused with token ids
        g.split(CPU)
        embd = g.op(e * f, tokens)  # GET_ROWS of the token embeddings
        g.split(GPU)
        inp = g.input("embd", e * f, embd)
    elif s.first == 0:
        inp = g.input("embd", e * f)
    elif not s.after_cpu:
        inp = -1  # the GPU before ran this layer's first RMS_NORM ("expand GPU down")
    else:
        # the CPU layer's weightless tail runs here ("expand GPU up"): its split starts with the
        # copies of that tail's sources (the split's copies are made in the order its nodes first
        # read them: the FFN input, read by the residual ADD, comes last)
        prev = s.first - 1
        if s.n_ff[prev]:
            out = g.input("ffn_out", e * f)
        elif s.n_ff_shexp:
            out = g.op(e * f, g.input("moe_out", e * f), g.input("shexp", e * f), inplace=True)
        else:
            out = moe_sum(g.input("down", e * used * f), g.input("weights", used * f))
        inp = g.op(e * f, out, g.input("ffn_inp", e * f), inplace=True)
    hq, hkv, hv = s.n_head * s.head_k, s.n_head_kv * s.head_k, s.n_head_kv * s.head_v
    for il in range(s.first, last):
        norm = g.input("norm", e * f) if inp < 0 else g.op(e * f, inp, inplace=True)
        cur = g.op(e * f, norm, inplace=True)  # attn_norm
        if whole and s.rot_k and "k_rot" not in leaves:
            # the graph reaches the rotation (the Q rotation's first source) before the positions
            leaves["k_rot"] = g.leaf(4 * s.rot_k * s.rot_k, CPU)
        pos = graph_input("pos", f)
        q = g.view(g.op(hq * f, cur))  # Q (+ bias, in place)
        if s.qk_norm:
            q = g.op(hq * f, g.op(hq * f, q), inplace=True)  # RMS_NORM of the view, its MUL
        q = g.op(hq * f, q, pos, inplace=True)  # RoPE
        if s.rot_k:  # MUL_MAT of a reshape by the rotation (llama_mul_mat_hadamard)
            q = g.view(g.op(hq * f, g.view(q), graph_input("k_rot", 4 * s.rot_k * s.rot_k)))
        v = g.view(g.op(hv * f, cur))
        if s.rot_v:
            v = g.view(g.op(hv * f, g.view(v), graph_input("v_rot", 4 * s.rot_v * s.rot_v)))
        k = g.view(g.op(hkv * f, cur))
        if s.qk_norm:
            k = g.op(hkv * f, g.op(hkv * f, k), inplace=True)
        k = g.op(hkv * f, k, pos, inplace=True)
        if s.rot_k:
            k = g.view(g.op(hkv * f, g.view(k), graph_input("k_rot", 4 * s.rot_k * s.rot_k)))
        g.op(0, g.view(k), graph_input("k_idxs", 8 * T))  # SET_ROWS into the cache
        g.op(0, g.view(v), graph_input("v_idxs", 8 * T))
        attn = g.op(s.n_head * s.head_v * f, g.view(q), graph_input("mask", 2 * T * s.n_kv))
        if s.rot_v:  # the attention's output rotated back
            attn = g.op(s.n_head * s.head_v * f, g.view(attn), graph_input("v_rot", 4 * s.rot_v * s.rot_v))
        cur = g.op(e * f, g.view(attn))  # wo
        res = g.input("l_out", e * f) if inp < 0 else inp
        if il == n_layer - 1:
            T = s.n_outputs or T  # from here on, only the output rows
            f = 4 * T
            out_ids = graph_input("out_ids", f)
            cur = g.op(e * f, cur, out_ids)
            res = g.op(e * f, res, out_ids)
        ffn_inp = g.op(e * f, cur, res, inplace=True)
        x = g.op(e * f, g.op(e * f, ffn_inp, inplace=True), inplace=True)  # the FFN's norm
        if s.n_ff[il]:
            ff = s.n_ff[il] * f
            out = g.op(e * f, g.op(ff, g.op(ff, x), g.op(ff, x)))
        else:
            ne = s.n_expert * f
            probs = g.op(ne, g.op(ne, x), inplace=True)  # logits, sigmoid or softmax in place
            probs_r = g.view(probs)
            scores = g.op(ne, probs) if s.biased_selection else probs  # plus the selection bias
            topk = g.view(g.op(ne, scores))  # ARGSORT, its top-k view
            weights = g.view(g.op(used * f, probs_r, topk))  # GET_ROWS
            wsum = g.op(f, g.op(f, weights), inplace=True)  # SUM_ROWS, CLAMP in place
            weights = g.view(g.op(used * f, weights, wsum, inplace=True))  # DIV
            xr = g.view(x)
            ffe = s.n_ff_exp * used * f
            split = s.experts_split[il] if s.experts_split else 0
            if split:
                down = split_experts(g, split, il, xr, topk, (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4,
                                      e * f, ffe, e * used * f)
            elif s.experts_cpu[il]:
                g.split(CPU)
                # the copies of the FFN input and of the ids (a strided view of the ARGSORT)
                xc = g.input(("x", il), e * f, xr)
                tc = g.input(("topk", il), (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4, topk)
                down = g.op(e * used * f, g.op(ffe, g.op(ffe, xc, tc), g.op(ffe, xc, tc)), tc)
                g.split(GPU)
                down = g.input(("down", il), e * used * f, down)
            else:
                down = g.op(e * used * f, g.op(ffe, g.op(ffe, xr, topk), g.op(ffe, xr, topk)), topk)
            out = moe_sum(down, weights)
            if s.n_ff_shexp:
                ffs = s.n_ff_shexp * f
                sh = g.op(e * f, g.op(ffs, g.op(ffs, x), g.op(ffs, x)))
                out = g.op(e * f, out, sh, inplace=True)
        inp = g.op(e * f, out, ffn_inp, inplace=True)  # l_out
    if last == n_layer:
        x = g.op(e * f, g.op(e * f, inp, inplace=True), inplace=True)  # output norm
        if s.output_cpu:
            g.split(CPU)
            x = g.input("result_norm", e * f, x)
        g.op(s.n_vocab * f, x, output=True)
    elif not s.host_head:
        # the next GPU's first RMS_NORM runs here; the next GPU copies it and the residual
        g.op(0, g.op(e * f, inp))
        g.op(0, inp)
    else:  # the last layer's weightless tail runs on the next GPU ("expand GPU up")
        g.op(0, inp)
        g.op(0, *(leaves[n] for n in leaves))  # the GPUs copy the graph inputs after these layers
    g.finish()
    return g


def sigmoid_router(g: Graph, x: int, logits: int, chosen: int, f: int) -> tuple[int, int]:
    """build_moe_ffn's router with sigmoid gating, a selection bias and normalised, scaled weights
    (Kimi-Linear, GLM-5.3-Flash): the logits (`logits` bytes) and their sigmoid in place, the
    biased copy, ARGSORT and its top-k view, GET_ROWS of the chosen weights (`chosen` bytes),
    SUM_ROWS and CLAMP in place (`f`: 4 bytes a token), DIV, SCALE. Returns (the top-k view, the
    scaled weights)."""
    probs = g.op(logits, g.op(logits, x), inplace=True)
    topk = g.view(g.op(logits, g.op(logits, probs)))
    weights = g.op(chosen, g.view(probs), topk)
    wsum = g.op(f, g.op(f, g.view(weights)), inplace=True)
    wnorm = g.op(chosen, g.view(weights), wsum)
    return topk, g.op(chosen, g.view(wnorm))


def split_experts(g: Graph, cpu: int, il: int, xr: int, topk: int, ids_size: int, x_size: int, ffe: int,
                  down_size: int) -> int:
    """A layer's routed experts split between the GPU (buffer GPU) and the CPU (bits of
    GATE_CPU, UP_CPU, DOWN_CPU below: 1, 2, 4): each matmul where its weights are, the
    SwiGLU on the CPU only when up and down are there, each crossing a copy at the start of the next
    split (build_moe_ffn; measured with the scheduler's debug output, GGML_SCHED_DEBUG=2, and traced
    on GLM-5 with gate and up on the CPU); each crossing is a split's copy (`g.input`). Returns the
    experts' output on the GPU."""
    put = g.input
    here = GPU

    def on(buf: int) -> None:
        nonlocal here
        if here != buf:
            g.split(buf)
            here = buf

    def ids() -> int:
        return topk if here == GPU else put(("topk", il), ids_size, topk)

    def x() -> int:
        return xr if here == GPU else put(("x", il), x_size, xr)

    gate_buf = CPU if cpu & 1 else GPU
    up_buf = CPU if cpu & 2 else GPU
    down_buf = CPU if cpu & 4 else GPU
    act_buf = CPU if up_buf == CPU and down_buf == CPU else GPU
    on(gate_buf)
    gate = g.op(ffe, x(), ids())
    on(up_buf)
    up = g.op(ffe, x(), ids())
    on(act_buf)
    ga = gate if gate_buf == act_buf else put(("gate", il), ffe, gate)
    ua = up if up_buf == act_buf else put(("up", il), ffe, up)
    act = g.op(ffe, ga, ua)
    on(down_buf)
    da = act if act_buf == down_buf else put(("act", il), ffe, act)
    down = g.op(down_size, da, ids())
    on(GPU)
    return down if down_buf == GPU else put(("down", il), down_size, down)


@lru_cache(maxsize=512)
def moe_peaks(s: MoeShape, alignment: int) -> tuple[int, int]:
    """(GPU, CPU) compute buffer sizes; CPU is the host's only when `first` is 0 and the output
    is on this GPU."""
    gpu, cpu = moe_graph(s).peaks((alignment, 32))
    return gpu, cpu


@dataclass(frozen=True)
class HostShape:
    """What the host's compute buffer depends on when GPUs run every layer's attention and the
    output, and the CPU only some layers' routed experts (`-ot exps=CPU`)."""

    n_embd: int
    n_tokens: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    biased: bool  # gpt-oss: each expert matmul followed by its bias (ADD_ID, in place)
    x_size: int  # the experts' input copied to the CPU (bytes)
    # per layer: the GPU running it (1, 2, ...), the graph inputs its attention reads in order
    # (name, bytes), and whether its routed experts run on the CPU
    layers: tuple[tuple[int, tuple[tuple[str, int], ...], bool], ...]
    n_embd_inp: int = 0  # the input embedding's width where wider than n_embd (deepstack)
    n_outputs: int = 0  # the output rows after the last layer's out_ids (0: the ubatch; settings.n_outputs)


Cpu = TypeVar("Cpu")


def device_runs(dev_of: Sequence[str]) -> list[tuple[str, int, int]]:
    """Consecutive layers on one device, as (device, first layer, end): the ranges a replay's
    splits follow."""
    runs: list[tuple[str, int, int]] = []
    for il, d in enumerate(dev_of):
        if runs and runs[-1][0] == d:
            runs[-1] = (d, runs[-1][1], il + 1)
        else:
            runs.append((d, il, il + 1))
    return runs


def host_layers(g: Graph, layers: tuple[tuple[int, tuple[tuple[str, int], ...], Cpu], ...], n_embd: int,
                n_tokens: int, input_width: int, n_outputs: int = 0) -> Iterator[tuple[int, int, Cpu]]:
    """The host's share of the graph before each layer's routed experts (`host_graph`,
    `hybrid_host_graph`): the token ids and the unused embeddings input, the
    embeddings' rows, then per layer (its GPU buffer, the graph inputs it reads, what of its
    experts runs on the CPU) the copies of the hidden state and of the graph inputs to its GPU.
    Yields (layer, its GPU buffer, what runs on the CPU) for the caller to add the experts."""
    f = 4 * n_tokens
    tokens = g.leaf(f, CPU)
    g.leaf(input_width * f, CPU)  # the embeddings input, unused with token ids
    leaves: dict[str, int] = {}
    g.split(CPU)
    embd = g.op(n_embd * f, tokens)
    gpu = -1
    n_layer = len(layers)
    for il, (dev, reads, cpu) in enumerate(layers):
        if dev != gpu:
            gpu = dev
            g.split(gpu)
            g.input("embd" if il == 0 else ("l_out", il), n_embd * f, embd if il == 0 else -1)
        reads += (("out_ids", 4 * (n_outputs or n_tokens)),) if il == n_layer - 1 else ()
        # the graph reaches the K rotation's matrix before the positions (the Q rotation's first
        # source), its copies are made in the order the split reads them
        for name, size in sorted(reads, key=lambda r: not r[0].startswith("k_rot")):
            if name not in leaves:
                leaves[name] = g.leaf(size, CPU)
        for name, size in reads:
            g.input(name, size, leaves[name])
        yield il, gpu, cpu


def host_graph(s: HostShape) -> Graph:
    """The host's share of the worst-case graph: the graph inputs (allocated first, in the order
    the graph first reads them), the token embeddings' rows, and per layer whose routed experts
    run on the CPU a split with the copies of their input and of the chosen ids, and the experts'
    matmuls (`build_moe_ffn`). A graph input lives until the scheduler copied it to the last GPU
    reading it; what the GPUs compute in between allocates nothing here."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    used = s.n_expert_used
    x_size = s.x_size
    for il, gpu, experts_cpu in host_layers(g, s.layers, e, T, s.n_embd_inp or e, s.n_outputs):
        if not experts_cpu:
            continue
        if il == len(s.layers) - 1 and s.n_outputs:  # the last layer's experts see only the output rows
            x_size = x_size // T * s.n_outputs
            T = s.n_outputs
            f = 4 * T
        g.split(CPU)
        xc = g.input(("x", il), x_size)
        tc = g.input(("topk", il), (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4)
        ffe = s.n_ff_exp * used * f
        gate = g.op(ffe, xc, tc)
        if s.biased:
            gate = g.op(ffe, gate, tc, inplace=True)
        up = g.op(ffe, xc, tc)
        if s.biased:
            up = g.op(ffe, up, tc, inplace=True)
        down = g.op(e * used * f, g.op(ffe, gate, up), tc)
        if s.biased:
            down = g.op(e * used * f, down, tc, inplace=True)
        g.split(gpu)
        g.input(("down", il), e * used * f, down)
    g.finish()
    return g


@lru_cache(maxsize=256)
def host_peak(s: HostShape) -> int:
    bufs = max(CPU, *(dev for dev, _, _ in s.layers)) + 1
    return host_graph(s).peaks(tuple([32] * bufs))[CPU]


# a layer's routed experts on the CPU, as bits: gate, up, down (ALL_CPU: the whole layer's)
GATE_CPU, UP_CPU, DOWN_CPU = 1, 2, 4
ALL_CPU = GATE_CPU | UP_CPU | DOWN_CPU


@dataclass(frozen=True)
class HybridHostShape:
    """The host's share where GPUs run every layer and the output and the CPU some layers' routed
    experts, wholly or in part (first replayed for the delta-net hybrids, hence the name)."""

    n_embd: int
    n_tokens: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    # per layer: the GPU running it (1, 2, ...), the graph inputs it reads (name, bytes), which of
    # its routed experts run on the CPU (GATE_CPU | UP_CPU | DOWN_CPU)
    layers: tuple[tuple[int, tuple[tuple[str, int], ...], int], ...]
    n_outputs: int = 0  # the output rows (0: the ubatch; settings.n_outputs)


def hybrid_host_graph(s: HybridHostShape) -> Graph:
    """`host_graph` with the partial layers' CPU matmuls and copies where `split_experts` places
    them (gate, up, down each where its tensor is, the SwiGLU on the CPU only with up and down)."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    used = s.n_expert_used
    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4
    ffe = s.n_ff_exp * used * f
    for il, gpu, cpu in host_layers(g, s.layers, e, T, e, s.n_outputs):
        if not cpu:
            continue
        here = gpu

        def on(buf: int) -> None:
            nonlocal here
            if here != buf:
                g.split(buf)
                here = buf

        gate_buf = CPU if cpu & GATE_CPU else gpu
        up_buf = CPU if cpu & UP_CPU else gpu
        down_buf = CPU if cpu & DOWN_CPU else gpu
        act_buf = CPU if up_buf == CPU and down_buf == CPU else gpu
        outs: dict[str, int] = {}
        for name, buf in (("gate", gate_buf), ("up", up_buf)):
            on(buf)
            if buf == CPU:
                outs[name] = g.op(ffe, g.input(("x", il), e * f), g.input(("topk", il), tk))
        on(act_buf)
        if act_buf == CPU:
            srcs = [outs[n] if n in outs else g.input((n, il), ffe) for n in ("gate", "up")]
            outs["act"] = g.op(ffe, *srcs)
        elif "gate" in outs or "up" in outs:
            for n in ("gate", "up"):
                if n in outs:
                    g.input((n, il), ffe, outs[n])  # copied to the GPU
        on(down_buf)
        if down_buf == CPU:
            act = outs["act"] if "act" in outs else g.input(("act", il), ffe)
            down = g.op(e * used * f, act, g.input(("topk", il), tk))
            on(gpu)
            g.input(("down", il), e * used * f, down)
        on(gpu)
    g.finish()
    return g


@lru_cache(maxsize=256)
def hybrid_host_peak(s: HybridHostShape) -> int:
    bufs = max(CPU, *(dev for dev, _, _ in s.layers)) + 1
    return hybrid_host_graph(s).peaks(tuple([32] * bufs))[CPU]
