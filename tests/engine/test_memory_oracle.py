"""moeconf's memory per device against llama.cpp's own projection (`llama-fit-params -fitp on`),
on sparse full-size GGUFs of real layouts, with RPC servers on 127.0.0.1 as GPUs.

Tolerances (issue 10): weights and KV within 1 MiB (the engine prints whole MiB), compute within
3% or 16 MiB. Results go to $MOECONF_MEMORY_RESULTS (JSON) for `python -m tests.engine.memory_table`."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS, MLA
from moeconf.memory import estimate, read_settings
from moeconf.model.inventory import Inventory
from moeconf.sizing import estimate_explained
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
RESULTS: list[dict[str, object]] = []

LAYOUT_KEYS = {
    "qwen3moe": LAYOUTS["qwen3-30b-a3b"],
    "deepseek2": LAYOUTS["deepseek-v3"],
    # an older DeepSeek conversion: attn_kv_b, no key_length_mla (full multi-head KV)
    "deepseek2-kv_b": dataclasses.replace(LAYOUTS["deepseek-v3"], key="deepseek-v3-kvb", heads_kv=128,
                                          mla=MLA(kv_b=True)),
    "glm4moe": LAYOUTS["glm-4.5-air"],
    "gpt-oss": LAYOUTS["gpt-oss-20b"],
    "llama4": LAYOUTS["llama-4-maverick"],
}

# (model, command line); "2rpc" means two RPC devices. -fit off and --rpc are added.
CASES: list[tuple[str, str]] = [
    ("qwen3moe", "-c 4096 -ngl 999"),
    ("qwen3moe", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0"),
    ("qwen3moe", "-c 16384 -ngl 999 -ctk q4_0 -ctv q4_0 -ub 1024"),
    ("qwen3moe", "-c 8192 -ngl 999 -ctk bf16 -ctv bf16 -ub 256"),
    ("qwen3moe", "-c 8192 -ngl 999 -ctk q5_1 -ctv q5_0"),
    ("qwen3moe", "-c 8192 -ngl 999 -ctk iq4_nl -ctv q4_1"),
    ("qwen3moe", "-c 4096 -ngl 999 -ctk f32 -ctv f32"),
    ("qwen3moe", "-c 8192 -ngl 999 -fa off"),
    ("qwen3moe", "-c 8192 -ngl 999 -nkvo"),
    ("qwen3moe", "-c 8192 -ngl 20"),
    ("qwen3moe", "-c 8192 -ngl 20 -fa off -ub 1024"),
    ("qwen3moe", "-c 8192 -ngl 999 -np 4"),
    ("qwen3moe", "-c 8192 -ngl 999 -ot exps=CPU"),
    ("qwen3moe", r"-c 8192 -ngl 999 -ot blk\.[1-3][0-9]\.ffn_.*_exps=CPU,^output\.weight=CPU"),
    ("qwen3moe", "2rpc -c 8192 -ngl 30 -ts 1,1"),
    ("qwen3moe", "2rpc -c 8192 -ngl 999 -ts 3,1"),
    ("qwen3moe", "2rpc -c 8192 -ngl 40 -ts 1,1 -ot exps=CPU"),
    ("deepseek2", "-c 8192 -ngl 999"),
    ("deepseek2", "-c 16384 -ngl 999 -ctk q8_0 -ctv q8_0"),
    ("deepseek2", "-c 4096 -ngl 999 -ot exps=CPU"),
    ("deepseek2", "-c 4096 -ngl 30 -fa off"),
    ("deepseek2", "-c 8192 -ngl 999 -nkvo -ub 1024"),
    ("deepseek2", r"2rpc -c 8192 -ngl 40 -ts 1,1 -ot blk\.[3-9]\.ffn_.*_exps=CPU"),
    ("deepseek2-kv_b", "-c 4096 -ngl 999"),
    ("deepseek2-kv_b", "-c 4096 -ngl 999 -ctk q8_0 -ctv q8_0 -ot exps=CPU"),
    ("glm4moe", "-c 8192 -ngl 999"),
    ("glm4moe", "-c 32768 -ngl 999 -ctk q4_0 -ctv q4_0"),
    ("glm4moe", "-c 8192 -ngl 999 -ot exps=CPU,^output\\.weight=CPU"),
    ("glm4moe", "-c 8192 -ngl 999 -ot exps=CPU"),
    ("glm4moe", "-c 8192 -ngl 20"),
    ("glm4moe", "-c 8192 -ngl 999 -fa off -ot ^output\\.weight=CPU"),
    ("glm4moe", "2rpc -c 8192 -ngl 30 -ts 1,1"),
    ("glm4moe", "2rpc -c 8192 -ngl 999 -ts 1,1"),
    ("gpt-oss", "-c 4096 -ngl 999"),
    ("gpt-oss", "-c 4096 -ngl 999 --swa-full"),
    ("gpt-oss", "-c 16384 -ngl 999 -ub 1024"),
    ("gpt-oss", "-c 8192 -ngl 999 -np 2"),
    ("gpt-oss", "-c 8192 -ngl 999 -fa off -ot ^output\\.weight=CPU"),
    ("gpt-oss", "-c 8192 -ngl 12 -ctk q8_0 -ctv q8_0"),
    ("gpt-oss", "2rpc -c 8192 -ngl 20 -ts 1,1 -ot exps=CPU"),
    ("llama4", "-c 32768 -ngl 999"),
    ("llama4", "-c 8192 -ngl 999 -ctk q8_0 -ctv q8_0"),
    ("llama4", "-c 4096 -ngl 999 -ot exps=CPU,^output\\.weight=CPU"),
    ("llama4", "-c 8192 -ngl 24"),
    ("llama4", "-c 16384 -ngl 999 --swa-full"),
    ("llama4", "2rpc -c 8192 -ngl 30 -ts 2,1"),
    # routed experts on the CPU, the rest on GPUs: where the allocator puts the returned copies
    ("glm4moe", "-c 8192 -ngl 999 -ot exps=CPU -ub 1024"),
    ("glm4moe", "2rpc -c 8192 -ngl 999 -ts 1,1 -ot exps=CPU"),
    ("glm4moe", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0 -ot exps=CPU"),
    ("deepseek2", "-c 16384 -ngl 999 -ctk q8_0 -ctv q8_0 -ot exps=CPU"),
    ("qwen3moe", "2rpc -c 16384 -ngl 40 -ts 1,1 -ot exps=CPU -ub 1024"),
    ("llama4", "-c 8192 -ngl 30 -ot exps=CPU"),
    # Llama 4's output device by the engine's graph (moeconf/memory/graph)
    ("llama4", "-c 8192 -ngl 999 -ub 1024"),
    ("llama4", "-c 16384 -ngl 10 -ub 2048"),
    ("llama4", "2rpc -c 8192 -ngl 30 -ts 1,1"),
    # the host's buffer by a replay of its share of the graph (routed experts on the CPU at large
    # ubatches: 28 and 22.6 MiB under with the phase model)
    ("deepseek2", "-c 4096 -ngl 999 -ot exps=CPU -ub 1024"),
    ("gpt-oss", "-c 8192 -ngl 999 -ot exps=CPU -ub 2048"),
    # some layers' routed experts on the CPU, as `fit` writes them (GPU and host replayed)
    ("qwen3moe", r"-c 16384 -ngl 999 -ot blk\.([0-9]|1[0-9])\.ffn_.*_exps=CPU"),
    ("glm4moe", r"-c 16384 -ngl 999 -ot blk\.([1-9]|1[0-9])\.ffn_.*_exps=CPU"),
    # setting families (tests/test_memory_settings.py holds the same figures)
    # flash attention off with routed experts on the CPU: the host replayed with f32 masks (700 and
    # 272 MiB before, against 508 and 204)
    ("deepseek2", "-c 65536 -ngl 999 -fa off -ub 1024 -ot exps=CPU"),
    ("qwen3moe", "-c 32768 -ngl 999 -fa off -ub 1024 -ot exps=CPU"),
    # parallel sequences in separate streams: each gets its own window on sliding-window layers
    ("gpt-oss", "-c 8192 -ngl 999 -np 4"),
    ("llama4", "-c 32768 -ngl 999 -np 2 -ot exps=CPU"),
]

# setting families moeconf refuses (moeconf/memory/families.py): the estimate is
# incomplete, and without the refusal its compute would be off (so the refusal stays needed)
REFUSED_FAMILIES: list[tuple[str, str]] = [
    ("qwen3moe", "-c 32768 -ngl 999 -ot exps=CPU -nkvo"),
    ("gpt-oss", "-c 8192 -ngl 999 -ot exps=CPU -nkvo"),
    # (on qwen3moe replay.moe_graph gives every GPU's buffer: modelled, CASES below)
    ("gpt-oss", "2rpc -c 8192 -ngl 999 -ts 1,1 -b 4096 -ub 4096 -ot exps=CPU,^output\\.weight=CPU"),
    ("glm4moe", "-c 8192 -ngl 30 -b 4096 -ub 4096 -ot ^output\\.weight=CPU"),
]

# the classic MoEs beyond the first five (moeconf/fixtures/layouts_classic.py) ---
# Hunyuan-A13B is refused (moeconf.memory.support.unmodelled_architecture); the ERNIE line over two GPUs carries
# an -ot item (pipeline parallelism, not modelled for it, is refused)
LAYOUT_KEYS.update({
    "ernie4_5-moe": LAYOUTS["ernie-4.5-21b-a3b"],
    "bailingmoe2": LAYOUTS["ling-mini-2.0"],
    "dots1": LAYOUTS["dots.llm1"],
    "qwen3vlmoe": LAYOUTS["qwen3-vl-30b-a3b"],
})
CASES += [
    (arch, line)
    for arch in ("ernie4_5-moe", "bailingmoe2", "dots1", "qwen3vlmoe")
    for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0", "-c 131072 -ngl 999 -ub 2048",
                 "-c 32768 -ngl 999 -ot exps=CPU", "2rpc -c 32768 -ngl 999 -ts 1,1 -ot exps=CPU",
                 "-c 32768 -ngl 12", "-c 32768 -ngl 999 --n-cpu-moe 10")
] + [
    ("bailingmoe2", "2rpc -c 32768 -ngl 999 -ts 1,1"),
    ("dots1", "2rpc -c 32768 -ngl 999 -ts 1,1"),
    ("qwen3vlmoe", "2rpc -c 32768 -ngl 999 -ts 1,1"),
    ("ernie4_5-moe", "-c 4096 -ngl 999 -ot token_embd=CPU"),  # the tied output's copy in CPU_REPACK
]
# hybrid recurrent MoEs (moeconf/memory/recurrent.py, graph/archs/qwen35moe.py, qwen3next.py); the
# default suite holds the model to the same lines' recorded figures (tests/test_memory_hybrid.py)
LAYOUT_KEYS.update({"qwen35moe": LAYOUTS["qwen3.5-397b-a17b"], "qwen35moe-35b": LAYOUTS["qwen3.5-35b-a3b"],
                    "qwen3next": LAYOUTS["qwen3-next-80b-a3b"]})
CASES += [
    (m, line) for m in ("qwen35moe", "qwen3next") for line in (
        "-c 32768 -ngl 999", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0", "-c 131072 -ngl 999 -ub 2048",
        "-c 32768 -ngl 999 -ot exps=CPU", "2rpc -c 32768 -ngl 999 -ts 1,1", "-c 32768 -ngl 999 -np 4",
        "-c 32768 -ngl 20", "2rpc -c 32768 -ngl 30 -ts 1,1", "-c 65536 -ngl 999 -ot exps=CPU -ctk q8_0 -ctv q8_0 -np 2",
    )
] + [
    ("qwen35moe-35b", "-c 32768 -ngl 999 -ot exps=CPU -ub 2048"),
    ("qwen35moe-35b", "2rpc -c 32768 -ngl 999 -ts 3,1 -ot exps=CPU -ub 1024"),
    ("qwen35moe-35b", "-c 16384 -ngl 999 -fa off"),
]
# Kimi-Linear (moeconf/memory/recurrent.py KDA state, the graph's compute); the default suite holds the
# model to these and more lines' recorded figures (tests/test_memory_kda.py)
LAYOUT_KEYS.update({"kimi-linear": LAYOUTS["kimi-linear-48b-a3b"]})
CASES += [
    ("kimi-linear", line) for line in (
        "-c 32768 -ngl 999", "-c 32768 -ngl 999 -ctk bf16 -ctv bf16", "-c 131072 -ngl 999 -ub 2048",
        "-c 32768 -ngl 999 -ot exps=CPU", "-c 32768 -ngl 999 --n-cpu-moe 12", "-c 32768 -ngl 14",
        "-c 32768 -ngl 999 -np 4", "2rpc -c 32768 -ngl 999 -ts 1,1", "2rpc -c 32768 -ngl 999 -ts 1,12 -ot exps=CPU",
        "-c 32768 -ngl 24 -ot exps=CPU", "2rpc -c 32768 -ngl 999 -ts 1,1 -ot blk\\.2[0-6]\\.ffn_.*_exps=RPC0[{EP0}]",
        "2rpc -c 32768 -ngl 999 -ts 10,18 -ot '\\.10\\..*gate_exps=RPC0[{EP0}],\\.(2\\d|1[5-9])\\..*exps=CPU'",
    )
]

# --- GLM-5.3-Flash (KDA state, MLA latent + k-pool indexer cache, compute through the engine's graph,
# memory/graph/archs/glm5_next.py); the default suite holds the model to these and more lines' recorded
# figures (tests/test_memory_glm5next.py, tests/data/glm5next_memory_oracle.json)
LAYOUT_KEYS.update({"glm5-next": LAYOUTS["glm-5.3-flash"]})
CASES += [
    ("glm5-next", line) for line in (
        "-c 32768 -ngl 999", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0", "-c 131072 -ngl 999 -ub 2048",
        "-c 32768 -ngl 999 -np 4", "-c 32768 -ngl 999 -ot exps=CPU", "-c 32768 -ngl 999 --n-cpu-moe 10",
        "-c 32768 -ngl 0", "-c 32768 -ngl 40", "2rpc -c 32768 -ngl 999 -ts 1,1 -ot exps=CPU",
        "2rpc -c 32768 -ngl 999 -ts 1,1", "2rpc -c 32768 -ngl 30 -ts 1,1", "-c 32768 -ngl 999 -fa off",
        "-c 32768 -ngl 1", "-c 32768 -ngl 999 -nkvo",
    )
]
# ---

# Hunyuan-A13B (its layer allocates as the common MoE layer's, moeconf/memory/graph/archs/common.py) and the
# Hadamard rotations of a quantized cache (replay.MoeShape, Llama4Shape: 72, 289, 83 and 37 MiB off
# on these lines without them); tests/test_memory_classic.py and test_memory_replay.py hold the figures
LAYOUT_KEYS.update({"hunyuan-moe": LAYOUTS["hunyuan-a13b"]})
CASES += [
    ("hunyuan-moe", "-c 32768 -ngl 999 -ctk q8_0 -ctv q8_0"),
    ("hunyuan-moe", "-c 65536 -ngl 999 -ub 2048 -ctk q8_0 -ctv q8_0"),
    ("hunyuan-moe", "-c 32768 -ngl 999 -ot exps=CPU"),
    ("hunyuan-moe", "-c 32768 -ngl 20 -ctk q8_0 -ctv q8_0"),
    ("hunyuan-moe", "2rpc -c 32768 -ngl 999 -ts 1,1 -ot exps=CPU -ctk q4_0 -ctv q4_0"),
    ("llama4", "-c 65536 -ngl 999 -ub 2048 -ctk q8_0 -ctv q8_0"),
    ("ernie4_5-moe", "-c 32768 -ngl 999 -ctk q8_0"),
    # the host running the first layers, replayed as its own graph (replay.MoeShape.host_head)
    ("glm4moe", "-c 32768 -ngl 16 -ub 1024"),
    ("ernie4_5-moe", "-c 16384 -ngl 12 -ub 2048 -ot exps=CPU"),
]

# the output matrix on the CPU, the GPU running every layer: replayed (replay.MoeShape.output_cpu; the
# phase model was 7.5 MiB under per 512 tokens of -ub, 868 against 928 MiB at -ub 4096);
# tests/test_memory_replay.py holds the figures (tests/data/replay_oracle.json)
CASES += [("qwen3moe", line) for line in (
    "-c 32768 -b 4096 -ub 4096 -ot ^output\\.weight=CPU", "-c 32768 -b 2048 -ub 2048 -ot ^output\\.weight=CPU",
    "-c 32768 -ub 1024 -ot ^output\\.weight=CPU", "-c 32768 -ot ^output\\.weight=CPU",
    "-c 8192 -b 4096 -ub 4096 -ot ^output\\.weight=CPU", "-c 32768 -ot exps=CPU,^output\\.weight=CPU -ub 2048",
    "2rpc -c 32768 -ts 1,1 -ot ^output\\.weight=CPU -ub 2048",
    # and with every layer's routed experts on the CPU over two GPUs (refused before: memory/families.py)
    "2rpc -c 32768 -ts 1,1 -ot exps=CPU,^output\\.weight=CPU",
    "2rpc -c 32768 -ts 1,1 -ot exps=CPU,^output\\.weight=CPU -ub 2048",
    "2rpc -c 32768 -b 4096 -ub 4096 -ts 1,1 -ot exps=CPU,^output\\.weight=CPU",
)] + [("glm4moe", line) for line in (
    "2rpc -c 32768 -ts 1,1 -ot exps=CPU,^output\\.weight=CPU",
    "2rpc -c 32768 -ts 1,1 -ot exps=CPU,^output\\.weight=CPU -ub 2048",
)]

# Compute cases moeconf does not yet model within tolerance (listed, so a gap stays visible and a
# fix shows up as an unexpected pass). None: Llama 4 (the output device) and GLM-4.5 on one GPU
# (with or without routed experts on the CPU) are given node by node by the engine's graph (moeconf/memory/graph),
# which closed the last four (the logits 20.75 MiB higher, or the experts' sum in a freed mask's
# hole 72 MiB lower, than the phase model put them).
COMPUTE_GAPS: set[tuple[str, str]] = set()


@pytest.fixture(scope="session")
def sparse_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not oracle.available():
        pytest.fail(f"llama-fit-params is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    return oracle.write_sparse(tmp_path_factory.mktemp("sparse"), LAYOUT_KEYS)


@pytest.fixture(scope="session")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


@pytest.fixture(scope="session", autouse=True)
def results_file() -> Iterator[None]:
    yield
    oracle.save_results("MOECONF_MEMORY_RESULTS", RESULTS)


def _run(model: str, line: str, sparse_models: dict[str, tuple[Path, Inventory]],
         endpoints: list[str]) -> list[dict[str, object]]:
    # {EP0}/{EP1}: the first/second RPC device's endpoint (an -ot naming a device)
    words = shlex.split(line.replace("{EP0}", endpoints[0]).replace("{EP1}", endpoints[1]))
    n = 2 if "2rpc" in words else 1
    words = [w for w in words if w != "2rpc"]
    eps = endpoints[:n]
    args = ["--rpc", ",".join(eps), "-fit", "off", *words]
    path, inv = sparse_models[model]
    proj = oracle.project(path, args, eps)
    eng = engine("llama.cpp")
    ex = explain(inv, eng, args, gpus=[])
    assert not ex.refusals, ex.refusals
    est = estimate_explained(ex, read_settings(args, eng))
    rows = []
    for dev in sorted(set(proj.model) | {d for d, m in est.devices.items() if m.weights or m.kv or m.compute}):
        m = est.devices.get(dev)
        ours = (m.weights, m.kv, m.compute) if m else (0, 0, 0)
        theirs_c = proj.compute_exact.get(dev, float(proj.compute.get(dev, 0)))
        rows.append({
            "model": model, "args": line, "device": "host" if dev == "CPU" else f"RPC{eps.index(dev[5:-1])}",
            "weights": [ours[0] / MiB, proj.model.get(dev, 0)], "kv": [ours[1] / MiB, proj.context.get(dev, 0)],
            "compute": [ours[2] / MiB, theirs_c],
        })
    return rows


def _within(row: dict[str, object], term: str) -> bool:
    ours, theirs = row[term]  # type: ignore[misc]
    if term == "compute":
        return abs(ours - theirs) <= max(16.0, 0.03 * theirs)
    # the engine floors each buffer to whole MiB; host weights are two buffers (CPU, CPU_REPACK)
    floors = 2 if row["device"] == "host" and term == "weights" else 1
    return 0 <= ours - theirs < floors or abs(ours - theirs) <= 1.0


@pytest.mark.parametrize(("model", "line"), CASES, ids=[f"{m}:{c}" for m, c in CASES])
def test_memory_matches_llama_cpp(model: str, line: str, sparse_models: dict[str, tuple[Path, Inventory]],
                                  endpoints: list[str], request: pytest.FixtureRequest) -> None:
    rows = _run(model, line, sparse_models, endpoints)
    RESULTS.extend(rows)
    bad_exact = [(r["device"], t, r[t]) for r in rows for t in ("weights", "kv") if not _within(r, t)]
    assert not bad_exact, f"weights/KV off by more than 1 MiB: {bad_exact}"
    bad_compute = [(r["device"], r["compute"]) for r in rows if not _within(r, "compute")]
    if (model, line) in COMPUTE_GAPS:
        request.applymarker(pytest.mark.xfail(strict=True, reason="compute gap listed in COMPUTE_GAPS"))
    assert not bad_compute, f"compute outside 3% / 16 MiB: {bad_compute}"


def test_a_wrong_estimate_is_caught(sparse_models: dict[str, tuple[Path, Inventory]], endpoints: list[str]) -> None:
    """The comparison refuses an answer 2 MiB off in weights and 20 MiB off in compute."""
    rows = _run("qwen3moe", "-c 4096 -ngl 999", sparse_models, endpoints)
    row = dict(rows[-1])
    assert _within(row, "weights") and _within(row, "compute")
    w = row["weights"]
    row["weights"] = [w[0] + 2, w[1]]  # type: ignore[index]
    c = row["compute"]
    assert not _within(row, "weights")
    row["compute"] = [c[0] + 20, c[1]]  # type: ignore[index]
    assert not _within(row, "compute")


@pytest.mark.parametrize(("model", "line"), REFUSED_FAMILIES, ids=[f"{m}:{c}" for m, c in REFUSED_FAMILIES])
def test_refused_setting_families_would_be_off(model: str, line: str,
                                               sparse_models: dict[str, tuple[Path, Inventory]],
                                               endpoints: list[str]) -> None:
    """moeconf refuses these lines, and the engine shows why: the compute moeconf would
    print without the refusal is outside the tolerance on some device."""
    words = shlex.split(line)
    n = 2 if "2rpc" in words else 1
    words = [w for w in words if w != "2rpc"]
    eps = endpoints[:n]
    args = ["--rpc", ",".join(eps), "-fit", "off", *words]
    path, inv = sparse_models[model]
    proj = oracle.project(path, args, eps)
    eng = engine("llama.cpp")
    ex = explain(inv, eng, args, gpus=[])
    settings = read_settings(args, eng)
    assert not estimate(ex.placement, settings).complete
    unchecked = estimate(ex.placement, settings, families=False)
    off = [d for d, m in unchecked.devices.items()
           if abs(m.compute / MiB - proj.compute_exact.get(d, 0.0)) > max(16.0, 0.03 * proj.compute_exact.get(d, 0.0))]
    from moeconf.memory.graph.model import graph_computed

    if graph_computed(ex.placement):
        # through the engine's graph these lines are within tolerance (qwen3moe and gpt-oss with -nkvo and
        # their experts on the CPU; gpt-oss over two GPUs with the output on the CPU at -ub 4096): the
        # refusal is kept until the family is measured more widely, and this says when it stops agreeing
        assert not off, off
        return
    assert off, "the engine agrees with the unrefused estimate: the family may be modelled now"
