"""ik_llama.cpp: moeconf's weights and KV cache against the buffer sizes ik logs on a real load of
a sparse full-size GGUF (ik has no allocation-free dry run), with routed experts on the CPU and
one RPC server on 127.0.0.1 as the GPU.

ik 0.1.5 built for the CPU keeps every tensor no override names, and the KV cache, in its CPU
buffers when its only accelerator is an RPC server (it still logs "offloaded 49/49 layers"), so
the per-device split cannot be read back this way: the test compares the totals (all model
buffers, all KV buffers), which checks ik's KV formula (cells, cache types, -mla) and the weights sum.
A load reads the whole sparse file through mmap (resident as file pages: the full-size Qwen3-30B-A3B
took 18.9 GiB and 114 s), so the layouts keep real layer shapes with fewer blocks and experts:
each load stays near the size of its file (DeepSeek cut: 3.3 GiB, 9 s)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.memory import read_settings
from moeconf.model import ggml
from moeconf.model.inventory import Inventory
from moeconf.sizing import estimate_explained
from tests.engine import oracle
from tests.engine.harness import IK, rpc_servers

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
# layout, and the blocks and experts it is cut to (real shapes per layer)
MODELS = {"qwen3moe": ("qwen3-30b-a3b", {"blocks": 8, "experts": 16}),
          # a mainline DeepSeek GGUF (attn_k_b/attn_v_b): ik computes wkv_b at load
          "deepseek2": ("deepseek-v3", {"blocks": 4, "experts": 8})}
CASES = [
    ("qwen3moe", "-c 4096"),
    ("qwen3moe", "-c 8192 -ctk q8_0 -ctv q8_0"),
    # -mla 3 keeps one latent cache with flash attention off (144 MiB for 4 layers at 32k f16;
    # -mla 1 would add a V^T cache of 128 MiB)
    ("deepseek2", "-c 32768 -mla 3 -fa off"),
]
_BUF = re.compile(r"llm_load_tensors: +(\S+) buffer size = +([\d.]+) MiB")
_KV = re.compile(r"llama_kv_cache_init: +(\S+) KV buffer size = +([\d.]+) MiB")
# llm_prepare_mla's own buffers (not in the model buffers it logs): `Computed NAME as 512 x 32768 of type q8_0`
_COMPUTED = re.compile(r"Computed \S+ as (\d+) x (\d+)(?: x (\d+))? of type (\S+)")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not IK.available():
        pytest.fail(f"ik_llama.cpp is not built: run scripts/build-engines.sh (looked for {IK.cli})")
    return oracle.write_sparse(tmp_path_factory.mktemp("ik"), {
        key: dataclasses.replace(LAYOUTS[name], key=f"{name}-cut", **cut) for key, (name, cut) in MODELS.items()})


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with rpc_servers(IK, 1) as eps:
        yield eps[0]


@pytest.mark.parametrize(("model", "flags"), CASES, ids=[f"{m}:{f}" for m, f in CASES])
def test_ik_weights_and_kv_match_its_buffers(model: str, flags: str, models: dict[str, tuple[Path, Inventory]],
                                             endpoint: str, tmp_path: Path) -> None:
    path, inv = models[model]
    dev = f"RPC0[{endpoint}]"
    args = ["--rpc", endpoint, "-dev", dev, "-ngl", "999", "-ot", "exps=CPU", *flags.split()]
    argv = [str(IK.cli), "-m", str(path), *args, "-n", "1", "-p", "hi", "-t", "1", "--temp", "0", "--no-warmup"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
                       stdin=subprocess.DEVNULL)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-3000:]
    weights = {m.group(1): float(m.group(2)) for m in _BUF.finditer(log)}
    kv = {m.group(1): float(m.group(2)) for m in _KV.finditer(log)}
    eng = engine("ik_llama.cpp", "0.1.5")
    ex = explain(inv, eng, args, gpus=[])
    est = estimate_explained(ex, read_settings(args, eng))
    ours_weights = sum(m.weights for m in est.devices.values()) / MiB
    ours_kv = sum(m.kv for m in est.devices.values()) / MiB
    computed = 0
    for m in _COMPUTED.finditer(log):
        shape = tuple(int(x) for x in m.groups()[:3] if x)
        computed += ggml.nbytes(ggml.type_ids()[m.group(4).upper()], shape) or 0
    assert abs(ours_weights - sum(weights.values()) - computed / MiB) <= 1.0, (ours_weights, weights, computed)
    assert abs(ours_kv - sum(kv.values())) <= 0.01, (ours_kv, kv)
