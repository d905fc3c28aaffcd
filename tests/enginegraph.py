"""The engine's reserved graph as the engine dumps it (tests/engine/graphdump.cpp, format
`moeconf-graphdump/1`: docs/memory.md "Checked node by node"), moeconf's graph in the same records
(`engine_graph`), and the check that names the first node where moeconf's graph and the engine's differ.

A dump lists the graph's leafs (weights, inputs, caches) and nodes in graph order, each node with
its op, type, shape, strides, view source and offset, sources, flags and the backend the scheduler
gave it, then the scheduler's splits. Sources refer to a node by index or to a leaf by name."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import INPUT, OUTPUT, Tensor
from moeconf.memory.graph.model import Setup
from moeconf.memory.graph.sched import Scheduler
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

FORMAT = "moeconf-graphdump/1"
# what compare() looks at per node, in the order a difference names them
NODE_FIELDS = ("name", "op", "type", "ne", "nb", "view_src", "view_offs", "src", "flags", "backend")
SPLIT_FIELDS = ("backend", "start", "end", "inputs")


class GraphDumpError(ValueError):
    """A document that is not a graph dump this module reads."""


@dataclass(frozen=True)
class Ref:
    """A tensor a node reads: node `index`, leaf `index` (named `name`), or a tensor the dump could
    not place (`other`, by name). `copy`: the backend id of the scheduler's copy the node reads
    instead (a split input), else None."""

    kind: Literal["node", "leaf", "other"]
    index: int
    name: str = ""
    copy: int | None = None


@dataclass(frozen=True)
class Backend:
    name: str
    device: str
    buft: str


@dataclass(frozen=True)
class Leaf:
    i: int
    name: str
    type: str
    ne: tuple[int, ...]
    nb: tuple[int, ...]
    flags: tuple[str, ...]
    backend: int | None
    buffer: str | None  # usage of the buffer it sits in: weights, any, compute (None: unallocated)
    buft: str | None
    view_src: Ref | None
    view_offs: int


@dataclass(frozen=True)
class Node:
    i: int
    name: str
    op: str
    type: str
    ne: tuple[int, ...]
    nb: tuple[int, ...]
    view_src: Ref | None
    view_offs: int
    src: tuple[Ref | None, ...]
    flags: tuple[str, ...]
    backend: int | None


@dataclass(frozen=True)
class Split:
    i: int
    backend: int
    start: int
    end: int
    inputs: tuple[Ref, ...]


@dataclass(frozen=True)
class EngineGraph:
    arch: str
    engine: Mapping[str, Any]
    args: tuple[str, ...]
    ubatch: Mapping[str, int]
    cparams: Mapping[str, Any]
    backends: tuple[Backend, ...]
    leafs: tuple[Leaf, ...]
    nodes: tuple[Node, ...]
    splits: tuple[Split, ...]
    # input leafs the scheduler keeps `cparams["n_copies"]` copies of (pipeline parallelism; else empty)
    graph_inputs: tuple[Ref, ...] = ()

    def backend_name(self, backend: int | None) -> str | None:
        return None if backend is None else self.backends[backend].name

    def ref_key(self, ref: Ref | None) -> tuple[Any, ...] | None:
        """What identifies a reference across two graphs: a node by index, a leaf by name, type and
        shape, a copy by its backend's name."""
        if ref is None:
            return None
        copy = self.backend_name(ref.copy)
        if ref.kind == "node":
            return ("node", ref.index, copy)
        if ref.kind == "leaf":
            leaf = self.leafs[ref.index]
            return ("leaf", leaf.name, leaf.type, leaf.ne, copy)
        return ("other", ref.name, copy)

    def describe_ref(self, ref: Ref | None) -> str | None:
        if ref is None:
            return None
        copy = f" (copy on {self.backend_name(ref.copy)})" if ref.copy is not None else ""
        if ref.kind == "node":
            n = self.nodes[ref.index]
            return f"node {ref.index} {n.name} {n.op}{copy}"
        if ref.kind == "leaf":
            return f"leaf {self.leafs[ref.index].name}{copy}"
        return f"unplaced tensor {ref.name}{copy}"

    def node_key(self, node: Node, field: str) -> Any:
        if field == "view_src":
            return self.ref_key(node.view_src)
        if field == "src":
            return tuple(self.ref_key(r) for r in node.src)
        if field == "backend":
            return self.backend_name(node.backend)
        return getattr(node, field)

    def describe_node(self, node: Node) -> dict[str, Any]:
        """The node's fields with references and backends by name."""
        return {"i": node.i, "name": node.name, "op": node.op, "type": node.type, "ne": list(node.ne),
                "nb": list(node.nb), "view_src": self.describe_ref(node.view_src), "view_offs": node.view_offs,
                "src": [self.describe_ref(r) for r in node.src], "flags": list(node.flags),
                "backend": self.backend_name(node.backend)}

    def split_key(self, split: Split, field: str) -> Any:
        if field == "backend":
            return self.backend_name(split.backend)
        if field == "inputs":
            return tuple(self.ref_key(r) for r in split.inputs)
        return getattr(split, field)

    def describe_split(self, split: Split) -> dict[str, Any]:
        return {"i": split.i, "backend": self.backend_name(split.backend), "start": split.start, "end": split.end,
                "inputs": [self.describe_ref(r) for r in split.inputs]}


