"""The memory model's graph (moeconf/memory/graph) held to the engine: node for node against the
engine's own reserved graphs (tests/data/graphs/, dumped by tests/engine/graphdump.cpp from the
tiny models of moeconf/fixtures/graphmodels.py in two dimension sets, five command lines each), and
compute per device against `llama-fit-params -fitp on` figures: the new architectures' real
configs (tests/data/graph_real_oracle.json, layouts tests/graph_real.py) and Qwen3-30B-A3B's
figures the hand replays were built on (replay_oracle.json, cpu_layers_oracle.json)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.graphmodels import write_graph_model
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory import read_settings
from moeconf.memory.estimate import DeviceMemory, pipeline_parallel
from moeconf.memory.graph import ggml, model, sched
from moeconf.memory.graph.archs import ARCHS
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.placement import Placement
from moeconf.sizing import estimate_explained
from tests import enginegraph
from tests.graph_real import EXTRA, write_extra_real, write_real

DATA = Path(__file__).parent / "data"
GRAPHS = DATA / "graphs"
INDEX = json.loads((GRAPHS / "index.json").read_text())
EPS = ("127.0.0.1:50052", "127.0.0.1:50053")
MiB = 1024 * 1024
DUMPED = sorted(a for a in ARCHS if (GRAPHS / f"{a}-a-rpc.json.gz").exists())
NODE_CASES = [(a, d, line) for a in DUMPED for d in ("a", "b") for line in INDEX["lines"]]


def _args(line: str) -> list[str]:
    words = shlex.split(line)
    n = 2 if "2rpc" in words else 1
    return ["--rpc", ",".join(EPS[:n]), "-fit", "off", *[w for w in words if w != "2rpc"]]


def _placed(inv: Inventory, line: str) -> tuple[Placement, model.Setup]:
    return enginegraph.placed(inv, _args(line))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Inventory]:
    folder = tmp_path_factory.mktemp("graphmodels")
    def write(a: str, d: str) -> Path:
        path = folder / f"{a}-{d}.gguf"
        return write_graph_model(a, d, path)

    return {(a, d): load_inventory(write(a, d)) for a in DUMPED for d in "ab"}


def _difference(inv: Inventory, arch: str, dims: str, line: str) -> enginegraph.Difference | None:
    """The first node where moeconf's graph differs from the dump's: the dumped graph is the last reserve,
    which keeps the norms pinned to their layer's GPU (llama-fit-params' sizing reserve drops them)."""
    theirs = enginegraph.load(GRAPHS / f"{arch}-{dims}-{line}.json.gz", endpoints=EPS)
    return enginegraph.compare(enginegraph.scheduled(*_placed(inv, INDEX["lines"][line]), arch), theirs,
                               ignore=("name",))


# the dump names a split input's copy by its source's name: Qwen3-VL's deepstack views of the input
# embeddings are all "embd (view)", so the dump resolves layer 2's copy to layer 1's view (node 107
# where the source is node 162); Llama 4's experts' output views copied back from the CPU likewise
# ("ffn_moe_down-1 (view)"); MiniMax-M3's per-layer views of its sparse attention's inputs are all
# "leaf_34 (view)" from the second sparse layer on, so the dump resolves the third's copy to the second's
# view; DeepSeek-V4's output head, its streams' views (" (reshaped) (view)") copied to the output device;
# GLM-5.3-Flash's unfused hyper-connection post (-ngl 2: the host layers' streams and comb weights, views all
# named alike, copied to the GPU) and, over two GPUs, its per-layer reshapes of the slot mask, the attention
# mask and the new pools' members ("leaf_7 (reshaped)"); the graphs agree otherwise (checked past the first
# clash by resolving each clash; GLM-5.3-Flash's: every other field of every node, the splits and inputs equal);
# Hy4's hyper-connection post, whose per-stream views of the F32 residual ("hc_attn_out-1 (copy) (view)",
# "l_out-1 (copy) (view)") are copied to the next device, 3 copies in each of its 5 cases, every other field of
# every node and split equal; Qwen4Exp's indexer over the F32 mask (flash attention off): each full block's
# reshape of the mask ("attn_inp_kq_mask (reshaped)"), copied to the GPU, resolved to the first full block's
# (set "b", two full blocks; every other field of every node and split equal)
DUMP_NAME_CLASH = {("qwen3vlmoe", "a", "ngl2"), ("llama4", "b", "expscpu"), ("minimax-m3", "b", "rpc"),
                   ("deepseek4", "a", "2rpc"), ("deepseek4", "b", "2rpc"), ("glm5-next", "a", "ngl2"),
                   ("glm5-next", "b", "ngl2"), *(("hy_v4", d, x) for d in "ab" for x in ("ngl2", "2rpc")),
                   ("qwen4exp", "b", "nofa")}
REAL_DUMP_NAME_CLASH = {("minimax-m3", "2rpc32k"), ("glm5-next", "2rpc32k"), ("hy_v4", "2rpc32k")}


@pytest.mark.parametrize(("arch", "dims", "line"), NODE_CASES, ids=[f"{a}-{d}-{x}" for a, d, x in NODE_CASES])
def test_graph_equals_the_engines_node_for_node(tiny: dict[tuple[str, str], Inventory], arch: str, dims: str,
                                               line: str) -> None:
    diff = _difference(tiny[(arch, dims)], arch, dims, line)
    if (arch, dims, line) in DUMP_NAME_CLASH:
        assert diff is not None and diff.fields == ("src",), str(diff)
        assert "(view)" in str(diff.theirs) or "(reshaped)" in str(diff.theirs), str(diff)
        return
    assert diff is None, str(diff)


# the real configs' graphs (one dump per line of index.json's real_lines, of LAYOUTS[index.json's real])
REAL_CASES = [(a, line) for a in DUMPED for line in INDEX["real_lines"]
              if (GRAPHS / f"{a}-real-{line}.json.gz").exists()]


@pytest.fixture(scope="module")
def real_layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("graphreal-layouts")
    out = {}
    for a in sorted({a for a, _ in REAL_CASES}):
        path = folder / f"{a}.gguf"
        write_layout(LAYOUTS[INDEX["real"][a]], path)
        out[a] = load_inventory(path)
    return out


@pytest.mark.parametrize(("arch", "line"), REAL_CASES, ids=[f"{a}-real-{x}" for a, x in REAL_CASES])
def test_real_config_graph_equals_the_engines(real_layouts: dict[str, Inventory], arch: str, line: str) -> None:
    """The same on each architecture's real layout (its full size: every layer, the real head and expert
    counts), at 32k with the experts on the CPU and over two devices."""
    inv = real_layouts[arch]
    theirs = enginegraph.load(GRAPHS / f"{arch}-real-{line}.json.gz", endpoints=EPS)
    diff = enginegraph.compare(enginegraph.scheduled(*_placed(inv, INDEX["real_lines"][line]), arch), theirs,
                               ignore=("name",))
    if (arch, line) in REAL_DUMP_NAME_CLASH:
        assert diff is not None and diff.fields == ("src",), str(diff)
        assert "(view)" in str(diff.theirs) or "(reshaped)" in str(diff.theirs), str(diff)
        return
    assert diff is None, str(diff)


def test_a_wrong_source_order_is_named(tiny: dict[tuple[str, str], Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """SET_ROWS with its sources in the natural order (ggml keeps a legacy one): the comparison
    names the first KV store, node 16 of Qwen3-MoE's graph."""
    def set_rows(self: ggml.Ctx, a: ggml.Tensor, b: ggml.Tensor, c: ggml.Tensor) -> ggml.Tensor:
        return self._make("SET_ROWS", a.type, a.ne, [a, b, c], a, 0, a.nb)

    monkeypatch.setattr(ggml.Ctx, "set_rows", set_rows)
    diff = _difference(tiny[("qwen3moe", "a")], "qwen3moe", "a", "rpc")
    assert diff is not None and diff.index == 16 and "src" in diff.fields


