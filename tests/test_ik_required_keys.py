"""Keys ik_llama.cpp's loader requires whatever the file (moeconf/engines/archkeys.py IK_REQUIRED, generated): a
file without one is refused on ik, by explain and by the memory model, and not on llama.cpp; --override-kv giving the
key lifts the refusal (the loader reads the override). The engine suite sees ik stop on each key of every ik-modelled
architecture's tiny model (tests/engine/test_ik_required_keys.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from moeconf.engines import engine
from moeconf.engines.archkeys import IK_REQUIRED
from moeconf.engines.ikkeys import ik_key_stops
from moeconf.explanation import explain
from moeconf.fixtures.graphmodels import write_graph_model
from moeconf.memory import read_settings
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained


def test_the_table_holds_what_the_loaders_require() -> None:
    # ik's bailingmoe2 case reads its groups, widths, shared count, scale and gating without `false`; a key its
    # case reads optionally (`expert_weights_norm`, `nextn_predict_layers`) is not required
    assert {"expert_group_count", "expert_group_used_count", "leading_dense_block_count", "expert_gating_func",
            "expert_weights_scale", "expert_shared_count"} <= IK_REQUIRED["bailingmoe2"]
    assert not {"expert_weights_norm", "nextn_predict_layers"} & IK_REQUIRED["bailingmoe2"]
    assert IK_REQUIRED["mimo2"] >= {"rope.freq_base_swa"}
    assert IK_REQUIRED["mistral4"] >= {"leading_dense_block_count", "expert_weights_scale"}


def test_a_file_without_a_key_ik_requires_is_refused_there(tmp_path: Path) -> None:
    path = write_graph_model("glm4moe", "a", tmp_path / "m.gguf", keys=(("glm4moe.expert_shared_count", None, "u32"),))
    inv = load_inventory(path)
    line = ["-c", "4096", "-ngl", "99"]
    ik = engine("ik_llama.cpp", "0.1.5")
    ex = explain(inv, ik, line, gpus=["CUDA0"])
    assert [r.split(" (")[0] for r in ex.load_refusals] == ["ik_llama.cpp 0.1.5 requires glm4moe.expert_shared_count"]
    assert "--override-kv" in ex.load_refusals[0]
    est = estimate_explained(ex, read_settings(line, ik))
    assert not est.complete and any("requires glm4moe.expert_shared_count" in n for n in est.notes), est.notes
    assert not explain(inv, engine("llama.cpp"), [*line, "-fit", "off"], gpus=["CUDA0"]).load_refusals
    # given by --override-kv: loaded; memory is refused for the override, not for the file
    fixed = [*line, "--override-kv", "glm4moe.expert_shared_count=int:1"]
    ex = explain(inv, ik, fixed, gpus=["CUDA0"])
    assert not ex.load_refusals
    notes = estimate_explained(ex, read_settings(fixed, ik)).notes
    assert not any("requires glm4moe" in n for n in notes) and any("--override-kv glm4moe" in n for n in notes)


def test_keys_a_source_did_not_record_are_not_missing(tmp_path: Path) -> None:
    # a manifest before version 3 records no `{arch}.*` key names (arch_keys None): nothing is known missing
    inv = load_inventory(write_graph_model("glm4moe", "a", tmp_path / "m.gguf"))
    assert ik_key_stops(inv) == ()
    assert ik_key_stops(dataclasses.replace(inv, metadata=dataclasses.replace(inv.metadata, arch_keys=()))) != ()
    assert ik_key_stops(dataclasses.replace(inv, metadata=dataclasses.replace(inv.metadata, arch_keys=None))) == ()