@dataclass(frozen=True)
class Difference:
    """The first place two graphs differ: a node or split (`index`), which of its `fields` differ,
    and each side's record (None where that side has no such node or split); for the pipeline's
    graph inputs, the first position that differs and both lists."""

    where: Literal["node", "split", "graph_inputs"]
    index: int
    fields: tuple[str, ...]
    ours: Mapping[str, Any] | None
    theirs: Mapping[str, Any] | None

    def __str__(self) -> str:
        return self.describe()

    def describe(self, ours: str = "ours", theirs: str = "engine") -> str:
        """The difference in lines: which node or split, which fields, then each side's record."""
        lines = [f"{self.where} {self.index} differs ({', '.join(self.fields)})"]
        shown = dict.fromkeys(("name", "op", *self.fields) if self.where == "node" else self.fields)
        for side, rec in ((ours, self.ours), (theirs, self.theirs)):
            if rec is None:
                lines.append(f"  {side}: no {self.where} {self.index}")
            else:
                lines.append(f"  {side}: " + ", ".join(f"{f}={rec[f]!r}" for f in shown if f in rec))
        return "\n".join(lines)


def _first_difference(kind: str, a: Sequence[Any], b: Sequence[Any], fields: Sequence[str],
                      key: tuple[Callable[[Any, str], Any], Callable[[Any, str], Any]],
                      describe: tuple[Callable[[Any], Any], Callable[[Any], Any]]) -> Difference | None:
    """The first of two lists' entries (nodes or splits) that differ in a field, or in the count."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b):
            return Difference(kind, i, ("count",), describe[0](a[i]) if i < len(a) else None,
                              describe[1](b[i]) if i < len(b) else None)
        differ = tuple(f for f in fields if key[0](a[i], f) != key[1](b[i], f))
        if differ:
            return Difference(kind, i, differ, describe[0](a[i]), describe[1](b[i]))
    return None


def compare(ours: EngineGraph, theirs: EngineGraph, ignore: Collection[str] = ()) -> Difference | None:
    """The first node (then split, then pipeline input) where `ours` and `theirs` differ, or None when
    they agree. `ignore`: fields not compared (NODE_FIELDS, SPLIT_FIELDS, "splits", "graph_inputs")."""
    found = _first_difference("node", ours.nodes, theirs.nodes, [f for f in NODE_FIELDS if f not in ignore],
                              (ours.node_key, theirs.node_key), (ours.describe_node, theirs.describe_node))
    if found is not None or "splits" in ignore:
        return found
    found = _first_difference("split", ours.splits, theirs.splits, [f for f in SPLIT_FIELDS if f not in ignore],
                              (ours.split_key, theirs.split_key), (ours.describe_split, theirs.describe_split))
    if found is not None:
        return found
    if "graph_inputs" in ignore:
        return None
    a_in = [ours.ref_key(r) for r in ours.graph_inputs]
    b_in = [theirs.ref_key(r) for r in theirs.graph_inputs]
    if a_in != b_in:
        i = next((k for k, (x, y) in enumerate(zip(a_in, b_in, strict=False)) if x != y), min(len(a_in), len(b_in)))
        return Difference("graph_inputs", i, ("inputs",),
                          {"inputs": [ours.describe_ref(r) for r in ours.graph_inputs]},
                          {"inputs": [theirs.describe_ref(r) for r in theirs.graph_inputs]})
    return None


def _ref(obj: Any, where: str) -> Ref | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise GraphDumpError(f"{where}: a reference is an object, not {obj!r}")
    copy = obj.get("copy")
    if "node" in obj:
        return Ref("node", int(obj["node"]), "", copy)
    if "leaf" in obj:
        return Ref("leaf", int(obj["leaf"]), str(obj.get("name", "")), copy)
    if "other" in obj:
        return Ref("other", -1, str(obj["other"]), copy)
    raise GraphDumpError(f"{where}: a reference names a node, a leaf or other: {obj!r}")


def _ints(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


def _sub(text: str, endpoints: Sequence[str]) -> str:
    for k, ep in enumerate(endpoints):
        text = text.replace(f"{{EP{k}}}", ep)
    return text


def from_dict(doc: Mapping[str, Any], endpoints: Sequence[str] = ()) -> EngineGraph:
    """A graph dump's document as typed records; `{EPk}` in names become `endpoints[k]`."""
    if doc.get("format") != FORMAT:
        raise GraphDumpError(f"not a graph dump (format {doc.get('format')!r}, expected {FORMAT!r})")
    try:
        backends = tuple(Backend(_sub(b["name"], endpoints), _sub(b["device"], endpoints), _sub(b["buft"], endpoints))
                         for b in doc["backends"])
        leafs = tuple(Leaf(int(x["i"]), x["name"], x["type"], _ints(x["ne"]), _ints(x["nb"]), tuple(x["flags"]),
                           x["backend"], x["buffer"], None if x["buft"] is None else _sub(x["buft"], endpoints),
                           _ref(x["view_src"], f"leaf {x['i']}"), int(x["view_offs"])) for x in doc["leafs"])
        nodes = tuple(Node(int(x["i"]), x["name"], x["op"], x["type"], _ints(x["ne"]), _ints(x["nb"]),
                           _ref(x["view_src"], f"node {x['i']}"), int(x["view_offs"]),
                           tuple(_ref(s, f"node {x['i']}") for s in x["src"]), tuple(x["flags"]), x["backend"])
                      for x in doc["nodes"])
        splits = tuple(Split(int(s["i"]), int(s["backend"]), int(s["start"]), int(s["end"]),
                             tuple(r for r in (_ref(r, f"split {s['i']}") for r in s["inputs"]) if r is not None))
                       for s in doc["splits"])
        graph = EngineGraph(doc["model"]["arch"], dict(doc["engine"]),
                            tuple(_sub(a, endpoints) for a in doc["args"]), dict(doc["ubatch"]),
                            dict(doc["cparams"]), backends, leafs, nodes, splits,
                            tuple(r for r in (_ref(r, "graph_inputs") for r in doc["graph_inputs"]) if r is not None))
    except (KeyError, TypeError) as e:
        raise GraphDumpError(f"graph dump lacks a field or has a wrong one: {e}") from e
    _check(graph)
    return graph


