"""Keys the pinned converter writes for real models of modelled architectures, held to llama.cpp's
own projection: tests/data/keyed_memory_oracle.json was measured with `llama-fit-params -fitp on`
(llama.cpp 0.3.36) on the sparse full-size variants of moeconf.fixtures.layouts_keyed (the engine
suite measures them again, tests/engine/test_memory_keys.py). Each key is one the architecture's
loader reads (moeconf/engines/archkeys.py), so each line was refused before it was modelled:

- Qwen3-Next's and Nemotron-3 Super's MTP block (`nextn_predict_layers`): the loader skips its
  tensors and no trunk layer attends it: the same figures as without it;
- Nemotron-3's `expert_group_count` 1: no group selection (`build_moe_ffn` selects groups above 1);
- Grok's `final_logit_softcapping`: three ops on the logits, each in place;
- GLM-5.2's `attention.indexer.types`: the indexer K cache on the full layers only, the shared
  layers reusing the last full layer's top-k (memory/indexer.py, memory/graph/archs/_dsa.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.engines import archkeys
from moeconf.fixtures.layouts_keyed import VARIANTS, write_variant
from moeconf.memory import support
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.inventory import Inventory
from moeconf.model.required import group_stops, load_refusals
from tests.recorded_memory import assert_recorded, errors, estimate_rpc, line_ids, sparse_models

REPO = Path(__file__).resolve().parent.parent
FIGURES = json.loads((REPO / "tests" / "data" / "keyed_memory_oracle.json").read_text())["lines"]
EPS = ["127.0.0.1:50871", "127.0.0.1:50872"]
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    return sparse_models(tmp_path_factory.mktemp("keyed"), FIGURES, lambda k, p: write_variant(VARIANTS[k], p))


def _estimate(inv: Inventory, line: str) -> tuple[MemoryEstimate, list[str]]:
    return estimate_rpc(inv, line, EPS)


@pytest.mark.parametrize("line", FIGURES, ids=line_ids(FIGURES))
def test_memory_matches_the_engines_figures(models: dict[str, Inventory], line: dict[str, object]) -> None:
    assert_recorded(models[str(line["model"])], line, EPS)


def test_the_comparison_catches_a_wrong_answer(models: dict[str, Inventory]) -> None:
    """GLM-5.2's figures against GLM-5's (every indexer full): more indexer cache, another compute."""
    line = next(f for f in FIGURES if f["model"] == "glm-5.2-indexer" and f["args"] == "-c 8192 -ngl 999 -ub 2048")
    full = next(f for f in FIGURES if f["model"] == "glm-5-indexer-full" and f["args"] == line["args"])
    est, eps = _estimate(models["glm-5.2-indexer"], str(line["args"]))
    assert not errors(est, line["devices"], eps)
    assert ("RPC0", "kv") in {(d, t) for d, t, _, _ in errors(est, full["devices"], eps)}
    # compute: 48 MiB above GLM-5's (inside the suite's tolerance), matched to 0.01 MiB
    ours = est.devices[f"RPC0[{eps[0]}]"].compute / MiB
    assert abs(ours - line["devices"]["RPC0"][2]) < 0.01 and ours - full["devices"]["RPC0"][2] > 40  # type: ignore[index]


@pytest.mark.parametrize(("model", "key"), [
    ("qwen3-next-80b-a3b-mtp", "nextn_predict_layers"),
    ("nemotron-3-super-120b-a12b-mtp", "nextn_predict_layers"),
    ("grok-1-final-softcap", "final_logit_softcapping"),
    ("glm-5.2-indexer", "attention.indexer.types"),
])
def test_each_key_is_read_by_the_loader_and_refused_unmodelled(models: dict[str, Inventory], model: str, key: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    inv = models[model]
    assert key in archkeys.MAINLINE[inv.arch] and key in (inv.metadata.arch_keys or ())
    assert support.unmodelled(inv, "llama.cpp") == []
    spec = support.MODELLED[inv.arch]
    monkeypatch.setitem(support.MODELLED, inv.arch, dataclasses.replace(spec, keys=spec.keys - {key}))
    why = support.unmodelled(inv, "llama.cpp")
    assert [w.split(":")[0] for w in why] == [f"memory is not modelled for {inv.arch}.{key}"]
    assert "llama-fit-params -fitp on" in why[0]


def test_expert_groups_are_modelled_where_the_loader_takes_them(models: dict[str, Inventory]) -> None:
    """Nemotron-3's converter writes n_group (1): no group selection. With 8 groups (4 used) the engine builds
    group selection ops, and so does moeconf's graph (for every composition: tests/engine/test_expert_groups.py):
    modelled, with more compute. Groups the engine's loader stops on are refused (model/required.py, the file's
    load refusals: explain reports them and the memory model refuses the file), naming the check."""
    inv = models["nemotron-3-nano-30b-a3b-groups"]
    assert inv.metadata.hparam("expert_group_count") == 1 and support.unmodelled(inv, "llama.cpp") == []
    md = inv.metadata

    def grouped(groups: int, used: int) -> Inventory:
        hp = dict(md.hparams) | {"expert_group_count": groups, "expert_group_used_count": used}
        return dataclasses.replace(inv, metadata=dataclasses.replace(
            md, hparams=tuple(sorted(hp.items())), arch_keys=(*(md.arch_keys or ()), "expert_group_used_count")))

    eight = grouped(8, 4)
    assert support.unmodelled(eight, "llama.cpp") == []
    from moeconf.engines import engine
    from moeconf.explanation import explain
    from moeconf.memory import read_settings
    from moeconf.memory.graph import model

    def nodes(i: Inventory) -> int:
        args, eng = ["-c", "4096", "-ngl", "0", "-fit", "off"], engine("llama.cpp")
        g, _ = model.build(explain(i, eng, args, gpus=[]).placement,
                           model.setup_for(i, read_settings(args, eng), pipeline=False))
        return len(g.gf.nodes)

    # the group selection per MoE layer: reshapes, an argsort, get_rows, sum_rows, a second argsort, fill, set_rows
    assert nodes(eight) > nodes(inv)
    for groups, used in ((3, 1), (8, 8), (8, 0), (128, 1)):
        why = load_refusals(grouped(groups, used))
        assert len(why) == 1 and why[0].startswith("llama.cpp's loader stops on this nemotron_h_moe file"), why
    # without routed experts the loader asks for no groups at all (a dense file passes without them)
    dense = grouped(0, 0)
    dense = dataclasses.replace(dense, metadata=dataclasses.replace(dense.metadata, expert_count=0))
    assert group_stops(dense) == []
    dense = dataclasses.replace(dense, metadata=dataclasses.replace(
        dense.metadata, hparams=tuple(sorted((dict(dense.metadata.hparams) | {"expert_group_count": 1}).items()))))
    assert "with no routed experts" in group_stops(dense)[0]


def test_glm_indexer_tables_the_engine_refuses_are_refused(models: dict[str, Inventory]) -> None:
    """A table of the wrong length (the loader throws) or whose first layer is shared (the graph
    asserts) is not modelled."""
    inv = models["glm-5.2-indexer"]
    md = inv.metadata
    types = md.hparam("attention.indexer.types")
    assert isinstance(types, tuple) and len(types) == 78 and sum(types) == 21
    for bad in (types[:-1], (0, *types[1:])):
        hp = dict(md.hparams) | {"attention.indexer.types": bad}
        wrong = dataclasses.replace(inv, metadata=dataclasses.replace(md, hparams=tuple(sorted(hp.items()))))
        est, _ = _estimate(wrong, "-c 32768 -ngl 999")
        assert not est.complete and any("indexer.types" in n for n in est.notes)
