"""Step-3.5-Flash with its MTP blocks and SwiGLU limits (tests/step35_variant.py) against the engine's
figures recorded for it: weights, KV and compute within the issue's tolerance on each line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests import graph_oracle
from tests.step35_variant import ORACLE, write_variant

ROWS = json.loads(ORACLE.read_text())["rows"]


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    return load_inventory(write_variant(Path(tmp_path_factory.mktemp("step35-variant")) / "step35.gguf"))


def test_the_variant_has_its_mtp_blocks_and_limits(variant: Inventory) -> None:
    assert variant.layers_of_kind("nextn") == [45, 46, 47]
    assert {k for k, _ in variant.metadata.float_values} >= {"swiglu_clamp_exp", "swiglu_clamp_shexp"}


@pytest.mark.parametrize("row", ROWS, ids=[r["args"] for r in ROWS])
def test_step35_variant_within_tolerance(variant: Inventory, row: dict[str, object]) -> None:
    est = graph_oracle.estimate_line(variant, str(row["args"]))
    assert est.complete, est.notes
    figures = row["engine"]
    assert isinstance(figures, dict)
    assert graph_oracle.misses(est, figures) == []