def test_groks_flash_attention_left_on_is_named(tiny: dict[tuple[str, str], Inventory],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp turns flash attention off for Grok (llama_init_from_model): modelled with it on, the first
    difference is node 14, where the engine reshapes V for its transposed cache."""
    from moeconf.memory.graph import archs

    grok = dataclasses.replace(archs.COMPOSITIONS["grok"], traits=archs.Traits())
    monkeypatch.setitem(archs.COMPOSITIONS, "grok", grok)
    diff = _difference(tiny[("grok", "a")], "grok", "a", "rpc")
    assert diff is not None and diff.index == 14 and diff.fields == ("op",), str(diff)


def test_flash_attention_auto_resolved_as_the_engine_does(tiny: dict[tuple[str, str], Inventory],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """-fa auto: Jamba's attention layer on the CPU at -ngl 2 has its one-token FLASH_ATTN_EXT scheduled on the
    GPU, so the engine turns flash attention off (its V cache keeps the flash layout). Kept on, the first
    difference is node 150, where the engine views the V cache for the KQ product."""
    monkeypatch.setattr(model, "fa_auto_off", lambda *a: False)
    diff = _difference(tiny[("jamba", "b")], "jamba", "b", "ngl2")
    assert diff is not None and diff.index == 150, str(diff)


def test_qwen35s_graph_built_as_qwen3nexts_is_named(tiny: dict[tuple[str, str], Inventory],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen3.5's delta-net built as Qwen3-Next's (Q and K repeated to the value heads before the fused op, which
    qwen35moe.cpp leaves to the op): the comparison names the first repeat's reshape, node 32."""
    from moeconf.memory.graph import archs
    from moeconf.memory.graph.archs._deltanet import delta_net_hybrid

    monkeypatch.setitem(archs.ARCHS, "qwen35moe", delta_net_hybrid(qwen35=False))
    diff = _difference(tiny[("qwen35moe", "a")], "qwen35moe", "a", "rpc")
    assert diff is not None and diff.index == 32, str(diff)


# --- compute against llama-fit-params ---------------------------------------------------------
REAL = json.loads((DATA / "graph_real_oracle.json").read_text())["rows"]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("graphreal")
    def write(k: str) -> Path:
        return (write_extra_real if k in EXTRA else write_real)(k, folder / f"{k}.gguf")

    return {k: load_inventory(write(k)) for k in sorted({r["model"] for r in REAL})}


def _device(name: str) -> str:
    return "CPU" if name == "host" else f"RPC0[{EPS[int(name[3:])]}]"


def _misses(inv: Inventory, line: str, figures: dict[str, list[float]]) -> list[str]:
    args = _args(line)
    eng = engine("llama.cpp")
    est = estimate_explained(explain(inv, eng, args, gpus=[]), read_settings(args, eng))
    assert est.complete, est.notes
    bad = []
    for name, (w, kv, comp) in figures.items():
        m = est.devices.get(_device(name)) or DeviceMemory(_device(name))  # a device the engine lists empty
        if not (-1 <= m.weights / MiB - w < 2 and -1 <= m.kv / MiB - kv < 2):
            bad.append(f"{name} weights/KV {m.weights / MiB:.0f}/{m.kv / MiB:.0f} vs {w}/{kv}")
        if abs(m.compute / MiB - comp) > 0.05:
            bad.append(f"{name} compute {m.compute / MiB:.2f} vs {comp}")
    return bad


@pytest.mark.parametrize("row", REAL, ids=[f"{r['model']}:{r['args']}" for r in REAL])
def test_new_architectures_match_the_engines_projection(real: dict[str, Inventory], row: dict[str, object]) -> None:
    key = str(row["model"])
    assert _misses(real[key], str(row["args"]), row["engine"]) == []  # type: ignore[arg-type]


def test_the_norm_pins_kept_are_caught(real: dict[str, Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-fit-params sizes the compute buffers with a reserve that resets the scheduler and so drops the
    norms' pins (ggml_backend_sched_reserve_size): modelled with the pins kept, Mixtral over two GPUs with
    pipeline parallelism is 32 MiB under on the second (its layer's first norm then runs there, and only the
    previous layer's output is copied over, in four copies instead of eight)."""
    line = "2rpc -c 32768 -ngl 999 -ts 1,1"
    row = next(r for r in REAL if r["model"] == "mixtral-8x7b" and r["args"] == line)
    setup_for = model.setup_for
    monkeypatch.setattr(model, "setup_for", lambda *a, **k: dataclasses.replace(setup_for(*a, **k), norm_pins=True))
    bad = _misses(real["mixtral-8x7b"], line, row["engine"])
    assert any(b.startswith("rpc1 compute") for b in bad), bad


# the figures the hand replays were built against (replay_oracle, classic_oracle, cpu_layers_oracle, flagship),
# through the graph, for every recorded model whose architecture the graph composes
RECORDED_MODELS = tuple(sorted(k for k, lay in LAYOUTS.items() if lay.arch in ARCHS))
RECORDED = [(f, r["model"], r["args"], r["engine"]) for f in ("replay_oracle", "classic_oracle", "cpu_layers_oracle")
            for r in json.loads((DATA / f"{f}.json").read_text()) if r["model"] in RECORDED_MODELS]
RECORDED += [("flagship", r["model"], r["args"], r["devices"])
             for r in json.loads((DATA / "flagship_memory_oracle.json").read_text())["lines"]
             if r["model"] in RECORDED_MODELS]

@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("recorded")
    out = {}
    for key in RECORDED_MODELS:
        write_layout(LAYOUTS[key], folder / f"{key}.gguf")
        out[key] = load_inventory(folder / f"{key}.gguf")
    return out


# The gated delta-net hybrids (qwen3next, qwen35moe) take their memory from the graph (their older replay is gone):
# every recorded figure of theirs agrees, several sequences (-np: the reserve splits the ubatch into them and reads
# every sequence's state rows) and the rows llama-server keeps included
RECORDED_CASES = [pytest.param(*r, id=f"{r[0]}:{r[1]}:{r[2]}") for r in RECORDED]


@pytest.mark.parametrize(("src", "key", "line", "figures"), RECORDED_CASES)
def test_recorded_figures_through_the_graph(layouts: dict[str, Inventory], src: str, key: str, line: str,
                                           figures: dict[str, list[float]]) -> None:
    placement, setup = _placed(layouts[key], line)
    got = model.compute(placement, setup)
    for name, (_, _, comp) in figures.items():
        assert abs(got.get(_device(name.lower()), 0) / MiB - comp) <= 0.05, (name, got)


def test_inplace_reuse_left_out_is_caught(layouts: dict[str, Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """ggml-alloc's in-place reuse of a single-consumer source (ADD, MUL, RMS_NORM, ...) off: the
    replay of Qwen3-30B-A3B at -c 32768 -ngl 999 -ctk q4_0 -ctv q4_0 is no longer 300.75 MiB."""
    monkeypatch.setattr(sched, "CAN_INPLACE", frozenset())
    placement, setup = _placed(layouts["qwen3-30b-a3b"], "-c 32768 -ngl 999 -ctk q4_0 -ctv q4_0")
    got = model.compute(placement, setup)
    assert abs(got[_device("rpc0")] / MiB - 300.75) > 1


# llama-server's output reservation (tests/data/server_outputs_oracle.json, tests/engine/outputs.cpp): the rows the
# server keeps, -np streams, several GPUs, through the graph
OUTPUTS = json.loads((DATA / "server_outputs_oracle.json").read_text())
OUTPUT_LINES = sorted({(r["model"], r["args"]) for r in OUTPUTS["rows"]
                       if r["model"] in LAYOUTS and LAYOUTS[r["model"]].arch in ARCHS})


OUTPUT_CASES = [pytest.param(k, x, id=f"{k}:{x}") for k, x in OUTPUT_LINES]


@pytest.mark.parametrize(("key", "line"), OUTPUT_CASES)
def test_server_outputs_through_the_graph(layouts: dict[str, Inventory], key: str, line: str) -> None:
    from tests.recorded_memory import device_name, rpc_args

    eps = OUTPUTS["endpoints"]
    argv = rpc_args(line, eps)
    eng = engine("llama.cpp")
    ex = explain(layouts[key], eng, argv, gpus=[])
    st = read_settings(argv, eng, binary="llama-server")
    iv = ex.invocation
    pipe = pipeline_parallel(ex.placement, len(ex.accelerators), iv.n_gpu_layers(),
                             iv.split_mode.text if iv.split_mode else None, st, bool(ex.items))
    got = model.compute(ex.placement, model.setup_for(layouts[key], st, pipeline=pipe))
    for r in OUTPUTS["rows"]:
        if (r["model"], r["args"]) != (key, line):
            continue
        assert abs(got.get(device_name(r["device"], eps), 0) - r["compute"]) <= 0.05 * MiB, (r["device"], got)


def test_hy4_attention_sinks_left_out_are_named(tiny: dict[tuple[str, str], Inventory],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Hy4's gated MLA attends with per-head sinks (build_attn's sinks through the K-only cache): built
    without them, the first difference is the first attention node, which lacks the sinks source."""
    from moeconf.memory.graph.blocks import GraphContext

    attn_k = GraphContext.attn_k

    def without_sinks(self: GraphContext, *args: Any, sinks: ggml.Tensor | None = None, **kw: Any) -> ggml.Tensor:
        return attn_k(self, *args, **kw)

    monkeypatch.setattr(GraphContext, "attn_k", without_sinks)
    diff = _difference(tiny[("hy_v4", "a")], "hy_v4", "a", "rpc")
    assert diff is not None and diff.fields == ("src",) and diff.ours is not None
    assert diff.ours["op"] == "FLASH_ATTN_EXT", str(diff)


def test_a_cast_its_own_source_is_freed_after_its_last_reader() -> None:
    # ggml_cast makes the result its own second source; ggml-alloc counts and frees a node's sources other than
    # the node itself, so a cast is freed after its last reader like any tensor. Counting the self-source too
    # (a consumer that never comes) kept every cast: HY4's compute at 16,984 MiB where the engine has 468.
    # Ten casts of a 1 MiB input, each read once: the buffer holds two or three at a time, not ten
    ctx = ggml.Ctx()
    cur = ctx.input("F32", 262144, name="inp")
    g = ggml.CGraph()
    for _ in range(10):
        cur = ctx.scale(ctx.cast(cur, "F32"))
    g.expand(cur)
    cpu = sched.backend_for("CPU")
    size = sched.allocate([(n, 0) for n in g.nodes], [(leaf, 0) for leaf in g.leafs], [cpu])[0]
    assert size <= 3 * 2**20
