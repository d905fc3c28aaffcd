"""What the compiler gives back (`Compiled`): the plan, the model, where each tensor goes, the
verified `-ot` items and the engine's argv. Below both the compiler (`moeconf.compile`, which
builds one) and the output forms (`moeconf.emitting`, which render and read one back), so the
compiler can verify its argv with `emitting.readback` without an import circle."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from moeconf.engines import Engine
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement
from moeconf.plan import Plan
from moeconf.resolve import Diagnostic
from moeconf.synth.rules import Synthesis

if TYPE_CHECKING:
    from moeconf.memory import MemoryEstimate


@dataclass(frozen=True)
class Compiled:
    """Everything a target needs: the plan, the model, where each tensor goes, the verified
    `-ot` items and the engine's argv (binary first)."""

    plan: Plan
    engine: Engine
    inventory: Inventory
    placement: Placement
    synthesis: Synthesis
    argv: tuple[str, ...]
    warnings: tuple[Diagnostic, ...]

    @property
    def ot(self) -> str:
        """The comma-joined `-ot` value ('' when the defaults already hold)."""
        return self.synthesis.value

    @cached_property
    def memory(self) -> MemoryEstimate:
        """Memory per device of the compiled command line (weights, KV, compute, reserve)."""
        from moeconf.explanation import explain
        from moeconf.fill import plan_settings
        from moeconf.sizing import estimate_explained

        ex = explain(self.inventory, self.engine, list(self.argv), gpus=list(self.plan.config.engine.gpus))
        return estimate_explained(ex, plan_settings(self.plan, self.engine))

    def budgets(self) -> dict[str, int]:
        """The plan's `[budget]` per buffer type (empty without one)."""
        from moeconf.fill import budgets
        from moeconf.resolve import resolve_device

        rule = self.plan.rules[0] if self.plan.rules else None
        if rule is None:
            return {}
        return budgets(self.plan, lambda w: resolve_device(self.plan, self.engine, rule, w, rule.device_span))

    def json(self) -> dict[str, object]:
        return {
            "engine": self.engine.name,
            "engine_version": self.engine.version,
            "model": self.inventory.source,
            "ot": self.ot,
            "items": [it.render() for it in self.synthesis.items],
            "argv": list(self.argv),
            "placement": self.placement.as_json(),
            "bytes_by_device": self.placement.bytes_by_device(),
            "memory": self.memory.json(),
            "warnings": [str(w) for w in self.warnings],
        }
