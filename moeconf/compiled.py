"""What the compiler gives back (`Compiled`): the plan, the model, where each tensor goes, the
verified `-ot` items and the engine's argv. Below both the compiler (`moeconf.compile`, which
builds one) and the output forms (`moeconf.emitting`, which render and read one back), so the
compiler can verify its argv with `emitting.readback` without an import circle."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from moeconf.engines import Engine
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement
from moeconf.plan import Plan
from moeconf.resolve import Diagnostic
from moeconf.synth.rules import Synthesis

if TYPE_CHECKING:
    from moeconf.explanation import Explanation
    from moeconf.fill import FillMeasure
    from moeconf.memory import MemoryEstimate, MemorySettings


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
    # the argv as `explain` reads it (the compiler's read-back: simulated once), and a fill's last
    # measure of its placement (`memory` takes it where the argv reads back to what it measured)
    explanation: Explanation | None = field(default=None, compare=False, repr=False)
    measured: FillMeasure | None = field(default=None, compare=False, repr=False)

    @property
    def ot(self) -> str:
        """The comma-joined `-ot` value ('' when the defaults already hold)."""
        return self.synthesis.value

    @cached_property
    def memory(self) -> MemoryEstimate:
        """Memory per device of the compiled command line (weights, KV, compute, reserve)."""
        from moeconf.fill import plan_settings
        from moeconf.sizing import estimate_explained

        ex = self.explained()
        settings = plan_settings(self.plan, self.engine)
        return self.measured_memory(ex, settings) or estimate_explained(ex, settings)

    def explained(self) -> Explanation:
        """The argv as `explain` reads it."""
        from moeconf.explanation import explain

        if self.explanation is not None:
            return self.explanation
        return explain(self.inventory, self.engine, list(self.argv), gpus=list(self.plan.config.engine.gpus))

    def measured_memory(self, ex: Explanation, settings: MemorySettings) -> MemoryEstimate | None:
        """The fill's own measure of the placement (`fill.FillMeasure`) where the command line `ex`
        reads back to the same placement, settings and pipeline parallelism: the estimate it
        would make is that one. None otherwise."""
        from moeconf.sizing import explained_pipeline

        m = self.measured
        if m is None or m.settings != settings:
            return None
        got, want = ex.placement, m.placement
        if (got.inventory is not want.inventory or got.engine != want.engine or got.devices != want.devices
                or got.defaults != want.defaults or explained_pipeline(ex, settings) != m.pipeline):
            return None
        return m.mem

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
