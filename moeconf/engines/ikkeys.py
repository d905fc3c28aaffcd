"""The `{arch}.*` keys ik_llama.cpp's loader requires whatever the file (moeconf/engines/archkeys.py IK_REQUIRED,
generated from its llm_load_hparams): a file without one does not load on ik ("key not found in model", or an
assertion on the value left unset where a key read for every architecture is read again as required)."""

from __future__ import annotations

from collections.abc import Collection

from moeconf.engines.archkeys import IK_REQUIRED
from moeconf.model.inventory import Inventory


def ik_key_stops(inv: Inventory, overridden: Collection[str] = ()) -> tuple[str, ...]:
    """Why ik_llama.cpp's loader stops on this file for lack of a key its architecture's case requires (empty: the
    file has every one, or --override-kv gives it: `overridden`, the full key names; or the source did not record
    the file's keys, as a manifest before version 3)."""
    if inv.metadata.arch_keys is None:
        return ()
    given = set(inv.metadata.arch_keys) | {k.removeprefix(f"{inv.arch}.") for k in overridden}
    missing = sorted(IK_REQUIRED.get(inv.arch, frozenset()) - given)
    if not missing:
        return ()
    names = ", ".join(f"{inv.arch}.{k}" for k in missing)
    return (f"ik_llama.cpp 0.1.5 requires {names} (src/llama-hparams.cpp, its {inv.arch} case of llm_load_hparams), "
            f"which the file lacks: it fails to load; a conversion that writes "
            f"{'it' if len(missing) == 1 else 'them'} loads, or give {'it' if len(missing) == 1 else 'each'} with "
            "--override-kv KEY=TYPE:VALUE",)
