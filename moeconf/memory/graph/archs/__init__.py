"""Each architecture's graph as a composition of the blocks (`blocks.GraphContext`): one module per architecture in this
folder, mirroring its src/models/<arch>.cpp in the pinned llama.cpp, with `build(g, facts)` and, where present, `ARCH`,
`MEMORY` and `TRAITS` (`common.py`; docs/memory.md, "The engine's graph", says what each means and how a module is
named). The registry below finds the modules itself and is the only place an architecture's name is read. A module is
imported when its architecture is first asked for (`COMPOSITIONS[arch]`, `traits(arch)`, `arch in ARCHS`): one command
reads one model, and importing every module would cost it about 0.04 s; listing the registry (iterating it, its length)
imports them all, in module order. Modules whose names start with an underscore hold what several compositions share."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from moeconf.memory.graph.archs.common import Build, Facts, Memory, Swa, Traits

__all__ = ["ARCHS", "COMPOSITIONS", "Build", "Composition", "Facts", "Lazy", "Memory", "Swa", "Traits", "traits"]

V = TypeVar("V")


@dataclass(frozen=True)
class Composition:
    arch: str
    build: Build
    memory: Memory | None
    module: str
    traits: Traits


class Lazy(MutableMapping[str, V]):
    """A dict by architecture filled on demand: `one(arch)` gives an architecture's value (KeyError where it has
    none), `every()` every architecture that may have one, in order. A lookup or `in` computes that one key;
    iterating or `len` computes them all and lists them in `every()`'s order (then any key set that it does not
    name), and computes nothing after. Keys set or deleted (a test's monkeypatch) stay as set, as in a dict (a key
    deleted and set again comes last)."""

    def __init__(self, one: Callable[[str], V], every: Callable[[], Iterable[str]]) -> None:
        self._one, self._every = one, every
        self._d: dict[str, V] = {}
        self._gone: set[str] = set()
        self._listed = False

    def __getitem__(self, key: str) -> V:
        if key not in self._d:
            if self._listed or key in self._gone or not isinstance(key, str):
                raise KeyError(key)
            self._d[key] = self._one(key)
        return self._d[key]

    def __setitem__(self, key: str, value: V) -> None:
        self._d[key] = value
        self._gone.discard(key)

    def __delitem__(self, key: str) -> None:
        self[key]  # raises KeyError where there is none
        del self._d[key]
        self._gone.add(key)

    def _all(self) -> dict[str, V]:
        if not self._listed:
            self._d = {key: self[key] for key in self._every() if key in self} | self._d
            self._listed = True
        return self._d

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._all()))

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"Lazy({dict(self.items())!r})"


@cache
def _modules() -> tuple[str, ...]:
    """The composition modules' names, in order (the folder's listing: no module imported)."""
    names = (f[:-3] for d in __path__ for f in os.listdir(d) if f.endswith(".py"))
    return tuple(sorted(n for n in names if n.isidentifier() and not n.startswith("_") and n != "common"))


def _composition(name: str) -> Composition:
    """The composition module `name`'s, imported and checked."""
    mod = importlib.import_module(f"{__name__}.{name}")
    got, build, memory = getattr(mod, "ARCH", name), getattr(mod, "build", None), getattr(mod, "MEMORY", None)
    traits = getattr(mod, "TRAITS", Traits())
    if not isinstance(got, str) or not callable(build) or not (memory is None or isinstance(memory, Memory)) \
            or not isinstance(traits, Traits):
        raise AssertionError(f"{mod.__name__}: a composition module defines build(g, facts) and optionally ARCH "
                             "(a str), MEMORY (a common.Memory) and TRAITS (a common.Traits)")
    if got.replace("-", "_") != name:
        raise AssertionError(f"{mod.__name__}: a composition module is named after its ARCH, '-' spelled '_' "
                             f"({got!r} in {got.replace('-', '_')}.py)")
    return Composition(got, build, memory, mod.__name__, traits)


def _load(arch: str) -> Composition:
    """`arch`'s composition, its module imported (KeyError: no module composes it)."""
    name = arch.replace("-", "_")
    composition = _composition(name) if name in _modules() else None
    if composition is None or composition.arch != arch:  # or the module's is another spelling (glm-dsa's)
        raise KeyError(arch)
    return composition


# architecture -> its composition (src/models/<arch>.cpp); listing it imports every module, in module order (each
# named after its architecture: none is composed twice)
COMPOSITIONS: Lazy[Composition] = Lazy(_load, lambda: [_composition(name).arch for name in _modules()])
ARCHS: Lazy[Build] = Lazy(lambda a: COMPOSITIONS[a].build, lambda: list(COMPOSITIONS))


def traits(arch: str) -> Traits:
    """What the memory model reads about `arch` beyond its GGUF (`common.Traits`): its module's
    `TRAITS`, the defaults where it declares none or has no module."""
    c = COMPOSITIONS.get(arch)
    return c.traits if c is not None else Traits()
