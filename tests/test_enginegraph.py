"""tests/enginegraph.py: reading the engine's graph dumps (tests/data/graphs/, recorded by
tests/engine/graphdump.py) and naming the first node where two graphs differ."""

from __future__ import annotations

import copy
import gzip
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from moeconf.engines import NEWEST_MAINLINE_BUILD
from moeconf.fixtures.graphmodels import ARCHS, DIMS, FULL, REAL, write_graph_model
from moeconf.fixtures.layouts import tensors
from moeconf.model.load import load_inventory
from tests.engine.graphdump import DATA, LINES, REAL_DIMS, REAL_LINES, file_name, index, stale
from tests.enginegraph import NODE_FIELDS, EngineGraph, GraphDumpError, Node, Ref, compare, from_dict, load

INDEX = json.loads((DATA / "index.json").read_text())


def recorded(arch: str = "qwen3moe", dims: str = "b", line: str = "expscpu") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress((DATA / file_name(arch, dims, line)).read_bytes()))
    return doc


@pytest.fixture(scope="module")
def graph() -> EngineGraph:
    return from_dict(recorded(), endpoints=["127.0.0.1:50052"])


def with_node(g: EngineGraph, i: int, **changes: Any) -> EngineGraph:
    nodes = list(g.nodes)
    nodes[i] = replace(nodes[i], **changes)
    return replace(g, nodes=tuple(nodes))


def first(g: EngineGraph, pred: Any) -> Node:
    return next(n for n in g.nodes if pred(n))


def test_identical_graphs_agree(graph: EngineGraph) -> None:
    assert compare(graph, graph) is None
    assert compare(graph, from_dict(recorded(), endpoints=["127.0.0.1:50052"])) is None


def test_endpoints_are_substituted(graph: EngineGraph) -> None:
    assert graph.backends[0].name == "RPC0[127.0.0.1:50052]"
    assert "{EP0}" in from_dict(recorded()).backends[0].name


# one wrong field in one node: the comparison names that node and that field, with both sides
@pytest.mark.parametrize("field", ["op", "type", "ne", "nb", "view_offs", "flags", "name"])
def test_one_wrong_field_names_that_node(graph: EngineGraph, field: str) -> None:
    node = first(graph, lambda n: n.op == "MUL_MAT_ID")
    wrong: dict[str, Any] = {"op": "MUL_MAT", "type": "f16", "ne": (node.ne[0] + 1, *node.ne[1:]),
                             "nb": (node.nb[0], node.nb[1] * 2, *node.nb[2:]), "view_offs": 64,
                             "flags": ("output",), "name": "ffn_moe_other-9"}
    ours = with_node(graph, node.i, **{field: wrong[field]})
    diff = compare(ours, graph)
    assert diff is not None and diff.where == "node" and diff.index == node.i and diff.fields == (field,)
    assert diff.ours is not None and diff.theirs is not None
    assert diff.theirs == graph.describe_node(node) and diff.ours != diff.theirs
    assert f"node {node.i} differs ({field})" in str(diff)


def test_wrong_view_source(graph: EngineGraph) -> None:
    view = first(graph, lambda n: n.view_src is not None and n.view_src.kind == "node" and n.view_src.index > 0)
    assert view.view_src is not None
    ours = with_node(graph, view.i, view_src=Ref("node", view.view_src.index - 1))
    diff = compare(ours, graph)
    assert diff is not None and (diff.index, diff.fields) == (view.i, ("view_src",))


def test_wrong_source_node_and_wrong_weight(graph: EngineGraph) -> None:
    node = first(graph, lambda n: n.op == "MUL_MAT" and n.src[0] is not None and n.src[0].kind == "leaf")
    assert node.src[1] is not None and node.src[1].kind == "node"
    other = Ref("node", node.src[1].index - 1)
    diff = compare(with_node(graph, node.i, src=(node.src[0], other)), graph)
    assert diff is not None and (diff.index, diff.fields) == (node.i, ("src",))
    # another weight of the same shape, named differently: a leaf is known by its name
    weight = node.src[0]
    assert weight is not None
    same_shape = next(j for j, leaf in enumerate(graph.leafs) if leaf.name != graph.leafs[weight.index].name
                      and leaf.ne == graph.leafs[weight.index].ne and leaf.buffer == "weights")
    wrong = Ref("leaf", same_shape, graph.leafs[same_shape].name)
    diff = compare(with_node(graph, node.i, src=(wrong, node.src[1])), graph)
    assert diff is not None and (diff.index, diff.fields) == (node.i, ("src",))
    assert diff.ours is not None and graph.leafs[same_shape].name in str(diff.ours["src"])


