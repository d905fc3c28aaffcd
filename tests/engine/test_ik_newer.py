"""ik_llama.cpp 0.1.5 on the newer architectures (Qwen3.5-MoE, Qwen3-Next, GLM-5's glm-dsa,
MiniMax-M2, Grok-1, ERNIE-4.5, Hunyuan, Ling 2.0, dots.llm1, Qwen3-VL-MoE, Mistral-Small-4, MiMo-V2-Flash,
Step-3.5-Flash and the others in ik_newer_cases.CUTS): where it places each
tensor (with `--dry-run`: placed, weights not read), and its weights and KV cache against the
buffer sizes it logs on real loads of cut layouts (tests/engine/ik_newer_cases.py). moeconf
models weights and KV on ik for these (moeconf/memory/ikarchs.py); their compute is measured by
tests/engine/test_ik_compute.py.

`MOECONF_IK_NEWER_RESULTS=FILE` writes the measured figures (tests/data/ik_newer_figures.json is
such a file: the default suite holds moeconf to it, tests/test_memory_ik_newer.py)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.engines.cmdline import invocation_ncmoe
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.model.inventory import Inventory
from moeconf.sizing import estimate_explained
from tests.engine import ik_newer_cases as cases
from tests.engine import oracle
from tests.engine.harness import IK, parse_ik, rpc_servers, run_engine
from tests.engine.test_engines import differences

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
ROWS: list[dict[str, object]] = []
_BUF = re.compile(r"llm_load_tensors: +(\S+) buffer size = +([\d.]+) MiB")
_KV = re.compile(r"llama_kv_cache_init: +(\S+) KV buffer size = +([\d.]+) MiB")
_COMPUTE = re.compile(r"llama_init_from_model: +(\S+) compute buffer size = +([\d.]+) MiB")
_COMPUTED = re.compile(r"Computed \S+ as (\d+) x (\d+)(?: x (\d+))? of type (\S+)")
_UNUSED = re.compile(r"model has unused tensor (\S+) ")
# placement: ik's --dry-run places every tensor and logs it as a full load does, without reading
# the weights (2-9x faster); it may then crash on the data it never read (computing GLM-5's wkv_b
# from mmap'ed host tensors, flash attention on the first token), and what ik printf's to stdout
# (the --n-cpu-moe shares) is lost with the crash: such a line is loaded again for real
_DRY = ["--dry-run"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Inventory]]]:
    if not IK.available():
        pytest.fail(f"ik_llama.cpp is not built: run scripts/build-engines.sh (looked for {IK.cli})")
    names = [*cases.CUTS, *cases.KV_ONLY_CUTS]
    written = oracle.write_sparse(tmp_path_factory.mktemp("iknewer"), {m: cases.cut_layout(m) for m in names})
    for m in cases.FILLED:
        cases.fill_blocks(written[m][0])
    yield written
    oracle.save_results("MOECONF_IK_NEWER_RESULTS", ROWS, sharded=False)  # this module alone: the file itself


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(IK, 2) as eps:
        yield eps


def _sum(pattern: re.Pattern[str], log: str) -> float:
    return round(sum(float(m.group(2)) for m in pattern.finditer(log)), 2)


@pytest.mark.parametrize(("model", "line"), cases.kv_cases(), ids=[f"{m}:{x}" for m, x in cases.kv_cases()])
def test_ik_weights_and_kv(model: str, line: str, models: dict[str, tuple[Path, Inventory]],
                           endpoints: list[str], tmp_path: Path) -> None:
    path, inv = models[model]
    host = line.startswith("host")
    args = cases.engine_args(line, None if host else endpoints[0])
    argv = [str(IK.cli), "-m", str(path), *args, "-n", "1", "-p", "hi", "-t", "1", "--temp", "0", "--no-warmup"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
                       stdin=subprocess.DEVNULL)
    log = p.stdout + p.stderr
    eng = engine(IK.name, IK.version)
    est = estimate_explained(explain(inv, eng, args, gpus=[]), read_settings(args, eng))
    if p.returncode != 0:  # the engine refused the settings: moeconf must say it would
        assert "failed to create context" in log, log[-3000:]
        assert est.problems, (log[-1500:], est.notes)
        ROWS.append({"model": model, "line": line, "refused": True})
        return
    computed = sum(cases.nbytes_of(m.group(4), tuple(int(x) for x in m.groups()[:3] if x))
                   for m in _COMPUTED.finditer(log))
    ik = {"weights": _sum(_BUF, log), "computed": round(computed / MiB, 4), "kv": _sum(_KV, log),
          "compute": {m.group(1).split("[")[0]: float(m.group(2)) for m in _COMPUTE.finditer(log)}}
    ROWS.append({"model": model, "line": line, "ik": ik})
    ours_weights = sum(m.weights for m in est.devices.values())
    ours_kv = sum(m.kv for m in est.devices.values()) / MiB
    # compute from llama.cpp's graph plus ik's measured margin (tests/engine/test_ik_compute.py), or,
    # where llama.cpp's graph is not modelled for the placement, "?" with the next step
    assert est.complete or (est.kv_known and any(n.startswith("next step:") for n in est.notes)), est.notes
    assert abs(ours_kv - ik["kv"]) <= 0.01, (ours_kv, ik)
    if host:
        # every tensor in one mmap'ed host buffer: ik logs the file span of the loaded tensors
        # (skipped MTP tensors between them included); the weights moeconf counts are the tensors
        unused = set(_UNUSED.findall(log))
        ex = explain(inv, eng, args, gpus=[])
        assert {n for n, d in ex.placement.devices.items() if d is None} == unused
        loaded = {t.name for t in inv.tensors if t.name not in unused}
        assert abs((cases.mmap_span(inv, loaded) + computed) / MiB - ik["weights"] - ik["computed"]) <= 0.01, ik
        skipped = cases.skipped_in_span(inv, unused)
        assert abs((ours_weights + skipped) / MiB - ik["weights"] - ik["computed"]) <= 1.0, (ours_weights, skipped, ik)
    else:
        assert abs(ours_weights / MiB - ik["weights"] - ik["computed"]) <= 1.0, (ours_weights / MiB, ik)


def _placement_cases() -> list[tuple[str, str]]:
    return [(m, line.replace("{half}", str(cases.CUTS[m]["blocks"] // 2)))
            for m in cases.CUTS for line in cases.PLACEMENT_LINES]


@pytest.mark.parametrize(("model", "line"), _placement_cases(), ids=[f"{m}:{x}" for m, x in _placement_cases()])
def test_ik_places_every_tensor(model: str, line: str, models: dict[str, tuple[Path, Inventory]],
                                endpoints: list[str]) -> None:
    path, inv = models[model]
    words = shlex.split(line)
    n = 2 if "2rpc" in words else 1
    eps = endpoints[:n]
    args = ["--rpc", ",".join(eps), *[w for w in words if w != "2rpc"]]
    run = run_engine(IK, path, [*args, *_DRY], None, eps)
    if run.returncode != 0:
        run = run_engine(IK, path, args, None, eps)
    assert run.returncode == 0, run.log[-3000:]
    ik_log = parse_ik(run.log, inv, eps)
    # over two devices ik splits the layers by free memory: moeconf is told that split (from the
    # log), and every tensor's device and the --n-cpu-moe shares are compared
    ex = explain(inv, engine(IK.name, IK.version), args, gpus=[], layer_devices=ik_log.layer_devices)
    diff: dict[str, object] = dict(differences(IK, ex.placement.devices, ik_log.placement))
    takes = [t for t, _o, _k in invocation_ncmoe(ex.invocation, inv, n, ik_log.layer_devices)]
    mine = [share for t in takes for share in t.shares]
    if ik_log.shares != mine:
        diff["(--n-cpu-moe shares)"] = (str(mine), str(ik_log.shares))
    ROWS.append({"model": model, "placement": line, "tensors": len(inv.tensors), "disagreements": len(diff)})
    assert not diff, dict(list(diff.items())[:8])
