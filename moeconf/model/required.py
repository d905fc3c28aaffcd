"""The tensors the pinned llama.cpp's loader requires of a file: a file without one stops at load
("tensor 'NAME' not found"). Which ones: model/layertable.py ML_REQUIRED_GLOBAL and ML_REQUIRED_BLOCK, generated
from each architecture's load_arch_tensors (only what it surely requires; a tensor under a condition of
the file is not checked here, but for MLA's form: ML_REQUIRED_BLOCK_BY_MLA). And the tensors it never creates:
every tensor of the file must be created (done_getting_tensors: "wrong number of tensors"), and a name no
pinned engine knows, or one whose kind the architecture's loader never creates (model/nametable.py
ML_ARCH_TENSORS), never is. ik_llama.cpp's loader
makes the same check (llama-model-loader.cpp done_getting_tensors), on what its own loader creates
(IK_ARCH_TENSORS, from src/llama-load-tensors.cpp); which tensors it requires is not tabled."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from moeconf.model.inventory import Inventory
from moeconf.model.layertable import (
    ML_MTP_ONLY_PROBE,
    ML_REQUIRED_BLOCK,
    ML_REQUIRED_BLOCK_BY_MLA,
    ML_REQUIRED_GLOBAL,
    ML_REQUIRED_UNLESS_MTP_ONLY,
)
from moeconf.model.percache import per_inventory
from moeconf.model.taxonomy import arch_tensor_kinds, classify_name


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
    block = ML_REQUIRED_BLOCK.get(inv.arch, ())
    if inv.arch in ML_REQUIRED_BLOCK_BY_MLA:  # the loader's `is_mla`: both MLA head widths non-zero
        mla = bool(inv.metadata.key_length_mla) and bool(inv.metadata.value_length_mla)
        block = (*block, *ML_REQUIRED_BLOCK_BY_MLA[inv.arch][0 if mla else 1])
    missing += [n for il in range(trunk) for t in block if (n := t % il) not in have]
    return tuple(missing)


def missing_message(inv: Inventory, missing: tuple[str, ...]) -> str:
    """The refusal of a file lacking tensors the loader requires."""
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return (f"llama.cpp refuses to load this file: its {inv.arch} loader requires "
            f"{', '.join(missing[:3])}{more}, which the file lacks (it stops on the first it looks for: "
            "\"tensor '...' not found\")")


@per_inventory
def uncreated_tensors(inv: Inventory, engine: str = "llama.cpp") -> tuple[str, ...]:
    """The file's tensors `engine`'s loader for its architecture never creates: names no pinned engine knows,
    and known names none of whose kinds the loader creates (empty where the engine does not know the
    architecture: that is refused on its own)."""
    return uncreated(inv.arch, [t.name for t in inv.tensors], engine)


def uncreated(arch: str, names: Iterable[str], engine: str = "llama.cpp") -> tuple[str, ...]:
    """Of `names`, those `engine`'s `arch` loader never creates (`uncreated_tensors`)."""
    made = arch_tensor_kinds(engine, arch)
    if made is None:
        return ()
    return tuple(n for n in names if not made.intersection(classify_name(n).kinds))


def load_refusals(inv: Inventory, *, uncreated: bool = True, overridden: Collection[str] = ()) -> tuple[str, ...]:
    """Why llama.cpp's loader stops on this file, whatever the command line: tensors it requires that the
    file lacks, tensors of the file it never creates, expert groups it refuses (empty: it loads).
    `uncreated=False`: the first alone (where llama.cpp's graph stands in for ik_llama.cpp's, whose loader takes
    what it creates by its own rules: `ik_load_refusals`). `overridden`: the keys the command line's --override-kv
    sets, which the loader reads instead of the file's."""
    why = []
    missing = missing_tensors(inv)
    if missing:
        why.append(missing_message(inv, missing))
    extra = uncreated_tensors(inv) if uncreated else ()
    if extra:
        why.append(uncreated_message(inv, extra))
    return (*why, *(group_stops(inv, overridden) if uncreated else ()))


def ik_load_refusals(inv: Inventory) -> tuple[str, ...]:
    """Why ik_llama.cpp's loader stops on this file, whatever the command line: tensors of the file it never
    creates (its required tensors are not tabled: a file lacking one is refused where moeconf's memory model
    needs it)."""
    extra = uncreated_tensors(inv, "ik_llama.cpp")
    if not extra:
        return ()
    if arch_tensor_kinds("llama.cpp", inv.arch) is not None and not uncreated(inv.arch, extra):
        advice = (f"llama.cpp's {inv.arch} loader creates them: run the file with llama.cpp, or take a conversion "
                  "ik_llama.cpp's loader reads")
        return (uncreated_message(inv, extra, "ik_llama.cpp", advice),)
    return (uncreated_message(inv, extra, "ik_llama.cpp"),)


def uncreated_message(inv: Inventory, extra: tuple[str, ...], engine: str = "llama.cpp",
                      advice: str = "remove them, or check that the file's general.architecture is the model's") -> str:
    """The refusal of a file holding tensors the loader never creates."""
    more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
    return (f"{engine} refuses to load this file: its {inv.arch} loader never creates {', '.join(extra[:3])}{more}, "
            "which the file holds, and every tensor of a file must be created (done_getting_tensors: \"wrong number "
            f"of tensors\"); {advice}")


def group_stops(inv: Inventory, overridden: Collection[str] = ()) -> list[str]:
    """The pinned llama.cpp loader's checks of the expert groups that the file fails (llama-model.cpp, load_hparams:
    GGML_ASSERTs, for every architecture); empty where it passes them, or where --override-kv sets a group key
    (`overridden`: the loader reads the override instead)."""
    if {f"{inv.arch}.expert_group_count", f"{inv.arch}.expert_group_used_count"} & set(overridden):
        return []
    groups, used = (v if isinstance(v := inv.metadata.hparam(k), int) else 0
                    for k in ("expert_group_count", "expert_group_used_count"))
    experts = inv.metadata.expert_count or 0
    if experts == 0:
        if not groups:
            return []
        bad = "no routed experts"
    elif groups >= experts:
        bad = f"as many groups as experts ({experts}) or more"
    elif groups > 1 and experts % groups:
        bad = f"{experts} experts that {groups} groups do not divide"
    elif groups > 1 and not 0 < used < groups:
        bad = f"{used} of the {groups} groups used (it needs at least 1 and fewer than all)"
    else:
        return []
    return [f"llama.cpp's loader stops on this {inv.arch} file (an assertion in load_hparams): it sets {groups} "
            f"expert groups ({inv.arch}.expert_group_count) with {bad}; check the conversion's n_group and "
            "topk_group"]
