"""What moeconf says the pinned llama.cpp's loader requires (model/layertable.py ML_REQUIRED_GLOBAL and
ML_REQUIRED_BLOCK, model/required.py) is what the engine requires: for every architecture with a tiny
graph model (moeconf/fixtures/graphmodels.py) whose loader the tables read, the file without one tensor
of each table (a different one per architecture) stops the loader with "tensor '<that name>' not
found" (llama-fit-params -fitp on: it reads the tensor metadata and allocates nothing). The complete
files load (the graph tests load each); moeconf finds nothing missing in them."""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path

import pytest

from moeconf.fixtures.graphmodels import ARCHS, write_graph_model
from moeconf.model.layertable import (
    ML_MTP_ONLY_PROBE,
    ML_REQUIRED_BLOCK,
    ML_REQUIRED_GLOBAL,
    ML_REQUIRED_UNLESS_MTP_ONLY,
)
from moeconf.model.load import load_inventory
from moeconf.model.required import missing_tensors
from tests.engine import oracle

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("table", ["block", "global"])
@pytest.mark.parametrize("arch", [a for a in ARCHS if a in ML_REQUIRED_BLOCK or a in ML_REQUIRED_GLOBAL])
def test_the_loader_stops_without_a_tensor_the_table_requires(arch: str, table: str, tmp_path: Path) -> None:
    if not oracle.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {oracle.FIT_PARAMS})")
    inv = load_inventory(write_graph_model(arch, "a", tmp_path / "whole.gguf"))
    assert missing_tensors(inv) == ()
    required = (ML_REQUIRED_BLOCK if table == "block" else ML_REQUIRED_GLOBAL).get(arch, ())
    if not required:
        pytest.skip(f"the {table} table reads nothing as surely required of {arch}")
    pick = zlib.crc32(f"{arch} {table}".encode())  # a different tensor per architecture, the same each run
    drop = required[pick % len(required)]
    if table == "block":
        trunk = inv.block_count - (inv.metadata.nextn_predict_layers or 0)
        drop %= pick % trunk
        if drop == ML_MTP_ONLY_PROBE and arch in ML_REQUIRED_UNLESS_MTP_ONLY and inv.metadata.nextn_predict_layers:
            drop = drop.replace("blk.0.", "blk.1.")  # without it the loader takes the file for its MTP blocks alone
    path = write_graph_model(arch, "a", tmp_path / "less.gguf", drop=(drop,))
    assert missing_tensors(load_inventory(path)) == (drop,)
    p = subprocess.run([str(oracle.FIT_PARAMS), "-m", str(path), "-fitp", "on"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and f"tensor '{drop}' not found" in p.stderr, p.stderr[-2000:]
