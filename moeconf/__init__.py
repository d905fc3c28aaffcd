"""moeconf: declarative, checked tensor placement for MoE models on llama.cpp and ik_llama.cpp.

The public API is small and typed; heavy modules load on first use.
"""

from __future__ import annotations

from moeconf.errors import GGUFError, ManifestError, MoeconfError
from moeconf.model.inventory import Inventory, Layer, ModelMetadata, Tensor, load_inventory

__version__ = "0.1.0"

__all__ = [
    "GGUFError",
    "Inventory",
    "Layer",
    "ManifestError",
    "ModelMetadata",
    "MoeconfError",
    "Tensor",
    "__version__",
    "load_inventory",
    "write_manifest",
]


def write_manifest(inventory: Inventory, path: str) -> None:
    """Write `inventory` as a manifest JSON (atomically)."""
    from moeconf.model.manifest import write_manifest as _write

    _write(inventory, path)
