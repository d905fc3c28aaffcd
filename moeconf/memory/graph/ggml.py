"""ggml's graph as data: tensors with the op, type, shape (ne), strides (nb), view source and
offset the pinned ggml gives them (ggml/src/ggml.c: each op's result shape and whether it is a new
tensor or a view), and a graph built by the same depth-first, sources-left-to-right expansion
(`ggml_build_forward_expand`), nodes and leafs in ggml's order. Nothing here is sized by hand:
the scheduler and the allocator (`sched`) read `nbytes`, the layout and the flags, as ggml does."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from moeconf.model import ggml as _types

INPUT = 1
OUTPUT = 2

# ops that are views for the scheduler (ggml-backend.cpp ggml_is_view_op)
VIEW_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})


@cache
def type_block(type_name: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type."""
    return _types.quant_sizes()[_types.type_ids()[type_name]]


def row_size(type_name: str, n: int) -> int:
    block, size = type_block(type_name)
    return n * size // block


Shape = tuple[int, int, int, int]


@dataclass(eq=False, slots=True)
class Tensor:
    """One ggml tensor. `buffer` names the device whose buffer already holds it (weights, the KV
    cache): the scheduler pins ops on it there and the allocator leaves it alone; `weights`: that
    buffer's usage is weights (the scheduler's op-placement rule reads only those)."""

    op: str
    type: str
    ne: Shape
    nb: Shape
    src: list[Tensor | None]
    view_src: Tensor | None = None
    view_offs: int = 0
    flags: int = 0
    buffer: str | None = None
    weights: bool = False
    name: str = ""
    layer: int = -1  # the layer a weight belongs to (-1: none)
    sub: str = ""  # the unary or GLU op of a UNARY or GLU node (SILU, SIGMOID, SWIGLU, ...)
    span: int = -1  # `nbytes`, remembered (`spanned`; -1: not yet): a tensor's shape and strides never change


