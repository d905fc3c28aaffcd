"""The tensors the pinned llama.cpp's loader requires of a file: a file without one stops at load
("tensor 'NAME' not found"). Which ones: model/layertable.py ML_REQUIRED_GLOBAL and ML_REQUIRED_BLOCK, generated
from each architecture's load_arch_tensors (only what it surely requires; a tensor under a condition of
the file is not checked here)."""

from __future__ import annotations

from moeconf.model.inventory import Inventory
from moeconf.model.layertable import (
    ML_MTP_ONLY_PROBE,
    ML_REQUIRED_BLOCK,
    ML_REQUIRED_GLOBAL,
    ML_REQUIRED_UNLESS_MTP_ONLY,
)
from moeconf.model.percache import per_inventory


@per_inventory  # asked again of one inventory within a command: explain, the memory model's file_refusals, lint
def missing_tensors(inv: Inventory) -> tuple[str, ...]:
    """The names llama.cpp's loader requires that the file lacks (the trunk blocks: every block before
    the MTP ones; none of theirs where the loader takes the file for its MTP blocks alone)."""
    have = inv.by_name
    nextn = inv.metadata.nextn_predict_layers or 0
    trunk = inv.block_count - nextn
    missing = [n for n in ML_REQUIRED_GLOBAL.get(inv.arch, ()) if n not in have]
    if nextn and inv.arch in ML_REQUIRED_UNLESS_MTP_ONLY and ML_MTP_ONLY_PROBE not in have:
        return tuple(missing)  # `mtp_only`: the trunk's tensors are optional to the loader
    missing += [n for il in range(trunk) for t in ML_REQUIRED_BLOCK.get(inv.arch, ()) if (n := t % il) not in have]
    return tuple(missing)


def missing_message(inv: Inventory, missing: tuple[str, ...]) -> str:
    """The refusal of a file lacking tensors the loader requires."""
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return (f"llama.cpp refuses to load this file: its {inv.arch} loader requires "
            f"{', '.join(missing[:3])}{more}, which the file lacks (it stops on the first it looks for: "
            "\"tensor '...' not found\")")
