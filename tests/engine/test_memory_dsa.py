"""DeepSeek-V3.2 (deepseek32), GLM-5 (glm-dsa), MiniMax-M2 and Grok-1 against llama.cpp's own
projection (`llama-fit-params -fitp on -v`, which allocates nothing) on sparse full-size layouts
(moeconf.fixtures.layouts_dsa), with RPC servers on 127.0.0.1 as GPUs (issue 17):

- memory: the recorded figures (tests/engine/figures_dsa.json, which the default suite holds
  the model to) are measured again, and moeconf is within tolerance (the DSA ones' compute by the
  engine's graph, moeconf/memory/graph/archs/_dsa.py);
- placement: every tensor's device from the same log (`layer N assigned to device`, the override
  lines, `model has unused tensor` for what the loader skips) against moeconf's;
- fit: `moeconf fit`'s command, measured by the engine, within its budget."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fit import Budget, fit
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.model.inventory import Inventory
from tests.engine import oracle
from tests.engine.harness import MAINLINE, parse_mainline, rpc_servers
from tests.engine.outputs_probe import server_totals
from tests.recorded_memory import device_name, estimate_line, line_ids, rpc_line, within
from tests.test_memory_dsa import COMPUTE_GAPS, FIGURES, REFUSED_LINES

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
GiB = 1024**3
KEYS = ("deepseek-v3.2", "glm-5", "minimax-m2", "grok-1")
RESULTS: list[dict[str, object]] = []

# placement: at least -ot exps=CPU, --n-cpu-moe, -ts over two RPC devices and a partial -ngl
PLACEMENT = [(k, line) for k in KEYS for line in (
    "-ngl 999 -ot exps=CPU", "-ngl 999 --n-cpu-moe 20", "2rpc -ngl 999 -ts 1,1", "-ngl 30",
    r"2rpc -ngl 40 -ts 3,1 -ot blk\.(1|2)\d\.ffn_.*_exps=CPU",
)]
# tensors the engine loads that moeconf says it does not: the nextn block's expert-selection bias,
# created without the MTP skip flag (src/models/deepseek32.cpp, glm-dsa.cpp); the loader-skip
# table is fixed on another branch, after which this set is empty

# (model, budgets in GiB per RPC device, flags)
FITS = [
    ("glm-5", [24], "-c 32768"),
    ("deepseek-v3.2", [24], "-c 32768"),
    ("glm-5", [24, 16], "-c 65536 -ctk q8_0 -ctv q8_0"),
    ("deepseek-v3.2", [32, 24], "-c 131072 -ub 2048"),
    ("minimax-m2", [24], "-c 32768"),
    ("minimax-m2", [24, 16], "-c 65536 -ctk q8_0 -ctv q8_0"),
    ("grok-1", [64], "-c 32768"),
    ("grok-1", [48, 24], "-c 16384 -ctk q8_0"),
]


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not oracle.available():
        pytest.fail(f"llama-fit-params is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    return oracle.write_sparse(tmp_path_factory.mktemp("dsa"), {k: LAYOUTS[k] for k in KEYS})


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(MAINLINE, 3) as eps:
        yield eps


@pytest.fixture(scope="module", autouse=True)
def results_file() -> Iterator[None]:
    yield
    # beside test_memory_oracle's rows when both run (its session fixture writes them all)
    from tests.engine import test_memory_oracle

    test_memory_oracle.RESULTS.extend(RESULTS)
    oracle.save_results("MOECONF_MEMORY_RESULTS", test_memory_oracle.RESULTS)


@pytest.mark.parametrize("fig", FIGURES, ids=line_ids(FIGURES))
def test_memory_against_llama_cpp(fig: dict[str, object], sparse: dict[str, tuple[Path, Inventory]],
                                  endpoints: list[str],
                                  request: pytest.FixtureRequest) -> None:
    model, line, devices = str(fig["model"]), str(fig["args"]), fig["devices"]
    assert isinstance(devices, dict)
    path, inv = sparse[model]
    args, eps = rpc_line(line, endpoints)
    proj = oracle.project(path, args, eps)
    est = estimate_line(inv, args)
    bad = []
    for name in devices:
        dev = device_name(name, eps)
        theirs = (proj.model.get(dev, 0), proj.context.get(dev, 0),
                  proj.compute_exact.get(dev, float(proj.compute.get(dev, 0))))
        # the engine still gives the recorded figures (else regenerate figures_dsa.json)
        rec = devices[name]
        assert (theirs[0], theirs[1]) == (rec[0], rec[1]) and abs(theirs[2] - rec[2]) < 0.02, (name, theirs, rec)
        m = est.devices[dev]
        ours = (m.weights / MiB, m.kv / MiB, m.compute / MiB)
        refused = (model, line) in REFUSED_LINES  # a setting family moeconf refuses: weights only
        if not refused:
            RESULTS.append({"model": inv.arch, "args": line, "device": name, "weights": [ours[0], theirs[0]],
                            "kv": [ours[1], theirs[1]], "compute": [ours[2], theirs[2]]})
        terms = ("weights",) if refused else ("weights", "kv", "compute")
        for i, term in enumerate(("weights", "kv", "compute")):
            if term in terms and not within(term, ours[i], theirs[i], host=name == "host"):
                bad.append((name, term, round(ours[i], 2), theirs[i]))
    assert not [b for b in bad if b[1] != "compute"]
    if (model, line) in REFUSED_LINES:
        assert not est.complete
    if (model, line) in COMPUTE_GAPS:
        request.applymarker(pytest.mark.xfail(strict=True, reason="compute gap listed in COMPUTE_GAPS"))
    assert not bad


def _engine_placement(path: Path, inv: Inventory, args: list[str], eps: list[str]) -> dict[str, str | None]:
    p = oracle.fit_print(path, ["-c", "4096", *args])
    # host buffers (CPU_REPACK, AMX: memory-facts.md section 4) are the CPU to moeconf
    got: dict[str, str | None] = {n: ("CPU" if d.startswith("CPU") or d == "AMX" else d)
                                  for n, d in parse_mainline(p.stderr, inv, eps).items()}
    for name in re.findall(r"model has unused tensor (\S+) ", p.stderr):
        got[name] = None
    return got


@pytest.mark.parametrize(("model", "line"), PLACEMENT, ids=[f"{m}:{a}" for m, a in PLACEMENT])
def test_placement_against_llama_cpp(model: str, line: str, sparse: dict[str, tuple[Path, Inventory]],
                                     endpoints: list[str]) -> None:
    path, inv = sparse[model]
    args, eps = rpc_line(line, endpoints)
    got = _engine_placement(path, inv, args, eps)
    want = explain(inv, engine("llama.cpp"), args, gpus=[]).placement.devices
    diff = {n: (want[n], got.get(n)) for n in want if want[n] != got.get(n)}
    # the MTP block's exp_probs_b.bias (deepseek32, glm-dsa) is loaded: compared like every tensor
    assert not diff, dict(list(diff.items())[:10])


@pytest.mark.parametrize(("model", "budgets", "flags"), FITS, ids=[f"{m}:{b}:{f}" for m, b, f in FITS])
def test_fit_within_budget_by_the_engines_count(model: str, budgets: list[int], flags: str,
                                                sparse: dict[str, tuple[Path, Inventory]], endpoints: list[str],
                                                tmp_path: Path) -> None:
    path, inv = sparse[model]
    eps = endpoints[: len(budgets)]
    devs = [f"RPC0[{ep}]" for ep in eps]
    res = fit(inv, engine("llama.cpp"), [Budget(d, b * GiB) for d, b in zip(devs, budgets, strict=True)],
              ["--rpc", ",".join(eps), *flags.split()], model_path=str(path), plan_dir=str(tmp_path), reserve=GiB)
    served = server_totals(path, list(res.argv[3:]))  # a llama-server line: the server's output rows
    for d, b in zip(devs, budgets, strict=True):
        assert served[d] + GiB <= b * GiB, f"{d}: {served[d] / MiB:.0f} MiB + reserve over {b} GiB"


def test_a_placement_difference_is_caught(sparse: dict[str, tuple[Path, Inventory]], endpoints: list[str]) -> None:
    """The comparison sees a tensor moeconf would put elsewhere than the engine does."""
    path, inv = sparse["minimax-m2"]
    args, eps = rpc_line("-ngl 999 -ot exps=CPU", endpoints)
    got = _engine_placement(path, inv, args, eps)
    want = dict(explain(inv, engine("llama.cpp"), args, gpus=[]).placement.devices)
    assert all(want[n] == got.get(n) for n in want)
    want["blk.3.ffn_up_exps.weight"] = f"RPC0[{eps[0]}]"
    assert want["blk.3.ffn_up_exps.weight"] != got["blk.3.ffn_up_exps.weight"]