def _check(g: EngineGraph) -> None:
    """References point inside the graph (a node only to an earlier node)."""
    def ok(ref: Ref | None, before: int) -> bool:
        if ref is None or ref.kind == "other":
            return True
        if ref.copy is not None and not 0 <= ref.copy < len(g.backends):
            return False
        return ref.index < before if ref.kind == "node" else 0 <= ref.index < len(g.leafs)

    def own_destination(n: Node, k: int, ref: Ref | None) -> bool:
        # ggml_cast: a CPY whose destination (src[1]) is the node itself
        return n.op == "CPY" and k == 1 and ref is not None and ref.kind == "node" and ref.index == n.i

    for n in g.nodes:
        if not (ok(n.view_src, n.i) and all(ok(r, n.i) or own_destination(n, k, r) for k, r in enumerate(n.src))):
            raise GraphDumpError(f"node {n.i} ({n.name}) refers outside the graph")
        if n.backend is not None and not 0 <= n.backend < len(g.backends):
            raise GraphDumpError(f"node {n.i} ({n.name}) has backend {n.backend} of {len(g.backends)}")
    for s in g.splits:
        if not (0 <= s.start <= s.end <= len(g.nodes) and 0 <= s.backend < len(g.backends)
                and all(ok(r, len(g.nodes)) for r in s.inputs)):
            raise GraphDumpError(f"split {s.i} refers outside the graph")
    if not all(ok(r, len(g.nodes)) for r in g.graph_inputs):
        raise GraphDumpError("a graph input refers outside the graph")