def test_wrong_backend_and_copy(graph: EngineGraph) -> None:
    node = first(graph, lambda n: n.op == "MUL_MAT_ID")
    assert node.backend is not None
    moved = 1 - node.backend
    diff = compare(with_node(graph, node.i, backend=moved), graph)
    assert diff is not None and (diff.index, diff.fields) == (node.i, ("backend",))
    copied = first(graph, lambda n: any(r is not None and r.copy is not None for r in n.src))
    srcs = tuple(replace(r, copy=None) if r is not None else None for r in copied.src)
    diff = compare(with_node(graph, copied.i, src=srcs), graph)
    assert diff is not None and (diff.index, diff.fields) == (copied.i, ("src",))


def test_only_the_first_difference_is_named(graph: EngineGraph) -> None:
    a, b = graph.nodes[10], graph.nodes[20]
    ours = with_node(with_node(graph, b.i, op="ADD"), a.i, type="f16")
    diff = compare(ours, graph)
    assert diff is not None and (diff.index, diff.fields) == (a.i, ("type",))


def test_missing_and_extra_nodes(graph: EngineGraph) -> None:
    short = replace(graph, nodes=graph.nodes[:-1])
    diff = compare(short, graph)
    assert diff is not None and diff.index == len(graph.nodes) - 1 and diff.fields == ("count",)
    assert diff.ours is None and diff.theirs is not None
    assert "ours: no node" in str(diff)


def test_splits_compared_after_nodes(graph: EngineGraph) -> None:
    splits = list(graph.splits)
    splits[2] = replace(splits[2], end=splits[2].end + 1)
    diff = compare(replace(graph, splits=tuple(splits)), graph)
    assert diff is not None and diff.where == "split" and diff.index == 2 and diff.fields == ("end",)
    assert compare(replace(graph, splits=tuple(splits)), graph, ignore={"splits"}) is None
    splits = list(graph.splits)
    splits[1] = replace(splits[1], inputs=splits[1].inputs[1:])
    diff = compare(replace(graph, splits=tuple(splits)), graph)
    assert diff is not None and (diff.where, diff.index, diff.fields) == ("split", 1, ("inputs",))


def test_ignored_fields(graph: EngineGraph) -> None:
    node = graph.nodes[5]
    assert compare(with_node(graph, node.i, name="x", nb=(1, 2, 3, 4)), graph, ignore={"name", "nb"}) is None
    assert set(NODE_FIELDS) >= {"op", "type", "ne", "view_src", "src", "backend"}


def test_malformed_dumps_are_refused() -> None:
    doc = recorded()
    with pytest.raises(GraphDumpError, match="not a graph dump"):
        from_dict({**doc, "format": "other/1"})
    bad = copy.deepcopy(doc)
    bad["nodes"][3]["src"][0] = {"node": 3}  # a node reading itself
    with pytest.raises(GraphDumpError, match="node 3"):
        from_dict(bad)
    cast = copy.deepcopy(doc)  # ggml_cast: a CPY whose destination is itself (glm5-next's indexer)
    cast["nodes"][3].update(op="CPY", src=[{"node": 2}, {"node": 3}])
    assert from_dict(cast).nodes[3].src[1] == Ref("node", 3)
    cast["nodes"][3]["src"] = [{"node": 3}, {"node": 3}]
    with pytest.raises(GraphDumpError, match="node 3"):
        from_dict(cast)
    bad = copy.deepcopy(doc)
    bad["nodes"][3]["src"][0] = {"tensor": 1}
    with pytest.raises(GraphDumpError, match="reference"):
        from_dict(bad)
    bad = copy.deepcopy(doc)
    del bad["nodes"][3]["op"]
    with pytest.raises(GraphDumpError, match="lacks a field"):
        from_dict(bad)
    with pytest.raises(GraphDumpError, match="not JSON"):
        load("{")


def test_every_recorded_graph_loads() -> None:
    files = {p.name for p in DATA.glob("*.json.gz")}
    assert files == {g["file"] for g in INDEX["graphs"]}
    assert {(g["arch"], g["dims"], g["line"]) for g in INDEX["graphs"]} == {
        (a, d, line) for a in ARCHS for d in DIMS for line in LINES} | {
        (a, REAL_DIMS, line) for a in REAL for line in REAL_LINES}
    for g in INDEX["graphs"]:
        eg = load(DATA / g["file"])
        assert (eg.arch, len(eg.nodes), len(eg.splits)) == (g["arch"], g["nodes"], g["splits"])
        assert all(r.kind != "other" for n in eg.nodes for r in n.src if r is not None)
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 12 * 2**20  # the repository stays small


