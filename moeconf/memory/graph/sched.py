"""ggml_backend_sched and ggml-alloc over a graph (`ggml.CGraph`), as the pinned ggml runs them when llama.cpp
reserves its worst-case graph: `reserve` returns each backend's buffer size, the compute buffer llama.cpp reports
(docs/memory.md, "The scheduler and the allocator")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from moeconf.engines import HOST
from moeconf.memory.graph.alloc import Allocator
from moeconf.memory.graph.ggml import INPUT, OUTPUT, VIEW_OPS, CGraph, Tensor, same_layout, spanned, type_block

# ggml-alloc.c ggml_op_can_inplace
CAN_INPLACE = frozenset({
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV", "SQR", "SQRT",
    "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "CLAMP", "SOFT_MAX",
    "SOFT_MAX_BACK",
})

# GGML_SCHED_MAX_COPIES: the graph copies pipeline parallelism keeps
PIPELINE_COPIES = 4
Placed = list[tuple[Tensor, int]]  # the graph copy's tensors, each with its backend
ROW_PADDING = 512  # MATRIX_ROW_PADDING (ggml-cuda/common.cuh): CUDA's quantized rows padded to a multiple of it


@dataclass(frozen=True)
class Backend:
    """A scheduler backend: its name (the buffer type moeconf names its device by), its buffer's
    alignment, whether host buffers are its own (the CPU), and the batch from which it takes ops
    whose weights are in host memory (0: never; CUDA's op_offload_min_batch_size is 32)."""

    name: str
    alignment: int = 32
    host: bool = False
    offload_batch: int = 0
    pads_rows: bool = False  # CUDA: a quantized tensor's rows padded to 512 elements

    def supports_buffer(self, device: str) -> bool:
        return device == self.name or (self.host and device == HOST)

    def alloc_size(self, t: Tensor) -> int:
        return spanned(t) + (row_padding(t.type, t.ne[0]) if self.pads_rows else 0)


def row_padding(type_name: str, ne0: int) -> int:
    """The bytes a row-padding buffer (CUDA's) adds to a quantized tensor whose rows are not a multiple
    of `ROW_PADDING` elements (ggml-cuda get_alloc_size: quantized types only)."""
    pad = ROW_PADDING - ne0 % ROW_PADDING
    block, size = type_block(type_name)
    return pad * size // block if pad < ROW_PADDING and block > 1 else 0


@cache
def backend_for(device: str) -> Backend:
    if device == HOST:
        return Backend(HOST, 32, host=True)
    if device.startswith(("CUDA", "ROCm", "MUSA")):
        return Backend(device, 128, offload_batch=32, pads_rows=True)
    return Backend(device, 32)


def _batch(t: Tensor) -> int:
    """ggml-cuda.cu get_op_batch_size."""
    if t.op == "GET_ROWS":
        return 0
    if t.op == "MUL_MAT":
        return t.ne[1]
    if t.op in ("MUL_MAT_ID", "ROPE", "ROPE_BACK"):
        return t.ne[2]
    return t.ne[1] * t.ne[2] * t.ne[3]


def _static(g: CGraph) -> tuple[list[Tensor], list[Tensor]]:
    """What of a graph's scheduling does not change with the placement (a graph is reused across placements:
    only its weights' and caches' buffers are set again): the nodes pass 1 can place (`_from_cur` gives the
    others none: no buffer, no view, no input flag, no weight read, or ROPE and FLASH_ATTN_EXT) and the
    nodes that are not views (the ops pass 2 expands over)."""
    key = len(g.nodes)
    if g.sched_static is None or g.sched_static[0] != key:
        placed = [n for n in g.nodes if n.buffer is not None or n.view_src is not None or n.flags & INPUT or (
            n.op not in ("ROPE", "FLASH_ATTN_EXT") and any(s is not None and s.weights for s in n.src))]
        g.sched_static = (key, placed, [n for n in g.nodes if n.op not in VIEW_OPS])
    return g.sched_static[1], g.sched_static[2]


class Scheduler:
    def __init__(self, backends: Sequence[Backend], *, pipeline: bool = False, op_offload: bool = True) -> None:
        self.backends = list(backends)
        assert self.backends[-1].host, "the CPU backend comes last"
        self.cpu = len(self.backends) - 1
        self.n_copies = PIPELINE_COPIES if pipeline else 1
        self.op_offload = op_offload
        self.ids: dict[Tensor, int] = {}
        self.splits: list[tuple[int, list[Tensor], list[Tensor]]] = []  # (backend, inputs, nodes)
        self.copy_of: dict[Tensor, tuple[Tensor, int]] = {}  # a split input's copy -> (the tensor, backend)
        self._buf_index: dict[str, int] = {}  # a buffer's device -> the first backend supporting it
        # split's edits of the graph, undone by `restore`: (node, source index, source), (leaf, its flags)
        self._replaced: list[tuple[Tensor, int, Tensor]] = []
        self._flagged: list[tuple[Tensor, int]] = []

    # -- the buffer rules
    def _buf_backend(self, t: Tensor) -> int:
        """ggml_backend_sched_backend_from_buffer: the first backend supporting the buffer."""
        buf = t.view_src.buffer if t.view_src is not None else t.buffer
        if buf is None:
            return -1
        b = self._buf_index.get(buf)
        if b is None:
            b = self._buf_index[buf] = next((i for i, be in enumerate(self.backends) if be.supports_buffer(buf)), -1)
        return b

    def _from_cur(self, t: Tensor) -> int:
        for x in (t, t.view_src):  # ggml's two tries: the tensor, then its view source (each by `_buf_backend`)
            if x is not None and (b := self._buf_backend(x)) != -1:
                return b
        if t.flags & INPUT:
            return self.cpu
        if t.op in ("ROPE", "FLASH_ATTN_EXT"):
            return -1
        for s in t.src:
            if s is None or s.buffer is None or not s.weights:
                continue
            sb = self._buf_backend(s)
            if self.op_offload and sb == self.cpu:  # the first GPU offloading the op's batch, else the CPU
                return next((i for i, be in enumerate(self.backends) if 0 < be.offload_batch <= _batch(t)), sb)
            return sb
        return -1

    def _buffer_supported(self, t: Tensor, b: int) -> bool:
        buf = t.view_src.buffer if t.view_src is not None else t.buffer
        if buf is not None:
            return self.backends[b].supports_buffer(buf)
        tb = self.ids.get(t, -1)
        if tb == -1 and t.view_src is not None:
            tb = self.ids.get(t.view_src, -1)
        return tb != -1 and (tb == b or (self.backends[b].host and self.backends[tb].host))

    def assign(self, g: CGraph, pinned: dict[Tensor, int] | None = None) -> None:
        """Passes 1-4: every tensor's backend (`ids`), the graph left as it is."""
        ids = self.ids
        ids.clear()
        if pinned:
            ids.update(pinned)
        get = ids.get
        from_cur = self._from_cur
        placed, ops = _static(g)
        for t in (*g.leafs, *placed):  # pass 1
            if get(t, -1) == -1:
                ids[t] = from_cur(t)
        for seq, skip_cpu in ((ops, True), (ops[::-1], True), (ops, False), (ops[::-1], False)):  # pass 2
            cur = -1
            for n in seq:
                b = get(n, -1)
                if b != -1:
                    cur = -1 if (skip_cpu and b == self.cpu) else b
                elif cur != -1:
                    ids[n] = cur  # every backend here supports every op (CPU, RPC, CUDA for these graphs)
        # pass 3 has nothing left to assign (docs/memory.md, "The scheduler and the allocator")
        assert not ops or get(ops[0], -1) != -1, "an op without a backend after pass 2"
        for n in g.nodes:  # pass 4
            if n.view_src is not None and get(n, -1) == -1:
                ids[n] = get(n.view_src, -1)
            for s in n.src:
                if s is not None and get(s, -1) == -1:
                    ids[s] = get(s.view_src, -1) if s.view_src is not None else ids[n]
            if get(n, -1) == -1:
                ids[n] = 0

    def split(self, g: CGraph, pinned: dict[Tensor, int] | None = None) -> tuple[Placed, Placed]:
        """`assign`, then pass 5 (the splits, each source on an incompatible backend replaced by its
        copy); returns the graph copy's nodes and leafs, each with its backend."""
        self.assign(g, pinned)
        ids = self.ids
        # pass 5: splits and their input copies
        copies: dict[tuple[int, int], list[Tensor]] = {}  # (source, backend) -> its copies, the current first
        self.copy_of = {}
        self.splits = splits = []
        cur = next((ids[n] for n in g.nodes if n.op not in VIEW_OPS), self.cpu)  # the first op's backend
        inputs: list[Tensor] = []
        members: list[Tensor] = []
        for n in g.nodes:
            if n.op in VIEW_OPS:
                members.append(n)
                continue
            nb = ids[n]
            # a new split where the backend changes, or an op reads another backend's weight after the split took inputs
            if nb != cur or (inputs and any(s is not None and s.buffer is not None and s.weights and ids[s] != cur
                                            and not self._buffer_supported(s, cur) for s in n.src)):
                splits.append((cur, inputs, members))
                cur, inputs, members = nb, [], []
            for j, s in enumerate(n.src):
                if s is None or ids[s] == cur or self._buffer_supported(s, cur):
                    continue
                key = (id(s), cur)
                if key not in copies:
                    made = [Tensor("NONE", s.type, s.ne, s.nb, [], flags=INPUT | OUTPUT if self.n_copies > 1 else 0,
                                   name=f"{self.backends[cur].name}#{s.name}#{c}") for c in range(self.n_copies)]
                    ids.update(dict.fromkeys(made, cur))
                    copies[key] = made
                    self.copy_of[made[0]] = (s, cur)
                    inputs.append(s)
                self._replaced.append((n, j, s))
                n.src[j] = copies[key][0]
            members.append(n)
        splits.append((cur, inputs, members))
        # the graph copy (pass 6 and the copy of the graph with its splits)
        gnodes: Placed = []
        for b, ins, members in splits:
            for s in ins:
                dep = Tensor("NONE", s.type, s.ne, s.nb, [s], view_src=s)  # ggml_view_tensor, op NONE
                gnodes.append((dep, ids[s]))
                gnodes.append((copies[(id(s), b)][0], b))
            gnodes.extend(zip(members, map(ids.__getitem__, members), strict=True))
        gleafs: Placed = []
        if self.n_copies > 1:
            for leaf in [leaf for leaf in g.leafs if leaf.flags & INPUT]:  # the graph inputs
                self._flagged.append((leaf, leaf.flags))
                leaf.flags |= OUTPUT  # the current copy is the leaf itself, the others its duplicates
                gleafs.append((leaf, ids[leaf]))
                gleafs.extend((Tensor("NONE", leaf.type, leaf.ne, leaf.nb, [], flags=INPUT | OUTPUT), ids[leaf])
                              for _ in range(self.n_copies - 1))
            for b, ins, _ in splits:
                for s in ins:
                    gleafs.extend((cp, b) for cp in copies[(id(s), b)])
        gleafs.extend((leaf, ids[leaf]) for leaf in g.leafs)
        return gnodes, gleafs

    def restore(self) -> None:
        """Undo `split`'s edits of the graph (sources replaced by their split copies, graph inputs
        flagged as outputs under pipeline parallelism), so that it can be scheduled again."""
        for n, j, s in reversed(self._replaced):
            n.src[j] = s
        for leaf, flags in reversed(self._flagged):
            leaf.flags = flags
        self._replaced.clear()
        self._flagged.clear()

    def reserve(self, g: CGraph, pinned: dict[Tensor, int] | None = None) -> list[int]:
        return allocate(*self.split(g, pinned), self.backends)


def allocate(nodes: Sequence[tuple[Tensor, int]], leafs: Sequence[tuple[Tensor, int]],
             backends: Sequence[Backend]) -> list[int]:
    """ggml_gallocr_alloc_graph_impl over the scheduler's graph copy: each buffer's size."""
    allocs = [Allocator(b.alignment) for b in backends]
    children: dict[Tensor, int] = {}
    views: dict[Tensor, int] = {}
    own: dict[Tensor, bool] = {}  # hash_node.allocated
    addr: dict[Tensor, tuple[int, int]] = {}  # (buffer, offset)
    sizes: dict[Tensor, int] = {}  # the bytes a tensor takes in the buffer it is in (`addr`)
    # a backend's size of a tensor: ggml_nbytes unless it pads quantized rows (the same as Backend.alloc_size)
    size_of = [b.alloc_size if b.pads_rows else spanned for b in backends]
    own_get, children_get, views_get = own.get, children.get, views.get

    def alloc_node(t: Tensor, b: int) -> None:
        # the callers have checked that t is in no buffer, is no view and is not allocated yet
        own[t] = True
        if t.op in CAN_INPLACE:
            for p in t.src:  # an allocated source of the same layout, no output, read by t alone and not viewed
                if (p is None or not own_get(p) or p.flags & OUTPUT
                        or (p.view_src is not None and p.view_src.flags & OUTPUT)
                        or not same_layout(t, p) or children_get(p, 0) != 1 or views_get(p, 0)):
                    continue
                vs = p.view_src  # a view: t takes its source's memory if it is the source's only view and reader
                if vs is not None and (views_get(vs, 0) != 1 or children_get(vs, 0) or vs.buffer is not None):
                    continue
                parent = p if vs is None else vs
                own[p] = own[parent] = False
                pb, off = addr[t] = addr[parent]  # the part of the parent's memory beyond t's size freed
                a = allocs[pb]
                size = sizes[t] = size_of[pb](t)  # as it is freed later, from the parent's buffer
                ps = a._aligned(sizes[parent])
                ns = a._aligned(size if b == pb else size_of[b](t))
                if ps > ns:
                    a.free(off + ns, ps - ns)
                return
        size = sizes[t] = size_of[b](t)
        off = allocs[b].alloc(size)
        addr[t] = (b, off)

    def free_node(t: Tensor) -> None:
        if t.flags & OUTPUT:
            return
        b, off = addr[t]
        allocs[b].free(off, sizes[t])
        own[t] = False

    for leaf, b in leafs:
        if leaf.buffer is None and leaf.view_src is None and not own_get(leaf):
            alloc_node(leaf, b)
    for n, b in nodes:
        if n.view_src is not None and n.op != "NONE":
            views[n.view_src] = views_get(n.view_src, 0) + 1
        if n.flags & INPUT and n.buffer is None and n.view_src is None and not own_get(n):
            alloc_node(n, b)
        for s in n.src:
            if s is None or s is n:
                continue
            children[s] = children_get(s, 0) + 1
            if s.flags & INPUT and s.buffer is None and s.view_src is None and not own_get(s):
                alloc_node(s, b)
    for n, b in nodes:
        srcs = n.src
        for p in srcs:
            if p is not None and p.buffer is None and p.view_src is None and p is not n and not own_get(p):
                alloc_node(p, b)
        if n.buffer is None and n.view_src is None and not own_get(n):
            alloc_node(n, b)
        for p in srcs:
            if p is None or p is n:
                continue
            left = children[p] - 1
            children[p] = left
            if left == 0 and not views_get(p, 0):
                vs = p.view_src
                if vs is not None:
                    views[vs] -= 1
                    if views[vs] == 0 and not children_get(vs, 0) and own_get(vs):
                        free_node(vs)
                elif own_get(p):
                    free_node(p)
    return [a.max_size for a in allocs]