def load(src: str | bytes | Path | Mapping[str, Any], endpoints: Sequence[str] = ()) -> EngineGraph:
    """A graph dump from its JSON text, a (gzipped) file, or the parsed document."""
    if isinstance(src, Path):
        raw = src.read_bytes()
        src = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    if isinstance(src, bytes):
        src = src.decode()
    if isinstance(src, str):
        try:
            doc = json.loads(src)
        except json.JSONDecodeError as e:
            raise GraphDumpError(f"graph dump is not JSON: {e}") from e
    else:
        doc = src
    if not isinstance(doc, Mapping):
        raise GraphDumpError("a graph dump is one JSON object")
    return from_dict(doc, endpoints)


def type_name(t: str) -> str:
    """ggml_type_name from the GGUF spelling (F32 -> f32, Q4_K -> q4_K)."""
    low = t.lower()
    return low[:-2] + "_K" if low.endswith("_k") else low


def _op(t: Tensor) -> str:
    return t.sub if t.op in ("UNARY", "GLU") and t.sub else t.op


def placed(inv: Inventory, args: Sequence[str]) -> tuple[Placement, Setup]:
    """moeconf's placement of llama.cpp's command line `args` on `inv`, and the graph's setup under it."""
    from moeconf.engines import engine
    from moeconf.explanation import explain
    from moeconf.memory import read_settings
    from moeconf.memory.estimate import pipeline_parallel
    from moeconf.memory.graph.model import setup_for

    eng = engine("llama.cpp")
    ex = explain(inv, eng, list(args), gpus=[])
    st = read_settings(list(args), eng)
    iv = ex.invocation
    pipe = pipeline_parallel(ex.placement, len(ex.accelerators), iv.n_gpu_layers(),
                             iv.split_mode.text if iv.split_mode else None, st, bool(ex.items))
    return ex.placement, setup_for(inv, st, pipeline=pipe)


def scheduled(placement: Placement, setup: Setup, arch: str) -> EngineGraph:
    """moeconf's graph of `placement`, split by the scheduler, as a dump reads: the last reserve's, which keeps
    the norms pinned to their layer's GPU (llama-fit-params' sizing reserve drops them)."""
    from moeconf.memory.graph.model import build

    setup = replace(setup, norm_pins=True)
    g, backends = build(placement, setup)
    s = Scheduler(backends, pipeline=setup.pipeline, op_offload=setup.op_offload)
    s.split(g.gf, g.pinned)
    return engine_graph(g, s, arch)


def engine_graph(g: GraphContext, sched: Scheduler, arch: str) -> EngineGraph:
    """moeconf's scheduled graph as a dump reads (`EngineGraph`): the nodes with their op, type, shape,
    strides, view source, sources (a split input's copy named by its backend), flags and backend, and the
    scheduler's splits, for `compare` to name the first node where moeconf's graph and the engine's differ."""
    nodes = g.gf.nodes
    leafs = g.gf.leafs
    node_ix = {id(n): i for i, n in enumerate(nodes)}
    leaf_ix = {id(x): i for i, x in enumerate(leafs)}

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

    ebackends = tuple(Backend(b.name, b.name.split("[")[0], b.name) for b in sched.backends)
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
    # pass 6 of the scheduler: under pipeline parallelism every input leaf, in leaf order, gets its copies
    inputs = tuple(r for r in (ref(x) for x in leafs if x.flags & INPUT) if r is not None) \
        if sched.n_copies > 1 else ()
    return EngineGraph(arch, {}, (), {}, {}, ebackends, eleafs, enodes, tuple(splits), inputs)


def _trim(src: list[Tensor | None]) -> list[Tensor | None]:
    out = list(src)
    while out and out[-1] is None:
        out.pop()
    return out
