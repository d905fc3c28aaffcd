"""The Placement IR: for every tensor of a model, the device the engine will put it on, and why.

The compiler goes plan -> Placement -> regexes; `explain` and the linter go regexes -> Placement
(by simulating the engine). A Placement is plain data and compares by value.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from moeconf.engines import HOST, Engine
from moeconf.engines.simulate import output_layer_tensors
from moeconf.engines.tied import TIED_OUTPUT_ARCHS
from moeconf.model.inventory import Inventory, Tensor

# how the second copy of `token_embd` (a tied output) is named in placements and reports
TIED_OUTPUT = "token_embd.weight (output copy)"
_REPACKED_AVX2 = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})


@dataclass(frozen=True)
class Placement:
    """`devices[name]` is a buffer-type name (`CPU`, `CUDA0`, `RPC0[10.0.0.2:50052]`), or None
    for a tensor the engine never creates (a glm4moe nextn block on mainline).
    `defaults[name]` is where the engine puts it when no rule matches; `reasons[name]` says what
    decided (`default`, or the rule)."""

    inventory: Inventory = field(compare=False, repr=False)
    engine: Engine
    devices: dict[str, str | None]
    defaults: dict[str, str | None] = field(compare=False, repr=False)
    reasons: dict[str, str] = field(compare=False, repr=False)

    def device(self, name: str) -> str | None:
        return self.devices[name]

    def created(self, t: Tensor) -> bool:
        return self.devices[t.name] is not None

    def overridden(self) -> list[Tensor]:
        """Tensors whose device differs from the engine default."""
        return [t for t in self.inventory.tensors if self.devices[t.name] != self.defaults[t.name]]

    def bytes_by_device(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for t in self.inventory.tensors:
            d = self.devices[t.name]
            out[d if d is not None else "(not loaded)"] += t.nbytes
        tied = self.tied_output()
        if tied is not None:
            out[tied] += self.inventory.by_name["token_embd.weight"].nbytes
        return dict(out)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {t.name: self.devices[t.name] for t in self.inventory.tensors}
        tied = self.tied_output()
        if tied is not None:
            out[TIED_OUTPUT] = tied
        return out

    def tied_output(self) -> str | None:
        """Where the engine puts the second copy of `token_embd` it creates as the output of a
        tied-output model (engines/tied.py); None where it creates none: the file has an
        `output.weight`, or the copy would land on the buffer type already holding `token_embd`
        (a GPU's, where `-ot` sent token_embd there). On the CPU the copy is counted: the engine
        makes it in a repacked buffer where the host has one for the type (AVX2, AMX hosts), an
        upper bound on a host without.
        The copy is the output layer's tensor (the loader reads a duplicated `token_embd` as
        LLM_TENSOR_OUTPUT: the output layer's `-ngl` default, which every tensor the loader puts in
        the output layer shares), unless the `-ot` item that placed `token_embd` (it matches the
        copy by the same name) sent it elsewhere."""
        inv = self.inventory
        emb = "token_embd.weight"
        if "output.weight" in inv.by_name or emb not in inv.by_name or inv.arch not in TIED_OUTPUT_ARCHS:
            return None
        placed = self.devices.get(emb)
        overridden = placed != self.defaults.get(emb) or not self.reasons.get(emb, "default").startswith("default")
        if overridden:
            dev = placed
        else:
            # a model with a tied output and nothing else in the output layer: no engine loader
            # makes one (each creates an output norm there); the copy is then not counted
            out = output_layer_tensors(inv, self.engine)
            dev = self.defaults.get(out[0], placed) if out else placed
        if dev == HOST:
            # on the CPU the output's matrix multiply picks the CPU's extra buffer types first
            # (llama-model-loader.cpp, select_weight_buft over the CPU list), so the copy is made
            # in CPU_REPACK where the host repacks its type, beside token_embd's plain CPU buffer:
            # on an AVX2 host Q4_0, Q4_K, IQ4_NL and MXFP4 with rows in whole groups of 8
            # (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type). Measured: ERNIE-4.5's
            # Q4_K token_embd (103,424 rows), -ngl 0: host weights 142 MiB more; Hunyuan-A13B's
            # (128,167 rows): none. An AMX host may repack more types (not modelled here)
            # (llama.cpp; ik_llama.cpp's CPU buffer types are not modelled here: no copy counted)
            t = inv.by_name[emb]
            repacked = t.type in _REPACKED_AVX2 and len(t.shape) > 1 and t.shape[1] % 8 == 0
            return dev if repacked and placed == HOST and self.engine.name == "llama.cpp" else None
        return None if dev is None or dev == placed else dev
