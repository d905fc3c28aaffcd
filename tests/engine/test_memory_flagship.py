"""The flagship layouts (Kimi-K2.5, Qwen3-Coder-480B, GLM-4.7, Qwen3.5-122B and 35B, DeepSeek-V3
with its expert groups, Qwen3.5-35B with its MTP block) against llama.cpp's own projection
(`llama-fit-params -fitp on -v`, which allocates nothing) on sparse full-size GGUFs, with RPC
servers on 127.0.0.1 as GPUs (issue 17 item 6): the engine loads each, the figures the default suite holds the model to
(tests/data/flagship_memory_oracle.json) are measured again, and `moeconf fit`'s command stays
within its budget when the engine measures it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.fit import Budget, fit
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers
from tests.engine.outputs_probe import server_totals
from tests.recorded_memory import device_name, line_ids, rpc_line, within
from tests.test_memory_flagship import FIGURES, VARIANTS, grouped_deepseek_v3, write_qwen35_with_mtp

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
GiB = 1024**3

# (model, budgets in GiB per RPC device, flags)
FITS = [
    ("kimi-k2.5", [24], "-c 32768"),
    ("kimi-k2.5", [24, 24], "-c 65536 -ctk q8_0 -ctv q8_0"),
    ("qwen3.5-122b-a10b", [24], "-c 65536"),
    ("qwen3-coder-480b-a35b", [24, 16], "-c 65536 -ctk q8_0 -ctv q8_0"),
    ("glm-4.7", [24], "-c 32768 -ctk q8_0 -ctv q8_0"),
]


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not oracle.available():
        pytest.fail(f"llama-fit-params is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    keys = {str(line["model"]) for line in FIGURES} - set(VARIANTS)
    layouts = {k: LAYOUTS[k] for k in keys} | {"deepseek-v3-groups": grouped_deepseek_v3()}
    folder = tmp_path_factory.mktemp("flagship")
    out = oracle.write_sparse(folder, layouts)
    write_qwen35_with_mtp(folder / "qwen3.5-35b-mtp.gguf")
    out["qwen3.5-35b-mtp"] = (folder / "qwen3.5-35b-mtp.gguf", load_inventory(folder / "qwen3.5-35b-mtp.gguf"))
    return out


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


@pytest.mark.parametrize("line", FIGURES, ids=line_ids(FIGURES))
def test_the_recorded_figures_are_the_engines(sparse: dict[str, tuple[Path, Inventory]], endpoints: list[str],
                                              line: dict[str, object]) -> None:
    args, eps = rpc_line(str(line["args"]), endpoints)
    proj = oracle.project(sparse[str(line["model"])][0], args, eps)
    for name, (w, kv, c) in line["devices"].items():  # type: ignore[attr-defined]
        dev = device_name(name, eps)
        assert (proj.model.get(dev, 0), proj.context.get(dev, 0)) == (w, kv), (name, line)
        assert within("compute", proj.compute_exact.get(dev, 0.0), c), (name, line)


@pytest.mark.parametrize(("model", "budgets", "flags"), FITS, ids=[f"{m}:{b}:{f}" for m, b, f in FITS])
def test_fit_stays_within_its_budget(sparse: dict[str, tuple[Path, Inventory]], endpoints: list[str],
                                     tmp_path: Path, model: str, budgets: list[int], flags: str) -> None:
    path, inv = sparse[model]
    eps = endpoints[:len(budgets)]
    devs = [f"RPC0[{e}]" for e in eps]
    res = fit(inv, engine("llama.cpp"), [Budget(d, b * GiB) for d, b in zip(devs, budgets, strict=True)],
              ["--rpc", ",".join(eps), *flags.split()], model_path=str(path), plan_dir=str(tmp_path), reserve=GiB)
    served = server_totals(path, list(res.argv[3:]))  # a llama-server line: the server's output rows
    for d, b in zip(devs, budgets, strict=True):
        assert served[d] + GiB <= b * GiB, (d, served[d] / MiB, res.argv)
