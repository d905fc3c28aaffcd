"""ik_llama.cpp 0.1.5's compute buffers against moeconf's estimate for ik: llama.cpp's graph of the
same placement plus the margin (moeconf/memory/ikarchs.py), on real loads of cut layouts of every
architecture of the shipped manifests that ik loads (tests/engine/ik_compute_cases.py), each line
with every layer on one or two RPC servers and the routed experts on the CPU.

Each load also checks that ik put weights and KV cache where moeconf puts them for the user's line
(the RPC devices' model buffers and every device's KV buffer), so that the compute buffers compared
are those of the same placement. ik logs a compute buffer per backend (RPC servers and the host).

`MOECONF_IK_COMPUTE_RESULTS=FILE` writes the measured figures (tests/data/ik_compute_figures.json is
such a file: the default suite holds the margin to it, tests/test_memory_ik_compute.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from moeconf.engines import Engine, engine, mainline
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import estimate, ik_twin_settings
from moeconf.memory.ikarchs import COMPUTE_DIFFERS, COMPUTE_MARGINS
from moeconf.model.inventory import Inventory
from moeconf.model.nametable import SOURCES
from moeconf.placement import Placement
from moeconf.sizing import estimate_explained
from tests.engine import ik_compute_cases as cases
from tests.engine import ik_newer_cases, oracle
from tests.engine.harness import IK, rpc_servers
from tests.engine.ik_compute_cases import COMPUTE_LOG, KV_LOG, by_device, device_key

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
ROWS: list[dict[str, object]] = []
_BUF = re.compile(r"llm_load_tensors: +(\S+) buffer size = +([\d.]+) MiB")
_COMPUTED = re.compile(r"Computed \S+ as (\d+) x (\d+)(?: x (\d+))? of type (\S+)")
_LAYER = re.compile(r"Setting default device in layer +(\d+) to (\d+)")
_UNALLOCATED = re.compile(r"failed to allocate (\S+) buffer of size (\d+)")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Inventory]]]:
    if not IK.available():
        pytest.fail(f"ik_llama.cpp is not built: run scripts/build-engines.sh (looked for {IK.cli})")
    written = oracle.write_sparse(tmp_path_factory.mktemp("ikcompute"), {m: cases.cut_layout(m) for m in cases.CUTS})
    for m in ik_newer_cases.FILLED:
        ik_newer_cases.fill_blocks(written[m][0])
    yield written
    target = os.environ.get("MOECONF_IK_COMPUTE_RESULTS")
    if ROWS and target:
        Path(target).write_text(json.dumps({"engine": SOURCES["ik_llama.cpp"], "rows": ROWS}, indent=1) + "\n")


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(IK, 2) as eps:
        yield eps




@pytest.mark.parametrize(("model", "line"), cases.cases(), ids=[f"{m}:{x}" for m, x in cases.cases()])
def test_ik_compute_within_the_margin(model: str, line: str, models: dict[str, tuple[Path, Inventory]],
                                      endpoints: list[str], tmp_path: Path) -> None:
    path, inv = models[model]
    argv = [str(IK.cli), "-m", str(path), *cases.engine_args(line, endpoints), "-n", "1", "-p", "hi", "-t", "1",
            "--temp", "0", "--no-warmup"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
                       stdin=subprocess.DEVNULL)
    log = p.stdout + p.stderr
    eng = engine(IK.name, IK.version)
    n = cases.n_devices(line)
    # ik's layer split over two RPC servers (its raw device 0 is the CPU, which takes none)
    logged = {int(a): int(b) - 1 for a, b in _LAYER.findall(log)}
    layer_devices = [logged.get(il, n - 1) for il in range(inv.block_count + 1)] if n > 1 and logged else None
    args = cases.user_args(line, endpoints)
    est = estimate_explained(explain(inv, eng, args, gpus=[], layer_devices=layer_devices), read_settings(args, eng))
    # a compute buffer the machine could not allocate: ik logs the size it needed (Grok-1 at -ub 2048 asks
    # one RPC server for 25 GiB)
    unallocated = {device_key(m.group(1), endpoints): round(int(m.group(2)) / MiB, 2)
                   for m in _UNALLOCATED.finditer(log)}
    if p.returncode != 0 and not unallocated:  # the engine refused the settings: moeconf must say it would
        assert "failed to create context" in log or "failed to load model" in log, log[-3000:]
        assert est.problems, (log[-1500:], est.notes)
        ROWS.append({"model": model, "line": line, "refused": True})
        return
    assert n == 1 or layer_devices is not None, log[-3000:]
    computed = sum(oracle_nbytes(m.group(4), tuple(int(x) for x in m.groups()[:3] if x))
                   for m in _COMPUTED.finditer(log))
    compute = unallocated or {k: v for k, v in by_device(COMPUTE_LOG, log, endpoints).items() if v >= 0.01}
    ik = {"weights": by_device(_BUF, log, endpoints), "computed": round(computed / MiB, 4),
          "kv": by_device(KV_LOG, log, endpoints), "compute": compute}
    names = {device_key(d, endpoints): d for d in est.devices}
    # llama.cpp's graph of the same placement, as moeconf sizes it for ik (memory/estimate.py)
    twin = estimate(replace(est_placement(inv, eng, args, layer_devices), engine=mainline()),
                    ik_twin_settings(read_settings(args, eng)))
    graph = {key: round(twin.devices[names[key]].compute / MiB, 2) for key in compute}
    row: dict[str, object] = {"model": model, "line": line, "layer_devices": layer_devices, "ik": ik,
                              "llama_cpp_graph": graph,
                              "ik_above": {key: round(compute[key] - graph[key], 2) for key in graph}}
    if unallocated:
        row["unallocated"] = True
    ROWS.append(row)
    # the same placement: every device's KV, the RPC devices' weights (the MLA tensors ik computes at
    # load are buffers of their own: counted in the total)
    for key, mib in ik["kv"].items():
        assert abs(est.devices[names[key]].kv / MiB - mib) <= 0.01, (key, ik, est.devices)
    weights = sum(m.weights for m in est.devices.values()) / MiB
    assert abs(weights - sum(ik["weights"].values()) - ik["computed"]) <= 1.0, (weights, ik)
    if not ik["computed"]:
        for key, mib in ik["weights"].items():
            if key != "CPU":
                assert abs(est.devices[names[key]].weights / MiB - mib) <= 1.0, (key, ik, est.devices)
    # compute: ik's logged buffers against llama.cpp's graph plus the margin (where ik's graph differs
    # materially: refused, and the difference must still be there)
    if inv.arch in COMPUTE_DIFFERS:
        assert not est.complete and max(compute[k] - graph[k] for k in graph) > 64, row
        return
    assert est.complete, est.notes
    for key, mib in compute.items():
        assert mib <= est.devices[names[key]].compute / MiB + 0.005, (key, mib, graph, COMPUTE_MARGINS.get(inv.arch))


def est_placement(inv: Inventory, eng: Engine, args: list[str], layer_devices: list[int] | None) -> Placement:
    return explain(inv, eng, args, gpus=[], layer_devices=layer_devices).placement


def oracle_nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    from moeconf.model import ggml

    return ggml.nbytes(ggml.type_ids()[type_name.upper()], shape) or 0
