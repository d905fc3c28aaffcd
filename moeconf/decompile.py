"""Placement -> plan: the rules that say, in groups and layer ranges, what a placement does
differently from the engine default (`moeconf explain --plan`). The plan is checked by
resolving it again: it must give back the same placement."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence

import tomli_w

from moeconf.engines import HOST
from moeconf.errors import MoeconfError
from moeconf.explanation import Explanation
from moeconf.model.inventory import Inventory, Tensor, format_ranges


def _ranges(values: Sequence[int]) -> str:
    return format_ranges(values, "..")


def _device_word(dev: str, gpus: Sequence[str]) -> str:
    if dev == HOST:
        return "cpu"
    if dev in gpus:
        i = list(gpus).index(dev)
        return "gpu" if i == 0 else f"gpu{i}"
    return dev


def _suffixed(t: Tensor) -> str:
    return t.base + "." + t.name.rsplit(".", 1)[-1] if t.name != t.base else t.base


def decompile_rules(inv: Inventory, devices: dict[str, str | None], defaults: dict[str, str | None],
                    gpus: Sequence[str]) -> list[str]:
    moved = [t for t in inv.tensors if devices[t.name] is not None and devices[t.name] != defaults[t.name]]
    rules: list[str] = []
    by_dev: dict[str, list[Tensor]] = defaultdict(list)
    for t in moved:
        d = devices[t.name]
        assert d is not None
        by_dev[d].append(t)
    for dev in sorted(by_dev, key=lambda d: (d != HOST, d)):
        word = _device_word(dev, gpus)
        ts = by_dev[dev]
        by_group: dict[str, list[Tensor]] = defaultdict(list)
        for t in ts:
            by_group[t.group].append(t)
        for group, gts in by_group.items():
            layers = sorted({t.layer for t in gts if t.layer is not None})
            members = [t for t in inv.tensors if t.group == group and devices[t.name] is not None
                       and (t.layer in layers if t.layer is not None else any(g.layer is None for g in gts))]
            if {t.name for t in members} == {t.name for t in gts}:
                all_layers = sorted({t.layer for t in inv.tensors if t.group == group and t.layer is not None
                                     and devices[t.name] is not None})
                if not layers or (layers == all_layers and not any(g.layer is None for g in members if g not in gts)):
                    rules.append(f"{group} -> {word}")
                else:
                    rules.append(f"{group} layers {_ranges(layers)} -> {word}")
                continue
            # not the whole group: name tensor kinds (with their suffix where weight/bias differ)
            by_kind: dict[str, list[Tensor]] = defaultdict(list)
            for t in gts:
                by_kind[t.base].append(t)
            for base, kts in by_kind.items():
                same_base = [t for t in inv.tensors if t.base == base and devices[t.name] is not None]
                kl = sorted({t.layer for t in kts if t.layer is not None})
                selected = [t for t in same_base if (t.layer in kl if t.layer is not None else not kl)]
                if {t.name for t in selected} == {t.name for t in kts}:
                    name = base
                    pool = same_base
                else:
                    name = ""
                    pool = []
                if not name:
                    for sfx in sorted({_suffixed(t) for t in kts}):
                        sts = [t for t in kts if _suffixed(t) == sfx]
                        sl = sorted({t.layer for t in sts if t.layer is not None})
                        rules.append(f"{sfx} layers {_ranges(sl)} -> {word}" if sl else f"{sfx} -> {word}")
                    continue
                all_kl = sorted({t.layer for t in pool if t.layer is not None})
                whole = not kl or kl == all_kl
                rules.append(f"{name} -> {word}" if whole else f"{name} layers {_ranges(kl)} -> {word}")
    return rules


def decompile(ex: Explanation, plan_path: str, model_path: str, gpus: Sequence[str]) -> str:
    """A plan TOML equivalent to the explained invocation; raises if it cannot be exact."""
    from moeconf.plan import plan_from_text
    from moeconf.resolve import resolve

    inv = ex.invocation
    pl = ex.placement
    if any(d is not None and d.startswith("GPU(") for d in pl.devices.values()) and any(
            d is not None and d.startswith("GPU(") for d in (pl.devices[t.name] for t in pl.overridden())):
        raise MoeconfError("the placement depends on the engine's free-memory split; give -ts to decompile it")
    rules = decompile_rules(pl.inventory, pl.devices, pl.defaults, gpus)
    folder = os.path.dirname(os.path.abspath(plan_path))
    data: dict[str, object] = {"rules": rules}
    from moeconf.hub import is_remote

    remote = is_remote(model_path) and not os.path.exists(model_path)
    model: dict[str, str] = {"path": model_path if remote else os.path.relpath(os.path.abspath(model_path), folder)}
    if inv.model is not None:
        model["serve_path"] = inv.model.text
    elif not model_path.endswith(".gguf") and not remote:
        # a manifest and no -m: the GGUF file the manifest was made from (its `source.file`)
        from moeconf.fit import manifest_gguf_name

        model["serve_path"] = manifest_gguf_name(os.path.abspath(model_path), folder)
    data["model"] = model
    eng: dict[str, object] = {"name": inv.engine.name, "gpus": list(gpus)}
    if inv.engine.version:
        eng["version"] = inv.engine.version
    data["engine"] = eng
    flags: dict[str, object] = {}
    if inv.ngl is not None and inv.ngl[1] >= 0:
        flags["n_gpu_layers"] = inv.ngl[1]
    if inv.rpc:
        flags["rpc"] = [s for _, v, _ in inv.rpc for s in v.text.split(",") if s]
    if inv.split_mode is not None:
        flags["split_mode"] = inv.split_mode.text
    if inv.tensor_split is not None:
        ts = inv.tensor_split_values()
        if ts is None:
            raise MoeconfError(f"-ts {inv.tensor_split.text!r} is not a list of numbers")
        flags["tensor_split"] = ts
    if flags:
        data["flags"] = flags
    text = "# decompiled by `moeconf explain --plan` from the engine command line\n" + tomli_w.dumps(data)
    plan = plan_from_text(text, plan_path)
    again = resolve(plan, pl.inventory).placement
    diff = [n for n, d in pl.devices.items() if d is not None and again.devices.get(n) != d]
    if diff:
        raise MoeconfError(f"the decompiled plan does not reproduce {len(diff)} tensor(s), e.g. {diff[0]}: "
                           f"{pl.devices[diff[0]]} vs {again.devices[diff[0]]}")
    return text
