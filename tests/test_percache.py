"""moeconf.model.percache: values derived from one inventory are computed once per inventory
object, never handed to another (even an equal one, or one at a reused address)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest

import moeconf.model.percache as percache
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"


def _inventory(name: str) -> Inventory:
    return load_inventory(MODELS / f"{name}.manifest.json")


def _counting() -> tuple[list[int], Callable[[Inventory, int], int]]:
    calls: list[int] = []

    @percache.per_inventory
    def tensors(inv: Inventory, scale: int) -> int:
        calls.append(scale)
        return len(inv.tensors) * scale

    return calls, tensors


def test_computed_once_per_inventory_and_arguments() -> None:
    calls, tensors = _counting()
    inv = _inventory("qwen3-30b-a3b")
    assert tensors(inv, 1) == tensors(inv, 1) == len(inv.tensors)
    assert tensors(inv, 2) == 2 * len(inv.tensors)
    assert calls == [1, 2]


def test_an_equal_inventory_is_another_one() -> None:
    calls, tensors = _counting()
    a = _inventory("qwen3-30b-a3b")
    b = _inventory("qwen3-30b-a3b")
    tensors(a, 1)
    tensors(b, 1)
    assert calls == [1, 1]


def test_a_reused_address_is_not_a_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    # every object at one address: only the weak reference tells inventories apart
    monkeypatch.setattr(percache, "id", lambda _obj: 1, raising=False)
    calls, tensors = _counting()
    small = _inventory("qwen3-30b-a3b")
    assert tensors(small, 1) == len(small.tensors)
    n_small = len(small.tensors)
    del small
    gc.collect()
    big = _inventory("deepseek-v3")
    assert tensors(big, 1) == len(big.tensors) != n_small
    assert len(calls) == 2