def test_recorded_by_the_pinned_engine() -> None:
    assert INDEX["engine"] == {"name": "llama.cpp", "commit": "0c1e570", "build": NEWEST_MAINLINE_BUILD}
    assert INDEX["lines"] == LINES and INDEX["dims"] == {k: vars(v) for k, v in DIMS.items()}
    assert INDEX["real_lines"] == REAL_LINES and INDEX["real"] == REAL


def test_staleness_check_names_what_changed(tmp_path: Path) -> None:
    # the engine suite's check fed a changed engine answer: it names the file and the first node
    # (on a copy of dbrx's graphs and one real-config graph, with their index)
    real = file_name("olmoe", REAL_DIMS, "2rpc32k")
    subset = [g for g in INDEX["graphs"] if g["arch"] == "dbrx" or g["file"] == real]
    fresh = {(g["arch"], g["dims"], g["line"]): json.loads(gzip.decompress((DATA / g["file"]).read_bytes()))
             for g in subset}
    folder = tmp_path / "graphs"
    folder.mkdir()
    for g in subset:
        shutil.copy(DATA / g["file"], folder / g["file"])
    (folder / "index.json").write_text(json.dumps(index(fresh), indent=1) + "\n")
    assert stale(folder, fresh) == []
    assert index(fresh)["graphs"] == subset
    changed = copy.deepcopy(fresh)
    changed["dbrx", "b", "ngl2"]["nodes"][7]["op"] = "ADD"
    problems = stale(folder, changed)
    assert problems == ["dbrx-b-ngl2.json.gz: differs: node 7 differs (op)\n"
                        "  recorded: name='Vcur-0', op='VIEW'\n  now: name='Vcur-0', op='ADD'"]
    del changed["dbrx", "b", "ngl2"]
    assert stale(folder, changed) == ["dbrx-b-ngl2.json.gz: recorded, but no longer dumped",
                                      "index.json: not what the dumps give"]


@pytest.mark.parametrize("arch", ARCHS)
def test_graph_models_read_as_inventories(arch: str, tmp_path: Path) -> None:
    for dims in DIMS:
        inv = load_inventory(write_graph_model(arch, dims, tmp_path / f"{arch}-{dims}.gguf"))
        assert inv.arch == arch
        g = load(DATA / file_name(arch, dims, "rpc"))
        weights = {leaf.name for leaf in g.leafs if leaf.buffer == "weights"}
        assert weights <= {t.name for t in inv.tensors}


@pytest.mark.parametrize("arch", sorted(REAL))
def test_real_models_hold_the_dumped_weights(arch: str) -> None:
    # each real-config dump reads only weights its full-size layout has, with their sizes (DeepSeek-V4's
    # loader reads attn_output_a as 3-d), and the two-device line puts layers on both devices
    lay = FULL[REAL[arch]]
    sizes = {name: math.prod(shape) for name, _, shape in tensors(lay)}
    for line in REAL_LINES:
        g = load(DATA / file_name(arch, REAL_DIMS, line))
        assert g.arch == lay.arch and g.cparams["n_ctx"] == 32768
        weights = [leaf for leaf in g.leafs if leaf.buffer == "weights"]
        assert weights and all(sizes[w.name] == math.prod(w.ne) for w in weights)
    g = load(DATA / file_name(arch, REAL_DIMS, "2rpc32k"))
    used = {g.backends[n.backend].name for n in g.nodes if n.backend is not None}
    assert g.cparams["pipeline_parallel"] and {"RPC0[{EP0}]", "RPC0[{EP1}]"} <= used


def test_pipeline_inputs_compared() -> None:
    # two devices, every layer offloaded: pipeline parallelism, 4 copies of each graph input
    g = load(DATA / file_name("qwen3moe", "b", "2rpc"))
    assert g.cparams["pipeline_parallel"] and g.cparams["n_copies"] == 4
    assert "inp_tokens" in {r.name for r in g.graph_inputs}
    diff = compare(replace(g, graph_inputs=g.graph_inputs[:-1]), g)
    assert diff is not None and (diff.where, diff.index) == ("graph_inputs", len(g.graph_inputs) - 1)
    assert compare(replace(g, graph_inputs=g.graph_inputs[:-1]), g, ignore={"graph_inputs"}) is None
    assert load(DATA / file_name("qwen3moe", "b", "rpc")).graph_inputs == ()
