"""`moeconf fit` against llama.cpp: its results, measured by llama.cpp's own projection
(`llama-fit-params -fitp on`), stay within each budget, and keep at least as many routed-expert
bytes on the GPUs as llama.cpp's own fit for the same budget (emulated with -fitt on RPC devices,
which report the machine's RAM as free). Results go to $MOECONF_FIT_RESULTS for docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fit import Budget, fit
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.model.inventory import Inventory
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers
from tests.engine.outputs_probe import server_totals

pytestmark = pytest.mark.engine

GiB = 1024**3
MiB = 1024**2
RESERVE = GiB
RESULTS: list[dict[str, object]] = []

MODELS = {"qwen3moe": "qwen3-30b-a3b", "glm4moe": "glm-4.5-air", "deepseek2": "deepseek-v3", "gpt-oss": "gpt-oss-20b",
          "llama4": "llama-4-maverick"}

# (model, budgets in GiB per RPC device, engine flags)
# Where llama.cpp's fit keeps more expert bytes (a strict xfail: a fix shows up as an unexpected
# pass). There was one: on glm4moe at 20 GiB, -c 16384, its -ngl is off by one (the nextn block
# counts), so block 0's attention and dense FFN (about 210 MiB) stay on the CPU and it used that
# room for one more expert tensor. Since moeconf counts llama-server's 4 output rows (docs/memory.md,
# "llama-server's output reservation") its fit keeps as many. llama.cpp's fit is emulated here with
# llama-fit-params, which plans the whole ubatch's outputs (llama-server's own --fit would plan its 4)
LOSSES: set[tuple[str, tuple[int, ...], str]] = set()

CASES = [
    ("qwen3moe", [12], "-c 32768 -ctk q8_0 -ctv q8_0"),
    ("qwen3moe", [8, 6], "-c 16384"),
    ("glm4moe", [20], "-c 16384"),
    ("glm4moe", [14, 10], "-c 8192 -ctk q8_0 -ctv q8_0"),
    ("deepseek2", [22], "-c 8192"),
    ("gpt-oss", [8], "-c 16384"),
    ("llama4", [20], "-c 8192 -ctk q8_0 -ctv q8_0"),
]

# the classic MoEs (moeconf/fixtures/layouts_classic.py); ERNIE's 8 GiB fit needed
# 7,393 MiB against 7,168 before the tied output was modelled
MODELS.update({"ernie4_5-moe": "ernie-4.5-21b-a3b", "bailingmoe2": "ling-mini-2.0", "dots1": "dots.llm1",
               "qwen3vlmoe": "qwen3-vl-30b-a3b"})
CASES += [
    ("ernie4_5-moe", [8], "-c 32768"),
    ("bailingmoe2", [6], "-c 32768 -ctk q8_0 -ctv q8_0"),
    ("dots1", [40, 24], "-c 16384"),
    ("qwen3vlmoe", [12], "-c 32768"),
]
# Hunyuan-A13B (a quantized cache: the Hadamard rotations in its compute)
MODELS.update({"hunyuan-moe": "hunyuan-a13b"})
CASES += [("hunyuan-moe", [24], "-c 32768 -ctk q8_0 -ctv q8_0")]
# hybrid recurrent MoEs
MODELS.update({"qwen35moe": "qwen3.5-397b-a17b", "qwen3next": "qwen3-next-80b-a3b"})
# llama-fit-params plans one sequence; moeconf sizes the llama-server it prints for its 4 default
# slots, whose recurrent state is 4 times one: -np 1 compares like with like (the qwen3next case
# keeps the default slots and must still fit its budget by the engine's count)
CASES += [("qwen35moe", [24], "-c 32768 -np 1"), ("qwen3next", [16, 8], "-c 65536 -ctk q8_0 -ctv q8_0")]
# Kimi-Linear (KDA state per sequence, MLA latent): the second keeps llama-server's 4 slots
MODELS.update({"kimi-linear": "kimi-linear-48b-a3b"})
CASES += [("kimi-linear", [16], "-c 32768 -np 1"), ("kimi-linear", [12, 8], "-c 32768")]
# --- GLM-5.3-Flash (memory/graph/archs/glm5_next.py): -np 1, as llama-fit-params plans one sequence and takes
# no -kvu (llama-server's 4 unified slots: tests/engine/fit_print_kvu.cpp, docs/memory-architectures.md)
MODELS.update({"glm5-next": "glm-5.3-flash"})
CASES += [("glm5-next", [16], "-c 32768 -np 1"), ("glm5-next", [12, 8], "-c 32768 -np 1"),
          ("glm5-next", [24, 24], "-c 65536 -np 1 -ctk q8_0 -ctv q8_0")]
# ---


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not oracle.available():
        pytest.fail(f"llama-fit-params is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    return oracle.write_sparse(tmp_path_factory.mktemp("fit"), {key: LAYOUTS[MODELS[key]] for key, _, _ in CASES})


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


@pytest.fixture(scope="module", autouse=True)
def results_file() -> Iterator[None]:
    yield
    oracle.save_results("MOECONF_FIT_RESULTS", RESULTS)


ALWAYS_ACTIVE = ("attn", "norm", "shexp", "router", "dense", "output")


def _always_active_on_cpu(inv: Inventory, argv: list[str]) -> int:
    ex = explain(inv, engine("llama.cpp"), argv, gpus=[])
    return sum(t.nbytes for t in inv.tensors if t.group in ALWAYS_ACTIVE and t.layer is not None
               and ex.placement.devices[t.name] == "CPU")


def _host_read_per_token(inv: Inventory, argv: list[str]) -> float:
    """Bytes read from host RAM per generated token: every always-active tensor left on the CPU
    (the input embeddings excepted: one row per token), plus the routed experts on the CPU times
    the share of experts a token uses (n_expert_used / n_expert)."""
    ex = explain(inv, engine("llama.cpp"), argv, gpus=[])
    md = inv.metadata
    assert md.expert_count and md.expert_used_count
    share = md.expert_used_count / md.expert_count
    return sum(t.nbytes * (share if t.group == "experts" else 1.0) for t in inv.tensors
               if t.group != "embd" and ex.placement.devices[t.name] == "CPU")


def _expert_bytes_on_gpus(inv: Inventory, argv: list[str]) -> int:
    ex = explain(inv, engine("llama.cpp"), argv, gpus=[])
    return sum(t.nbytes for t in inv.tensors
               if t.group == "experts" and ex.placement.devices[t.name] not in (None, "CPU"))


@pytest.mark.parametrize(("model", "budgets", "flags"), CASES, ids=[f"{m}:{b}:{f}" for m, b, f in CASES])
def test_fit_stays_within_budget_and_beats_llama_cpp_fit(
        model: str, budgets: list[int], flags: str, models: dict[str, tuple[Path, Inventory]],
        endpoints: list[str], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    path, inv = models[model]
    eps = endpoints[: len(budgets)]
    devs = [f"RPC0[{ep}]" for ep in eps]
    user = ["--rpc", ",".join(eps), *flags.split()]
    res = fit(inv, engine("llama.cpp"), [Budget(d, b * GiB) for d, b in zip(devs, budgets, strict=True)], user,
              model_path=str(path), plan_dir=str(tmp_path), reserve=RESERVE)
    args = list(res.argv[3:])  # drop the binary and -m PATH
    assert res.argv[1] == "-m"
    proj = oracle.project(path, args, eps)
    # the line is llama-server's: measured as the server allocates it (its few output rows,
    # tests/engine/outputs_probe.py); llama-fit-params counts the whole ubatch's
    served = server_totals(path, args)
    for d, b in zip(devs, budgets, strict=True):
        used = served[d] + RESERVE
        assert used <= b * GiB, f"{d}: llama-server allocates {served[d] / MiB:.0f} MiB + reserve, over {b} GiB"
    # llama.cpp's own fit for the same usable memory (budget minus the same reserve)
    free = [proj.free[d] for d in devs]
    targets = [f - (b * 1024 - RESERVE // MiB) for f, b in zip(free, budgets, strict=True)]
    theirs_args = oracle.llama_fit(path, ["--rpc", ",".join(eps), *flags.split()], targets)
    theirs_full = ["--rpc", ",".join(eps), *flags.split(), *theirs_args]
    theirs_proj = oracle.project(path, theirs_full, eps)
    ours_gpu = _expert_bytes_on_gpus(inv, list(res.argv))
    theirs_gpu = _expert_bytes_on_gpus(inv, theirs_full)
    theirs_ot = theirs_args[theirs_args.index("-ot") + 1] if "-ot" in theirs_args else ""
    RESULTS.append({
        "model": model, "budgets_gib": budgets, "flags": flags,
        "moeconf_expert_gib": ours_gpu / GiB, "llama_fit_expert_gib": theirs_gpu / GiB,
        "moeconf_ot_chars": len(res.ot), "llama_fit_ot_chars": len(theirs_ot),
        "moeconf_projected_mib": {d: round(served[d] / MiB) for d in devs},  # as llama-server allocates it
        "llama_fit_projected_mib": {d: round(theirs_proj.total(d)) for d in devs},
        "moeconf_always_active_on_cpu_mib": _always_active_on_cpu(inv, list(res.argv)) / MiB,
        "llama_fit_always_active_on_cpu_mib": _always_active_on_cpu(inv, theirs_full) / MiB,
        "moeconf_host_read_mib_per_token": _host_read_per_token(inv, list(res.argv)) / MiB,
        "llama_fit_host_read_mib_per_token": _host_read_per_token(inv, theirs_full) / MiB,
    })
    assert _always_active_on_cpu(inv, list(res.argv)) == 0
    assert len(res.ot) < len(theirs_ot) or not theirs_ot
    if (model, tuple(budgets), flags) in LOSSES:
        request.applymarker(pytest.mark.xfail(strict=True, reason="llama.cpp's fit trades block 0 for experts"))
    assert ours_gpu >= theirs_gpu, (f"moeconf {ours_gpu / GiB:.2f} GiB of experts on GPUs, "
                                    f"llama.cpp {theirs_gpu / GiB:.2f}")
