"""Load a model's inventory from either of its two forms: a GGUF (any shard of a split model,
`moeconf.model.inventory`) or a moeconf manifest (`moeconf.model.manifest`). It sits above both
readers, so neither imports the other's module back."""

from __future__ import annotations

import os

from moeconf.errors import MoeconfError, open_regular
from moeconf.model.inventory import Inventory, read_gguf_inventory
from moeconf.model.manifest import read_manifest


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Load a model inventory from a GGUF (first or any shard) or a moeconf manifest (.json)."""
    spath = os.fspath(path)
    if spath.endswith(".json"):
        return read_manifest(spath)
    with open_regular(spath, MoeconfError, "a GGUF file or a manifest .json") as f:
        try:
            start = f.read(64).lstrip()
        except OSError as e:  # EIO and the like: the file, not moeconf
            raise MoeconfError(f"cannot read: {e.strerror or e}", path=spath) from None
    if start.startswith(b"{"):
        return read_manifest(spath)
    return read_gguf_inventory(spath)
