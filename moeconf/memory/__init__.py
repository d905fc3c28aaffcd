"""Does it fit? Memory per device (weights, KV cache, compute, reserve) for a placement, as the
engines compute it. Sits above `model/` and `engines/`, below the reports and the CLI; it reads a
Placement and settings, never an Explanation (`moeconf.sizing` joins the two)."""

from __future__ import annotations

from moeconf.engines import HOST
from moeconf.engines.settings import DEFAULT_RESERVE, MemorySettings, cache_types, parse_size, read_settings
from moeconf.memory.estimate import DeviceMemory, MemoryEstimate, estimate, pipeline_parallel, weight_bytes

__all__ = [
    "DEFAULT_RESERVE", "HOST", "DeviceMemory", "MemoryEstimate", "MemorySettings", "cache_types", "estimate",
    "parse_size", "pipeline_parallel", "read_settings", "weight_bytes",
]

