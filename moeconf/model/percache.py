"""A cache of values computed from one inventory: a fit or a search measures hundreds of
placements of the same model, and what each measure derives from the inventory alone (its
tensors' homes, sizes, geometry) is the same every time."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from functools import wraps
from typing import Concatenate, ParamSpec, TypeVar

from moeconf.model.inventory import Inventory

P = ParamSpec("P")
R = TypeVar("R")
_KEEP = 8  # inventories remembered per function (a process rarely holds more than one or two)


def per_inventory(fn: Callable[Concatenate[Inventory, P], R]) -> Callable[Concatenate[Inventory, P], R]:
    """Cache `fn(inv, *args)` by the inventory object itself (a weak reference: an id alone could
    be reused once the inventory is gone) and the other arguments, which must be hashable. For
    values that depend on nothing else than the arguments: the inventory is immutable."""
    cache: dict[tuple[int, tuple[Hashable, ...]], tuple[weakref.ReferenceType[Inventory], R]] = {}

    @wraps(fn)
    def cached(inv: Inventory, /, *args: P.args, **kwargs: P.kwargs) -> R:
        key = (id(inv), (*args, *sorted(kwargs.items())))
        hit = cache.get(key)
        if hit is not None and hit[0]() is inv:
            return hit[1]
        value = fn(inv, *args, **kwargs)
        if len(cache) >= _KEEP:
            cache.clear()
        cache[key] = (weakref.ref(inv), value)
        return value

    return cached
