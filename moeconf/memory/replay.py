"""What the two remaining older replays (memory/replay_hybrid.py, memory/replay_glm5next.py) share: a
node-by-node replay of ggml-alloc over a device's share of a hand-written graph (`Graph`, its
allocator the graph's own, memory/graph/alloc.py), the sigmoid router, the routed experts' split to
the CPU, the host's share before each layer's experts. It goes with them: every other architecture's
compute is the engine's graph (memory/graph)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from moeconf.memory.graph.alloc import Allocator


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


GPU, CPU = 0, 1  # buffer ids in the two-buffer graphs


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
