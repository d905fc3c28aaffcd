"""Models where users find them: Hugging Face repos (`hf://OWNER/REPO/PATH.gguf`, `OWNER/REPO:TAG`
as llama.cpp's -hf takes it), any URL of a GGUF, and the local Hugging Face cache.

`load_model` is the one place a MODEL string becomes an inventory, for the CLI and the library:
a local GGUF or manifest as before, a remote one by its header alone (docs/hub.md). This module
imports nothing heavy: huggingface_hub is imported only when the Hub is asked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from moeconf.hub.ref import RemoteRef, looks_remote, parse_ref

if TYPE_CHECKING:
    from moeconf.hub.remote import Progress
    from moeconf.model.inventory import Inventory

__all__ = ["RemoteRef", "is_remote", "load_model", "parse_ref"]


def is_remote(spec: str | os.PathLike[str]) -> bool:
    return isinstance(spec, str) and looks_remote(spec)


def load_model(spec: str | os.PathLike[str], *, progress: Progress | None = None,
               offline: bool = False) -> Inventory:
    """A GGUF (any shard), a manifest, or a remote MODEL string -> its inventory. `offline`:
    a remote model from the caches only."""
    if is_remote(spec):
        from moeconf.hub.fetch import HubError
        from moeconf.hub.remote import load

        ref = parse_ref(str(spec))
        try:
            return load(ref, progress=progress, offline=offline)
        except HubError as e:
            if ref.tag is None and ref.file is None and ref.url is None and e.message.startswith("no repo "):
                # OWNER/NAME is also how a relative path looks: say that it is not one either
                raise HubError(f"{spec}: no such file, and {e.message}", hint=e.hint) from None
            raise
    from moeconf.model.load import load_inventory

    return load_inventory(spec)