@lru_cache(maxsize=65536)
def contiguous_nb(type_name: str, ne: Shape) -> Shape:
    """The strides of a contiguous tensor, remembered: a graph repeats a few shapes per layer."""
    block, size = type_block(type_name)
    nb0 = size
    nb1 = nb0 * (ne[0] // block)
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def nbytes(t: Tensor) -> int:
    """ggml_nbytes: the bytes a tensor spans with its strides (a strided view's copy spans its gaps)."""
    ne0, ne1, ne2, ne3 = t.ne
    if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
        return 0
    nb0, nb1, nb2, nb3 = t.nb
    block, size = type_block(t.type)
    rest = (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
    if block == 1:
        return size + (ne0 - 1) * nb0 + rest
    return ne0 * nb0 // block + rest


def spanned(t: Tensor) -> int:
    """`nbytes`, computed once per tensor (the allocator asks it of every node of every placement)."""
    n = t.span
    if n < 0:
        n = t.span = nbytes(t)
    return n


def nelements(t: Tensor) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def is_contiguous(t: Tensor) -> bool:
    return t.nb == contiguous_nb(t.type, t.ne)


def same_layout(a: Tensor, b: Tensor) -> bool:  # ggml_are_same_layout
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def _ne4(ne: Sequence[int]) -> Shape:
    """A shape's first four dimensions, the missing ones 1."""
    v = (*ne, 1, 1, 1, 1)
    return (v[0], v[1], v[2], v[3])


def _same_shape(op: str, type_name: str = "") -> Callable[[Ctx, Tensor], Tensor]:
    """An op whose result is a new tensor of its source's shape and type (or `type_name`)."""

    def make(self: Ctx, a: Tensor) -> Tensor:
        return self._make(op, type_name or a.type, a.ne, [a])

    return make


def _same_shape2(op: str) -> Callable[[Ctx, Tensor, Tensor], Tensor]:
    """An op of two sources whose result is a new tensor of the first's type and shape."""

    def make(self: Ctx, a: Tensor, b: Tensor) -> Tensor:
        return self._make(op, a.type, a.ne, [a, b])

    return make


class Ctx:
    """A ggml context building tensors with ggml's shape rules (ops by their ggml names)."""

    def __init__(self) -> None:
        self.bound: list[Tensor] = []  # the tensors made in a device's buffer (weights, caches), in order

    def _make(self, op: str, type_name: str, ne: Sequence[int], src: Sequence[Tensor | None],
              view_src: Tensor | None = None, view_offs: int = 0, nb: Shape | None = None, sub: str = "") -> Tensor:
        ne4: Shape = ne if type(ne) is tuple and len(ne) == 4 else _ne4(ne)
        if view_src is not None and view_src.view_src is not None:
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        return Tensor(op, type_name, ne4, nb if nb is not None else contiguous_nb(type_name, ne4),
                      src if type(src) is list else list(src),  # each caller's list is its own
                      view_src, view_offs, sub=sub)

    # -- leafs
    def new(self, type_name: str, *ne: int, name: str = "", flags: int = 0) -> Tensor:
        t = self._make("NONE", type_name, ne, [])
        t.name, t.flags = name, flags
        return t

    def input(self, type_name: str, *ne: int, name: str) -> Tensor:
        return self.new(type_name, *ne, name=name, flags=INPUT)

    def weight(self, name: str, type_name: str, ne: Sequence[int], device: str, layer: int = -1,
               weights: bool = True) -> Tensor:
        """A tensor made in a device's buffer: a weight, or a cache (`weights` False: `cache`)."""
        ne4 = _ne4(ne)
        t = Tensor("NONE", type_name, ne4, contiguous_nb(type_name, ne4), [], buffer=device, weights=weights,
                   name=name, layer=layer)
        self.bound.append(t)
        return t

    def cache(self, name: str, type_name: str, ne: Sequence[int], device: str) -> Tensor:
        return self.weight(name, type_name, ne, device, weights=False)

    # -- views
    def view(self, a: Tensor, ne: Sequence[int], nb: Sequence[int], offset: int) -> Tensor:
        """ggml_view_1d..4d: nb are (nb1, nb2, nb3) as far as given."""
        ne4 = _ne4(ne)
        block, size = type_block(a.type)
        full = [size if block == 1 else a.nb[0], *nb]  # row_size(type, 1) of a type of 1-element blocks
        while len(full) < 4:
            full.append(full[-1] * ne4[len(full) - 1])
        return self._make("VIEW", a.type, ne4, [a], a, offset, (full[0], full[1], full[2], full[3]))

    def reshape(self, a: Tensor, *ne: int) -> Tensor:
        return self._make("RESHAPE", a.type, ne, [a], a, 0)

    def permute(self, a: Tensor, *axes: int, op: str = "PERMUTE") -> Tensor:
        ne = [0, 0, 0, 0]
        nb = [0, 0, 0, 0]
        for i, ax in enumerate(axes):
            ne[ax] = a.ne[i]
            nb[ax] = a.nb[i]
        return self._make(op, a.type, ne, [a], a, 0, (nb[0], nb[1], nb[2], nb[3]))

    def transpose(self, a: Tensor) -> Tensor:
        return self.permute(a, 1, 0, 2, 3, op="TRANSPOSE")

    # -- ops
    add, mul, div, sub = _same_shape2("ADD"), _same_shape2("MUL"), _same_shape2("DIV"), _same_shape2("SUB")
    rope_back = _same_shape2("ROPE_BACK")
    scale, fill, clamp = _same_shape("SCALE"), _same_shape("FILL"), _same_shape("CLAMP")
    sqr, sqrt, rms_norm, norm = _same_shape("SQR"), _same_shape("SQRT"), _same_shape("RMS_NORM"), _same_shape("NORM")
    argsort = _same_shape("ARGSORT", "I32")

    def _dup(self, op: str, a: Tensor, *src: Tensor | None) -> Tensor:
        return self._make(op, a.type, a.ne, [a, *src])

    def arange(self, n: int) -> Tensor:
        """ggml_arange: n F32 values, no sources."""
        return self._make("ARANGE", "F32", (n,), [])

    def unary(self, a: Tensor, kind: str) -> Tensor:
        return self._make("UNARY", a.type, a.ne, [a], sub=kind.upper())

    def rope(self, a: Tensor, pos: Tensor, freqs: Tensor | None = None) -> Tensor:
        return self._dup("ROPE", a, pos, freqs)

    def soft_max(self, a: Tensor, mask: Tensor | None = None) -> Tensor:
        return self._dup("SOFT_MAX", a, mask)

    def add_id(self, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
        return self._dup("ADD_ID", a, b, ids)

    def mul_mat(self, a: Tensor, b: Tensor) -> Tensor:
        return self._make("MUL_MAT", "F32", (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), [a, b])

    def mul_mat_id(self, w: Tensor, b: Tensor, ids: Tensor) -> Tensor:
        return self._make("MUL_MAT_ID", "F32", (w.ne[1], ids.ne[0], b.ne[2], 1), [w, b, ids])

    def get_rows(self, a: Tensor, b: Tensor) -> Tensor:
        return self._make("GET_ROWS", "I32" if a.type == "I32" else "F32", (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), [a, b])

    def set_rows(self, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        return self._make("SET_ROWS", a.type, a.ne, [b, c, a], a, 0, a.nb)  # ggml's legacy source order

    def argsort_top_k(self, a: Tensor, k: int) -> Tensor:
        s = self.argsort(a)
        return self.view(s, (k, s.ne[1], s.ne[2], s.ne[3]), (s.nb[1], s.nb[2], s.nb[3]), 0)

    def top_k(self, a: Tensor, k: int) -> Tensor:
        """ggml_top_k: the indices of each row's k largest (GGML_OP_TOP_K)."""
        return self._make("TOP_K", "I32", (k, a.ne[1], a.ne[2], a.ne[3]), [a])

    def lightning_indexer(self, q: Tensor, k: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
        """ggml_lightning_indexer: the DSA indexer's scores, one row of cells per token."""
        return self._make("LIGHTNING_INDEXER", "F32", (k.ne[2], q.ne[2], 1, q.ne[3]), [q, k, weights, mask])

    def sum_rows(self, a: Tensor) -> Tensor:
        return self._make("SUM_ROWS", a.type, (1, a.ne[1], a.ne[2], a.ne[3]), [a])

    def glu(self, a: Tensor, kind: str) -> Tensor:
        """ggml_glu of one tensor: its first half gated by its second, half as wide."""
        return self._make("GLU", a.type, (a.ne[0] // 2, *a.ne[1:]), [a], sub=kind.upper())

    def glu_split(self, a: Tensor, b: Tensor, kind: str) -> Tensor:
        return self._make("GLU", a.type, a.ne, [a, b], sub=kind.upper())

    def cont(self, a: Tensor, *ne: int) -> Tensor:
        return self._make("CONT", a.type, ne or a.ne, [a])

    def repeat(self, a: Tensor, *ne: int) -> Tensor:
        return self._make("REPEAT", a.type, ne, [a])

    def concat(self, a: Tensor, b: Tensor, dim: int) -> Tensor:
        ne = list(a.ne)
        ne[dim] += b.ne[dim]
        return self._make("CONCAT", a.type, ne, [a, b])

    def pad(self, a: Tensor, p0: int) -> Tensor:
        return self._make("PAD", a.type, (a.ne[0] + p0, a.ne[1], a.ne[2], a.ne[3]), [a])

    def cast(self, a: Tensor, type_name: str) -> Tensor:
        t = self._make("CPY", type_name, a.ne, [a])
        t.src.append(t)  # ggml_cast: the result is its own second source
        return t

    def inplace(self, op: str, a: Tensor, *src: Tensor) -> Tensor:
        """An op run in place (ggml_*_inplace): a view of its first input."""
        return self._make(op, a.type, a.ne, [a, *src], a, 0, a.nb)

    def pool_2d(self, a: Tensor, k0: int, k1: int, s0: int, s1: int) -> Tensor:
        """ggml_pool_2d without padding."""
        return self._make("POOL_2D", "F32", ((a.ne[0] - k0) // s0 + 1, (a.ne[1] - k1) // s1 + 1, a.ne[2], a.ne[3]),
                          [a])

    def cpy(self, a: Tensor, b: Tensor) -> Tensor:
        """ggml_cpy: a view of the destination, its sources the data and the destination."""
        return self._make("CPY", b.type, b.ne, [a, b], b, 0, b.nb)

    def ssm_conv(self, sx: Tensor, c: Tensor) -> Tensor:
        return self._make("SSM_CONV", "F32", (c.ne[1], sx.ne[0] - c.ne[0] + 1, sx.ne[2]), [sx, c])

    def ssm_scan(self, s: Tensor, x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, ids: Tensor) -> Tensor:
        """ggml_ssm_scan: one flat F32 result, the per-token outputs then the new states (no rollback snapshots)."""
        n = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3] + s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0]
        return self._make("SSM_SCAN", "F32", (n,), [s, x, dt, a, b, c, ids])

    def gated_delta_net(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> Tensor:
        s_v, h, n_t, n_s = v.ne
        return self._make("GATED_DELTA_NET", "F32", (s_v * h, n_t * n_s + s_v * n_s), [q, k, v, g, beta, state])

    def flash_attn_ext(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return self._make("FLASH_ATTN_EXT", "F32", (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), [q, k, v, mask])

    def dsv4_hc_pre(self, x: Tensor, weights: Tensor) -> Tensor:
        """ggml_dsv4_hc_pre (and _gated): x [n_embd, streams, tokens] mixed down to [n_embd, tokens]."""
        return self._make("DSV4_HC_PRE", "F32", (x.ne[0], x.ne[2]), [x, weights])

    def dsv4_hc_comb(self, mixes: Tensor, scale: Tensor, base: Tensor, hc: int) -> Tensor:
        """ggml_dsv4_hc_comb: the hyper-connections' hc x hc mixing matrix per token."""
        return self._make("DSV4_HC_COMB", "F32", (hc, hc, mixes.ne[1]), [mixes, scale, base])

    def dsv4_hc_post(self, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor | None) -> Tensor:
        """ggml_dsv4_hc_post: x spread back over the residual's streams [n_embd, streams, tokens]."""
        return self._make("DSV4_HC_POST", "F32", (x.ne[0], residual.ne[1], x.ne[1]), [x, residual, post, comb])


class CGraph:
    """ggml_cgraph: nodes and leafs in ggml_visit_parents order (depth first, sources left to right)."""

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._seen: set[Tensor] = set()  # tensors hash by identity (eq=False)
        # the scheduler's view of the graph that no placement changes (`sched._static`), with the node count
        self.sched_static: tuple[int, list[Tensor], list[Tensor]] | None = None

    def expand(self, t: Tensor) -> None:
        seen = self._seen
        if t in seen:
            return
        seen.add(t)
        nodes, leafs = self.nodes, self.leafs
        stack: list[tuple[Tensor, Iterator[Tensor | None]]] = [(t, iter(t.src))]
        push, pop = stack.append, stack.pop
        while stack:
            node, it = stack[-1]
            for s in it:
                if s is not None and s not in seen:
                    seen.add(s)
                    push((s, iter(s.src)))
                    break
            else:
                pop()
                if node.op == "NONE":
                    if not node.name:  # ggml_visit_parents names an unnamed leaf by its index
                        node.name = f"leaf_{len(leafs)}"
                    leafs.append(node)
                else:
                    nodes.append(node)
