"""What the memory model covers, as data: per architecture, the GGUF keys whose memory effect it models, the
engines it was checked against, and the cases it refuses with a note naming the architecture or the key
(`unmodelled`): a clear "not modelled for X" beats a confident wrong number. The rules: docs/memory-architectures.md,
"Keys each architecture's loader reads"; ik_llama.cpp's support is memory/ikarchs.py's."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

import moeconf.memory.ikarchs as _ikarchs
import moeconf.memory.indexer as _indexer
from moeconf.engines.archkeys import FIELDS
from moeconf.engines.ikkeys import ik_key_stops
from moeconf.memory.archgraph import unmodelled_structure
from moeconf.memory.graph.archs import COMPOSITIONS, Lazy
from moeconf.memory.keys import NO_MEMORY_EFFECT, neutral, read_by_loader
from moeconf.model.inventory import Inventory
from moeconf.model.required import ik_load_refusals


@dataclass(frozen=True)
class ArchMemory:
    """A modelled architecture: the keys it reads beyond `NO_MEMORY_EFFECT`, its engines, what it was checked on."""

    keys: frozenset[str]
    engines: frozenset[str]
    checked: str


def _modelled(arch: str) -> ArchMemory:
    """`arch`'s entry, from its composition's `MEMORY` (asking imports that composition only): modelled
    on llama.cpp, and on ik_llama.cpp where memory/ikarchs.py models it in full (`MODELLED_IN_FULL`)."""
    c = COMPOSITIONS[arch]
    if c.memory is None:
        raise KeyError(arch)
    engines = {"llama.cpp", _ikarchs.ENGINE} if arch in _ikarchs.MODELLED_IN_FULL else {"llama.cpp"}
    return ArchMemory(c.memory.keys, frozenset(engines), c.memory.checked_on)


# every modelled architecture: each composition with a `MEMORY` (only those asked for are imported)
MODELLED: Final[Lazy[ArchMemory]] = Lazy(_modelled, lambda: list(COMPOSITIONS))


_ROUTED_KINDS: Final = frozenset({"FFN_GATE_EXPS", "FFN_UP_EXPS", "FFN_DOWN_EXPS", "FFN_GATE_UP_EXPS"})


def lacking_tensor_kinds(arch: str) -> tuple[str, ...]:
    """The GGUF names of the tensor kinds llama.cpp's loader creates for `arch` that no modelled architecture has
    (moeconf.model.nametable); empty where only the composition of the graph is missing."""
    from moeconf.model import nametable

    covered = {k for a in MODELLED for k in nametable.ML_ARCH_TENSORS.get(a, ())}
    names = {kind: base for base, kinds in {**nametable.BLOCK_TENSORS, **nametable.GLOBAL_TENSORS}.items()
             for kind in kinds}
    return tuple(sorted(names.get(k, k.lower()) for k in set(nametable.ML_ARCH_TENSORS.get(arch, ())) - covered))


def routed_expert_archs() -> tuple[str, ...]:
    """Every architecture whose llama.cpp loader creates routed-expert tensors (moeconf.model.nametable)."""
    from moeconf.model import nametable

    return tuple(sorted(a for a, kinds in nametable.ML_ARCH_TENSORS.items() if _ROUTED_KINDS & set(kinds)))


# Architectures with routed experts in llama.cpp's tensor table that llama-server does not serve as a text model
# (memory is llama-server's): why, for `unmodelled_architecture` and docs (scripts/gen-arch-table.py)
NOT_SERVED: Final[dict[str, str]] = {
    "llada-moe": "diffusion model (llama.cpp's llm_arch_is_diffusion): llama-diffusion-cli, not llama-server",
    "rnd1": "diffusion model (llama.cpp's llm_arch_is_diffusion): llama-diffusion-cli, not llama-server",
    "nomic-bert-moe": "embedding model (no causal decoding)",
    "llama-embed": "embedding model (no causal decoding)",
    "deepseek2-ocr": "OCR model: its text decoder runs behind a vision encoder",
    "dflash": "speculative-decoding drafter, loaded beside a target model",
}
# ... and those whose loader never creates the routed experts the table names (tests/engine/test_placement_homes.py)
NO_ROUTED_EXPERTS: Final[dict[str, str]] = {
    "ernie4_5": ("its loader (src/models/ernie4-5.cpp) creates routed experts only for ernie4_5-moe; the engine "
                 "refuses an ernie4_5 file with experts (`blk.1.ffn_gate.weight` not found: ERNIE-4.5-21B-A3B's "
                 "layout written as ernie4_5)"),
    "lfm2": ("its loader (src/models/lfm2.cpp) sets the leading dense blocks to the block count: every block is "
             "dense; routed experts are lfm2moe's"),
    "paddleocr": ("OCR model (PaddleOCR-VL, whose text decoder ERNIE-4.5-0.3B is dense); its loader is ernie4_5's "
                  "(src/models/models.h), which creates routed experts only for ernie4_5-moe: the engine refuses a "
                  "paddleocr file with experts (`blk.1.ffn_gate.weight` not found: ERNIE-4.5-21B-A3B's layout "
                  "written as paddleocr)"),
}
# both: the architectures no MoE text model of which llama-server serves (the tables list them as not applicable)
NOT_APPLICABLE: Final[dict[str, str]] = {**NOT_SERVED, **NO_ROUTED_EXPERTS}


def unmodelled_architecture(arch: str, engine: str = "llama.cpp") -> str:
    """Why an architecture's memory is not modelled, naming what it lacks and what to do instead."""
    lacking = lacking_tensor_kinds(arch)
    if arch in NOT_SERVED:
        what = (f"llama-server does not serve it as a text model ({NOT_SERVED[arch]}), and moeconf models the memory "
                "of MoE text models as llama-server runs them")
    elif arch in NO_ROUTED_EXPERTS:
        what = "a dense architecture: " + NO_ROUTED_EXPERTS[arch] + "; moeconf models the memory of MoE models"
    else:
        what = (f"its graph has blocks moeconf does not build yet (tensors no modelled architecture has: "
                f"{', '.join(lacking)})" if lacking else
                "moeconf has no composition of its graph yet (every kind of tensor it has is modelled for another "
                "architecture)")
    measure = ("run llama.cpp's `llama-fit-params -fitp on` with the same flags" if engine == "llama.cpp" else
               f"load it in {engine} and read the buffer sizes it logs")
    return (f"memory is not modelled for the {arch!r} architecture: {what}. KV cache and compute are not computed, "
            "and weights are only the file's tensors as placed (placement itself follows the engine's own tables). "
            f"To size memory, {measure}")


