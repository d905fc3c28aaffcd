"""Each architecture's graph as a composition of the blocks (`blocks.GraphContext`), one module
per architecture in this folder, mirroring its src/models/<arch>.cpp in the pinned llama.cpp.

A module names its architecture (`ARCH`, as the GGUF's general.architecture spells it) and gives its
`build(g, facts)`: one `common.Decoder` row where the layers are the classic decoder's (a norm,
attention through the KV cache, a dense or MoE FFN, the residuals), a function where they differ.
`FLASH_ATTN_OFF = True` says that the engines turn flash attention off for the architecture whatever
-fa says (llama_init_from_model). `MEMORY` (a `common.Memory`), where present, says that `estimate`
takes the architecture's compute from this graph and what that was checked on. The registry below
finds the modules itself: adding an architecture is adding its module (plus its test data: the
engine's recorded graphs and figures), and this registry is the only place an architecture's name is
read. Modules whose names start with an underscore hold what several compositions share.

What a layer holds (biases, Q/K norms, a shared expert and its gate, a selection bias, fused
experts, rope factors) is read from the model's tensors, as the engine's loader creates them;
what the graph does with them (the gating function, whether the chosen weights are normalised,
which scales and clamps run) is the composition's, or the GGUF key the architecture's loader reads
(`Facts`: a float key's presence stands for a value that is not 0 or 1)."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

from moeconf.memory.graph.archs.common import Build, Facts, Memory

__all__ = ["ARCHS", "COMPOSITIONS", "FA_FORCED_OFF", "Build", "Composition", "Facts", "Memory",
           "flash_attn_forced_off"]


@dataclass(frozen=True)
class Composition:
    arch: str
    build: Build
    memory: Memory | None
    module: str
    flash_attn_off: bool = False


def _discover() -> dict[str, Composition]:
    out: dict[str, Composition] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        arch, build, memory = getattr(mod, "ARCH", None), getattr(mod, "build", None), getattr(mod, "MEMORY", None)
        if not isinstance(arch, str) or not callable(build) or not (memory is None or isinstance(memory, Memory)):
            raise AssertionError(f"{mod.__name__}: a composition module defines ARCH (a str), build(g, facts) "
                                 "and optionally MEMORY (a common.Memory)")
        if arch in out:
            raise AssertionError(f"{arch}: composed twice ({out[arch].module}, {mod.__name__})")
        out[arch] = Composition(arch, build, memory, mod.__name__, getattr(mod, "FLASH_ATTN_OFF", False) is True)
    return out


COMPOSITIONS: dict[str, Composition] = _discover()
# architecture -> its composition (src/models/<arch>.cpp)
ARCHS: dict[str, Build] = {a: c.build for a, c in COMPOSITIONS.items()}
# the architectures for which the engines force flash attention off whatever -fa says (llama.cpp's
# src/llama-context.cpp and ik_llama.cpp's src/llama.cpp, llama_init_from_model); both then refuse a
# quantized V cache
FA_FORCED_OFF: frozenset[str] = frozenset(a for a, c in COMPOSITIONS.items() if c.flash_attn_off)


def flash_attn_forced_off(arch: str) -> bool:
    return arch in FA_FORCED_OFF
