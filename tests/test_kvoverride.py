"""`--override-kv` (engines/kvoverride.py): an override of a key that sizes anything makes memory
incomplete with a note naming it; the tokenizer's, `general.*` and the graph's scalar keys stay
modelled; items are split as each engine splits them; a malformed item is an error."""

from __future__ import annotations

import pytest

import moeconf.memory.families as families
from moeconf.cli import main
from moeconf.engines import engine as engine_from_name
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.conftest import EXAMPLES

QWEN = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
GPT_OSS = str(EXAMPLES / "models" / "gpt-oss-20b.manifest.json")
BASE = ["llama-server", "-c", "8192", "-ngl", "99", "-ot", "exps=CPU"]


def _estimate(value: str, engine: str = "llama.cpp", model: str = QWEN) -> MemoryEstimate:
    inv = load_inventory(model)
    eng = engine_from_name(engine)
    argv = [*BASE, "--override-kv", value]
    return estimate_explained(explain(inv, eng, argv), read_settings(argv, eng))


def _base(engine: str = "llama.cpp", model: str = QWEN) -> MemoryEstimate:
    inv = load_inventory(model)
    eng = engine_from_name(engine)
    return estimate_explained(explain(inv, eng, BASE), read_settings(BASE, eng))


@pytest.mark.parametrize(("model", "item"), [
    (QWEN, "qwen3moe.expert_used_count=int:16"), (QWEN, "qwen3moe.block_count=int:40"),
    (QWEN, "qwen3moe.context_length=int:131072"), (QWEN, "qwen3moe.attention.head_count_kv=int:8"),
    (QWEN, "general.architecture=str:qwen3"), (QWEN, "qwen3moe.expert_group_count=int:4"),
    (QWEN, "split.count=int:2"), (GPT_OSS, "gpt-oss.attention.sliding_window=int:4096"),
])
def test_an_override_that_sizes_anything_is_refused(model: str, item: str) -> None:
    est = _estimate(item, model=model)
    assert not est.complete
    assert any(n.startswith(f"memory is not modelled with --override-kv {item}") for n in est.notes), est.notes


@pytest.mark.parametrize("item", [
    "tokenizer.ggml.add_bos_token=bool:false", "general.name=str:mine", "qwen3moe.rope.freq_base=float:2000000",
    "qwen3moe.attention.layer_norm_rms_epsilon=float:0.000001",
    # keys the pinned qwen3moe loader does not read (moeconf/engines/archkeys.py), on either engine
    "qwen3moe.expert_weights_norm=bool:false", "qwen3moe.full_attention_interval=int:2",
])
def test_an_override_of_no_size_changes_nothing(item: str) -> None:
    est, base = _estimate(item), _base()
    assert est.complete, est.notes
    assert {d: m.total for d, m in est.devices.items()} == {d: m.total for d, m in base.devices.items()}


def test_items_are_split_as_each_engine_splits_them() -> None:
    value = "qwen3moe.rope.freq_base=float:1000000,qwen3moe.expert_used_count=int:16"
    # llama.cpp: a comma-separated list, the second item sizes the experts' buffers
    assert not _estimate(value).complete
    # ik_llama.cpp: one item per flag, the rest of the string is the first value's (atof stops at the comma)
    assert _estimate(value, "ik_llama.cpp").complete


@pytest.mark.parametrize("item", ["", "qwen3moe.expert_used_count", "k=int8:1", "k=bool:yes", "k=str:" + "x" * 128,
                                  "k" * 128 + "=int:1"])
def test_a_malformed_item_is_an_error_the_engine_stops_on(item: str) -> None:
    est = _estimate(item)
    assert any("stops on --override-kv" in p for p in est.problems), est.problems


def test_without_the_check_the_table_would_be_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(families, "unmodelled_overrides", lambda _o, _a, _e=None: [])
    assert _estimate("qwen3moe.expert_used_count=int:16").complete


def test_fit_refuses_an_override_that_sizes_the_experts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", QWEN, "--gpu", "24GiB", "--", "--override-kv", "qwen3moe.expert_used_count=int:16"]) != 0
    assert "--override-kv qwen3moe.expert_used_count=int:16" in capsys.readouterr().err
    assert main(["fit", QWEN, "--gpu", "24GiB", "--", "--override-kv", "tokenizer.ggml.add_bos_token=bool:false"]) == 0
