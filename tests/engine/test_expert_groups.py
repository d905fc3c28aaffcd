"""llama.cpp reads a file's expert groups (`expert_group_count`, `expert_group_used_count`) for every
architecture (llama-model.cpp, load_hparams' common keys) and build_moe_ffn limits the routing to the top groups
wherever they are set; the pinned converter writes them for any model whose config has `n_group`. So moeconf's
graph takes them for every composition (memory/graph/model.py, `_compose`) and its memory accepts them on every
modelled architecture (memory/keys.py, `NO_MEMORY_EFFECT`). On each architecture's tiny model with routed experts
(set "a", the experts in two groups of which one is used) its graph equals the engine's node for node, and the
engine's graph is larger than the same model's without groups (no groups): the groups were routed. GroveMoE,
whose graph the engine aborts with groups, is refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.graphmodels import ARCHS, write_graph_model
from moeconf.memory import read_settings
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests import enginegraph
from tests.engine import oracle
from tests.engine.graphdump import DATA, LINES, dump, file_name, shared_tool
from tests.engine.harness import MAINLINE, rpc_servers
from tests.recorded_memory import rpc_args

pytestmark = pytest.mark.engine

LINE = "rpc"
ABORTS = {"grovemoe"}  # build_moe_ffn's groups over the adjugate experts: GGML_ASSERT in ggml_reshape_3d


def _routed(arch: str) -> bool:
    path = DATA / file_name(arch, "a", LINE)
    return path.exists() and any(n.op == "MUL_MAT_ID" for n in enginegraph.load(path, endpoints=("a", "b")).nodes)


CASES = [a for a in ARCHS if _routed(a)]
assert len(CASES) >= 57, CASES  # every tiny model with routed experts (58 models; refact's is dense)


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    if not MAINLINE.available() or not oracle.available():
        pytest.fail("llama.cpp build not available: run scripts/build-engines.sh")
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


def _grouped(arch: str, path: Path, groups: int = 2, used: int = 1) -> Path:
    return write_graph_model(arch, "a", path, keys=((f"{arch}.expert_group_count", groups, "u32"),
                                                    (f"{arch}.expert_group_used_count", used, "u32")))


@pytest.mark.parametrize("arch", sorted(set(CASES) - ABORTS))
def test_expert_groups_route_as_the_engines(arch: str, endpoints: list[str], tmp_path: Path) -> None:
    path = _grouped(arch, tmp_path / f"{arch}.gguf")
    inv = load_inventory(path)
    assert inv.metadata.expert_count and inv.metadata.expert_count % 2 == 0 and inv.metadata.expert_count > 2
    args = rpc_args(LINES[LINE], endpoints)
    theirs = enginegraph.from_dict(dump(shared_tool(), path, args))
    ungrouped = enginegraph.from_dict(dump(shared_tool(), _grouped(arch, tmp_path / "none.gguf", 0, 0), args))
    assert len(theirs.nodes) > len(ungrouped.nodes), "the engine's graph did not route by groups"
    diff = enginegraph.compare(enginegraph.scheduled(*enginegraph.placed(inv, args), arch), theirs, ignore=("name",))
    assert diff is None, str(diff)


def test_a_grovemoe_file_with_groups_is_refused(endpoints: list[str], tmp_path: Path) -> None:
    path = _grouped("grovemoe", tmp_path / "grovemoe.gguf")
    args = rpc_args(LINES[LINE], endpoints)
    with pytest.raises(RuntimeError, match=r"GGML_ASSERT\(ggml_nelements\(a\) == ne0\*ne1\*ne2\)"):
        dump(shared_tool(), path, args)
    est = estimate_explained(explain(load_inventory(path), engine("llama.cpp"), args, gpus=[]),
                             read_settings(args, engine("llama.cpp")))
    assert not est.complete and any("cannot run this grovemoe file: it sets 2 expert groups" in n for n in est.notes)


@pytest.mark.parametrize(("groups", "used", "check"), [
    (3, 1, "hparams.n_expert % hparams.n_expert_groups == 0"),
    (2, 2, "hparams.n_group_used < hparams.n_expert_groups"),
    (2, 0, "hparams.n_group_used > 0"),
    (8, 1, "hparams.n_expert_groups < hparams.n_expert"),
])
def test_groups_the_loader_stops_on_are_refused(groups: int, used: int, check: str, endpoints: list[str],
                                                tmp_path: Path) -> None:
    path = _grouped("qwen3moe", tmp_path / "qwen3moe.gguf", groups, used)
    inv = load_inventory(path)
    assert inv.metadata.expert_count == 8
    args = rpc_args(LINES[LINE], endpoints)
    with pytest.raises(RuntimeError, match=re.escape(f"GGML_ASSERT({check})")):
        dump(shared_tool(), path, args)
    est = estimate_explained(explain(inv, engine("llama.cpp"), args, gpus=[]), read_settings(args, engine("llama.cpp")))
    assert not est.complete and est.notes[0].startswith("llama.cpp's loader stops on this qwen3moe file"), est.notes


def test_an_override_of_the_groups_loads(endpoints: list[str], tmp_path: Path) -> None:
    """The loader reads --override-kv instead of the file's key: 3 groups of 8 experts stop it, the override of the
    count to 0 loads, and explain refuses the first line only (memory under --override-kv is refused either way)."""
    path = _grouped("qwen3moe", tmp_path / "qwen3moe.gguf", 3, 1)
    args = rpc_args(LINES[LINE], endpoints)
    fixed = [*args, "--override-kv", "qwen3moe.expert_group_count=int:0"]
    with pytest.raises(RuntimeError, match=re.escape("GGML_ASSERT(hparams.n_expert % hparams.n_expert_groups == 0)")):
        dump(shared_tool(), path, args)
    assert dump(shared_tool(), path, fixed)["nodes"]
    inv = load_inventory(path)
    assert explain(inv, engine("llama.cpp"), args, gpus=[]).load_refusals
    assert not explain(inv, engine("llama.cpp"), fixed, gpus=[]).load_refusals
