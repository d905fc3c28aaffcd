"""llama-server's context checkpoints against the engine: tests/engine/state_size.c, compiled
against the pinned llama.cpp build, decodes tokens on a cut layout and prints
`llama_state_seq_get_size_ext(..., LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)`, the bytes a checkpoint
copies; moeconf's `servercache.checkpoint` must give the same bytes. The rows are those recorded
in tests/data/server_checkpoints.json (which the default suite holds the model to)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from moeconf.engines.settings import MemorySettings
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory.geometry import geometry
from moeconf.memory.servercache import checkpoint
from moeconf.model.load import load_inventory
from tests.conftest import REPO
from tests.engine.harness import MAINLINE

pytestmark = pytest.mark.engine

DATA = json.loads((REPO / "tests" / "data" / "server_checkpoints.json").read_text())
GGML_TYPES = {"f16": 1, "q8_0": 8}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MAINLINE.available():
        pytest.skip("llama.cpp build not available (scripts/build-engines.sh)")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: the engine suite builds the engines and needs one")
    root = MAINLINE.cli.parent.parent.parent  # .../llama-cpp-python-0.3.36
    src = root / "src" / "vendor" / "llama.cpp"
    out = tmp_path_factory.mktemp("probe") / "state_size"
    lib = MAINLINE.cli.parent
    subprocess.run([cc, "-O1", "-o", str(out), str(Path(__file__).parent / "state_size.c"),
                    f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", f"-L{lib}", "-lllama",
                    f"-Wl,-rpath,{lib}"], check=True, capture_output=True, timeout=120)
    return out


@pytest.mark.parametrize("row", DATA["rows"], ids=lambda r: f"{r['layout']}-{r['type']}-np{r['n_seq']}")
def test_checkpoint_bytes_are_the_engines(probe: Path, tmp_path: Path, row: dict[str, object]) -> None:
    lay = dataclasses.replace(LAYOUTS[str(row["layout"])], **row["cut"])  # type: ignore[arg-type]
    path = tmp_path / "cut.gguf"
    write_layout(lay, path)
    args = [str(probe), str(path), str(row["tokens"]), str(row["n_ctx"]), str(row["n_seq"])]
    if row["type"] != "f16":
        args.append(str(GGML_TYPES[str(row["type"])]))
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    words = p.stdout.split()
    engine_partial = int(words[words.index("partial") + 1])
    assert engine_partial == row["partial"], "the recorded figure no longer matches the engine"
    inv = load_inventory(path)
    n = int(str(row["n_seq"]))
    s = MemorySettings(n_ctx=min(int(str(row["n_ctx"])), int(str(row["tokens"]))), n_parallel=n, kv_unified=True,
                       cache_type_k=str(row["type"]), cache_type_v=str(row["type"]))
    assert checkpoint(inv, geometry(inv), s, 10000)[0] == engine_partial
