"""Memory for a simulated launch: the glue between `moeconf.explanation` (what a command line
places where) and `moeconf.memory` (what a placement costs). It sits above both, so `memory/`
reads a Placement and settings and never an Explanation."""

from __future__ import annotations

from moeconf.engines.settings import MemorySettings
from moeconf.explanation import Explanation
from moeconf.memory.estimate import MemoryEstimate, estimate, pipeline_parallel


def estimate_explained(ex: Explanation, settings: MemorySettings) -> MemoryEstimate:
    """Memory for a simulated command line (`moeconf.explanation.explain`), with the engine's
    pipeline parallelism decided from the same invocation."""
    return estimate(ex.placement, settings, pipeline=explained_pipeline(ex, settings))


def explained_pipeline(ex: Explanation, settings: MemorySettings) -> bool:
    """Whether the engine runs a simulated command line with pipeline parallelism (`pipeline_parallel`)."""
    inv = ex.invocation
    sm = inv.split_mode.text if inv.split_mode else None
    return pipeline_parallel(ex.placement, len(ex.accelerators), inv.n_gpu_layers(), sm, settings, bool(ex.items))
