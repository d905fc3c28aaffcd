"""MiniMax-Text-01 (`minimax-01`): its lightning-attention layers as llama.cpp marks and sizes them
(memory/recurrent.py, the "lightning" kind: src/models/minimax-01.cpp `load_arch_hparams`, the hybrid
memory's filters in src/llama-model.cpp `create_memory`, src/llama-hparams.cpp `n_embd_r`/`n_embd_s`),
on the sparse full-size layout whose `-fitp` figures tests/test_memory_graph_layouts.py holds."""

from __future__ import annotations

import dataclasses

import pytest

from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory import recurrent as rec
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests import graph_oracle

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def inv(tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    path = tmp_path_factory.mktemp("minimax01") / "minimax-text-01.gguf"
    write_layout(LAYOUTS["minimax-text-01"], path)
    return load_inventory(path)


def test_softmax_every_eighth_layer_without_the_interval_key(inv: Inventory) -> None:
    """The converter writes no interval: the loader's default is 8 (Qwen3-Next's default, 4, would make
    layer 3 a softmax layer)."""
    assert "full_attention_interval" not in dict(inv.metadata.hparams)
    assert sorted(set(range(80)) - rec.recurrent_layers(inv)) == list(range(7, 80, 8))
    hp = (*inv.metadata.hparams, ("full_attention_interval", 4))
    alt = dataclasses.replace(inv, metadata=dataclasses.replace(inv.metadata, hparams=tuple(sorted(hp))))
    assert 3 not in rec.recurrent_layers(alt) and 7 not in rec.recurrent_layers(alt)


def test_the_state_is_heads_of_key_length_squared(inv: Inventory) -> None:
    """64 heads of 128 x 128 F32 per sequence and no conv state; the head width is the key length (128),
    not hidden / heads (96)."""
    shape = rec.shape(inv)
    assert shape is not None and shape.n_embd_r == 0 and shape.n_embd_s == 128 * 128 * 64
    assert rec.state_bytes(inv, 1) == 4 * MiB and rec.state_bytes(inv, 4) == 16 * MiB
    est = graph_oracle.estimate_line(inv, "-c 32768 -ngl 999")
    # 10 softmax layers' K and V (8 heads of 128, F16) plus 70 lightning states
    assert est.devices[graph_oracle.device("rpc0")].kv == 10 * 32768 * 2 * 8 * 128 * 2 + 70 * 4 * MiB


def test_nkvo_is_refused_not_guessed(inv: Inventory) -> None:
    est = graph_oracle.estimate_line(inv, "-c 32768 -ngl 999 -nkvo")
    assert not est.complete and any("-nkvo" in n for n in est.notes)
