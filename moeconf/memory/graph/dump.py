"""moeconf's graph as the engine's graph dump reads (`enginegraph.EngineGraph`): the nodes with
their op, type, shape, strides, view source, sources (a split input's copy named by its backend),
flags and backend, and the scheduler's splits, for `enginegraph.compare` to name the first node
where moeconf's graph and the engine's differ."""

from __future__ import annotations

from moeconf.memory.enginegraph import Backend as EBackend
from moeconf.memory.enginegraph import EngineGraph, Leaf, Node, Ref, Split
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import INPUT, OUTPUT, Tensor
from moeconf.memory.graph.sched import Scheduler


def type_name(t: str) -> str:
    """ggml_type_name from the GGUF spelling (F32 -> f32, Q4_K -> q4_K)."""
    low = t.lower()
    return low[:-2] + "_K" if low.endswith("_k") else low


def _op(t: Tensor) -> str:
    return t.sub if t.op in ("UNARY", "GLU") and t.sub else t.op


def engine_graph(g: GraphContext, sched: Scheduler, arch: str) -> EngineGraph:
    nodes = g.gf.nodes
    leafs = g.gf.leafs
    node_ix = {id(n): i for i, n in enumerate(nodes)}
    leaf_ix = {id(x): i for i, x in enumerate(leafs)}
    bindex = {b.name: i for i, b in enumerate(sched.backends)}

    def ref(t: Tensor | None) -> Ref | None:
        if t is None:
            return None
        copy: int | None = None
        if t in sched.copy_of:
            t, copy = sched.copy_of[t]
        if id(t) in node_ix:
            return Ref("node", node_ix[id(t)], t.name, copy)
        if id(t) in leaf_ix:
            return Ref("leaf", leaf_ix[id(t)], t.name or f"leaf_{leaf_ix[id(t)]}", copy)  # ggml names it so
        return Ref("other", -1, t.name, copy)

    def flags(t: Tensor, node: bool) -> tuple[str, ...]:
        out = []
        if t.flags & INPUT:
            out.append("input")
        if t.flags & OUTPUT:
            out.append("output")
        if node:
            out.append("compute")
        return tuple(out)

    ebackends = tuple(EBackend(b.name, b.name.split("[")[0], b.name) for b in sched.backends)
    eleafs = tuple(Leaf(i, x.name or f"leaf_{i}", type_name(x.type), x.ne, x.nb, flags(x, False), sched.ids.get(x),
                        ("weights" if x.weights else "any") if x.buffer else None, x.buffer, ref(x.view_src),
                        x.view_offs) for i, x in enumerate(leafs))
    enodes = tuple(Node(i, n.name, _op(n), type_name(n.type), n.ne, n.nb, ref(n.view_src), n.view_offs,
                        tuple(ref(s) for s in _trim(n.src)), flags(n, True), sched.ids.get(n))
                   for i, n in enumerate(nodes))
    splits = []
    for k, (b, ins, members) in enumerate(sched.splits):
        start = node_ix[id(members[0])] if members else len(nodes)
        splits.append(Split(k, b, start, start + len(members), tuple(r for r in map(ref, ins) if r is not None)))
    del bindex
    # pass 6 of the scheduler: under pipeline parallelism every input leaf, in leaf order, gets its copies
    inputs = tuple(r for r in (ref(x) for x in leafs if x.flags & INPUT) if r is not None) \
        if sched.n_copies > 1 else ()
    return EngineGraph(arch, {}, (), {}, {}, ebackends, eleafs, enodes, tuple(splits), inputs)


def _trim(src: list[Tensor | None]) -> list[Tensor | None]:
    out = list(src)
    while out and out[-1] is None:
        out.pop()
    return out
