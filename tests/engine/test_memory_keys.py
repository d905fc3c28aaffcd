"""The keyed variants (moeconf.fixtures.layouts_keyed: Qwen3-Next and Nemotron-3 Super with their MTP
block, Nemotron-3 Nano's expert_group_count, Grok's final_logit_softcapping, GLM-5's and GLM-5.2's
attention.indexer.types) against llama.cpp's own projection (`llama-fit-params -fitp on -v`, which
allocates nothing) on sparse full-size GGUFs, RPC servers on 127.0.0.1 as GPUs: the figures the
default suite holds the model to (tests/data/keyed_memory_oracle.json, tests/test_memory_keys.py)
are measured again, and moeconf's estimate is within tolerance of them; likewise ERNIE-4.5-300B and
Ling-1T (moeconf.fixtures.layouts_large; tests/data/large_memory_oracle.json, tests/test_memory_large.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.fixtures.layouts_keyed import VARIANTS, write_variant
from moeconf.fixtures.layouts_large import LARGE_LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers
from tests.recorded_memory import device_name, estimate_line, line_ids, rpc_line, within
from tests.test_memory_keys import FIGURES as KEYED
from tests.test_memory_large import FIGURES as LARGE

pytestmark = pytest.mark.engine

MiB = 1024 * 1024
FIGURES = KEYED + LARGE


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not oracle.available():
        pytest.fail(f"llama-fit-params is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    folder = tmp_path_factory.mktemp("keyed")
    out = {}
    for key in sorted({str(line["model"]) for line in FIGURES}):
        path = folder / f"{key}.gguf"
        if key in LARGE_LAYOUTS:
            write_layout(LARGE_LAYOUTS[key], path)
        else:
            write_variant(VARIANTS[key], path)
        out[key] = (path, load_inventory(path))
    return out


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


@pytest.mark.parametrize("line", FIGURES, ids=line_ids(FIGURES))
def test_the_recorded_figures_are_the_engines_and_moeconf_matches(
        sparse: dict[str, tuple[Path, Inventory]], endpoints: list[str], line: dict[str, object]) -> None:
    args, eps = rpc_line(str(line["args"]), endpoints)
    path, inv = sparse[str(line["model"])]
    proj = oracle.project(path, args, eps)
    est = estimate_line(inv, args)
    assert est.complete, est.notes
    for name, (w, kv, c) in line["devices"].items():  # type: ignore[attr-defined]
        dev = device_name(name, eps)
        assert (proj.model.get(dev, 0), proj.context.get(dev, 0)) == (w, kv), (name, line)
        assert within("compute", proj.compute_exact.get(dev, 0.0), c), (name, line)
        m = est.devices[dev]
        assert within("weights", m.weights / MiB, w, host=name == "host"), (name, "weights", line)
        assert within("kv", m.kv / MiB, kv), (name, "kv", line)
        assert within("compute", m.compute / MiB, c), (name, "compute", line)
