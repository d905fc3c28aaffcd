"""Does it fit? Memory per device (weights, KV cache, compute, reserve) for a placement, as the
engines compute it. Sits above `model/` and `engines/`, below the reports and the CLI."""

from __future__ import annotations

from moeconf.explanation import Explanation
from moeconf.memory.estimate import HOST, DeviceMemory, MemoryEstimate, estimate, pipeline_parallel, weight_bytes
from moeconf.memory.settings import DEFAULT_RESERVE, MemorySettings, cache_types, parse_size, read_settings

__all__ = [
    "DEFAULT_RESERVE", "HOST", "DeviceMemory", "MemoryEstimate", "MemorySettings", "cache_types", "estimate",
    "estimate_explained", "parse_size", "pipeline_parallel", "read_settings", "weight_bytes",
]


def estimate_explained(ex: Explanation, settings: MemorySettings) -> MemoryEstimate:
    """Memory for a simulated command line (`moeconf.explanation.explain`), with the engine's
    pipeline parallelism decided from the same invocation."""
    inv = ex.invocation
    n_devices = len(ex.accelerators)
    sm = inv.split_mode.text if inv.split_mode else None
    overrides = bool(ex.items)
    pipe = pipeline_parallel(ex.placement, n_devices, inv.n_gpu_layers(), sm, settings, overrides)
    return estimate(ex.placement, settings, pipeline=pipe)