def unmodelled(inv: Inventory, engine: str, overridden: Collection[str] = ()) -> list[str]:
    """Why this model's memory on `engine` is not modelled (empty: it is): its architecture, or
    each `{arch}.*` key of the file the model does not read and that may change memory (`overridden`: the keys
    --override-kv gives the loader, not missing there)."""
    arch = inv.arch
    # ik's loader stops on a file holding a tensor it never creates, or lacking a key it requires
    stops = [*ik_load_refusals(inv), *ik_key_stops(inv, overridden)] if engine == _ikarchs.ENGINE else []
    # ik_llama.cpp on the newer architectures: weights and KV modelled here, compute by ikarchs' measured margins
    if _ikarchs.kv_only(arch, engine):
        return stops or _ikarchs.unmodelled(inv, NO_MEMORY_EFFECT | _not_read(inv, engine), MODELLED[arch].keys) \
            + unmodelled_structure(inv)
    spec = MODELLED.get(arch)
    if spec is None:
        return [unmodelled_architecture(arch, engine)]
    if engine not in spec.engines:
        return [f"memory is not modelled for {arch!r} on {engine}{_ikarchs.why_not(arch, engine)}"]
    return (stops or unread_keys(inv, engine, spec.keys) or _indexer.indexer_table_unmodelled(inv)
            or unmodelled_structure(inv))


def _not_read(inv: Inventory, engine: str) -> frozenset[str]:
    """The file's `{arch}.*` keys that `engine`'s loader does not read for its architecture."""
    read = read_by_loader(inv.arch, engine)
    return frozenset() if read is None else frozenset(inv.metadata.arch_keys or ()) - read


def unread_keys(inv: Inventory, engine: str, handled: frozenset[str]) -> list[str]:
    """A note per `{arch}.*` key of the file that `engine`'s loader reads for the architecture
    and the memory model does not handle (beyond keys.NO_MEMORY_EFFECT and `handled`)."""
    arch = inv.arch
    passed = NO_MEMORY_EFFECT | handled | _not_read(inv, engine)
    nxt = ("measure this model with llama.cpp's llama-fit-params -fitp on" if engine == "llama.cpp"
           else "its KV cache and compute are not computed")
    why = []
    for k in inv.metadata.arch_keys or ():
        if k in passed or neutral(k, inv):
            continue
        fields = FIELDS.get(k, ())
        into = f" (into {', '.join(fields)})" if fields and engine == "llama.cpp" else ""
        why.append(f"memory is not modelled for {arch}.{k}: the {engine} loader of {arch!r} reads it{into} and "
                   f"moeconf does not model what it changes; {nxt}")
    return why
