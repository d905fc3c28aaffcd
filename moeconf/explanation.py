"""`moeconf explain`: simulate an engine invocation on a model and say where every tensor goes,
which item put it there, and which items matched nothing."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moeconf.engines import AUTO_GPU, HOST, Engine, engine_device_order
from moeconf.engines.argvread import Arg, unknown_flag_message
from moeconf.engines.cmdline import Invocation, engine_items, invocation_ncmoe, parse_invocation
from moeconf.engines.flags import c_int
from moeconf.engines.ikkeys import ik_key_stops
from moeconf.engines.kvoverride import read_kv_overrides
from moeconf.engines.regex import (
    RegexProblem,
    TimeBudget,
    check_regex,
    ecmascript_search,
    misreadings,
    python_disagreement,
)
from moeconf.engines.simulate import OverrideItem, default_devices, ecmascript_matcher, layer_gpus, simulate
from moeconf.model.inventory import Inventory, first_shard, format_ranges
from moeconf.model.required import ik_load_refusals, load_refusals
from moeconf.placement import Placement

if TYPE_CHECKING:
    from moeconf.linting.model import Finding


@dataclass(frozen=True)
class ItemReport:
    """One item the engine tests: its text, where it came from, and what it matched."""

    pattern: str
    device: str
    origin: str
    raw_index: int | None  # index into Invocation.items(), None for --cpu-moe / --n-cpu-moe rules
    hits: int  # tensors it was the first match for
    touches: int  # tensors it matches at all


@dataclass(frozen=True)
class Explanation:
    invocation: Invocation
    placement: Placement
    items: tuple[ItemReport, ...]
    refusals: tuple[str, ...]  # why the engine would not start this command line (bad items, unknown devices)
    notes: tuple[str, ...]
    matched_by: dict[str, int | None]  # tensor -> index into `items` of its first match
    accelerators: tuple[str, ...] = ()  # the devices besides CPU: RPC servers, then GPUs
    # what `moeconf lint` says about the command line (moeconf.explain fills it, as `explain --json`)
    findings: tuple[Finding, ...] = ()
    load_refusals: tuple[str, ...] = ()  # why the engine would not load the file, whatever the command line

    @property
    def all_refusals(self) -> tuple[str, ...]:
        """Why the engine would not run this: the command line's refusals, then the file's."""
        return (*self.refusals, *self.load_refusals)

    @property
    def unmatched(self) -> list[ItemReport]:
        """The items the user wrote that match nothing (not the rules --cpu-moe and --n-cpu-moe
        add: those of --n-cpu-moe on a dense block match nothing by design)."""
        return [it for it in self.items if it.touches == 0 and it.raw_index is not None]

    def json(self) -> dict[str, object]:
        return {
            "engine": self.invocation.engine.label,
            "placement": self.placement.as_json(),
            "reasons": dict(self.placement.reasons),
            "items": [
                {"item": f"{it.pattern}={it.device}", "origin": it.origin, "first_match_for": it.hits,
                 "matches": it.touches}
                for it in self.items
            ],
            "unmatched": [f"{it.pattern}={it.device}" for it in self.unmatched],
            "bytes_by_device": self.placement.bytes_by_device(),
            "refusals": list(self.all_refusals),
            "notes": list(self.notes),
            **({"findings": [f.json() for f in self.findings]} if self.findings else {}),
        }


def local_gpus(invocation: Invocation, gpus: Sequence[str]) -> list[str]:
    """The local GPUs among `gpus`, in the engine's order (CUDA0 before CUDA1): a name that an
    `--rpc` server already adds is that one device, not a second one; a name given twice is one
    device."""
    rpc = set(invocation.rpc_devices())
    out: list[str] = []
    for g in gpus:
        if g not in rpc and g not in out:
            out.append(g)
    return engine_device_order(out)


def available_devices(invocation: Invocation, gpus: Sequence[str]) -> list[str]:
    """CPU, then the accelerators: RPC servers first (both engines put them in front), then local
    GPUs (a name an RPC server already adds counts once); `-dev` keeps the ones it names, in its
    order (`none`: no accelerator)."""
    have = [*dict.fromkeys(invocation.rpc_devices()), *local_gpus(invocation, gpus)]
    if invocation.device_list is not None:
        named = [d for d in invocation.device_list.text.split(",") if d]
        have = [] if named == ["none"] else [d for d in named if d in have]
    return [HOST, *have]


def assumed_gpus(invocation: Invocation, *, ts: bool = True) -> list[str]:
    """The GPUs to simulate when the machine's are not known: CUDA0, plus every well-formed
    accelerator name the items use (so `CUDA3` is simulated as a device, not dropped), plus as many
    as `-ts` has shares beyond the --rpc servers' (a split over two devices names two; llama.cpp
    ignores shares past its devices, so a line written for two GPUs is one for two). Names the
    engine would refuse (`cuda0`, `CUDA_Host`, RPC) are not added."""
    names = {"CUDA0"}
    shares = invocation.tensor_split_values() if ts else None
    for i in range(len(shares or ()) - len(invocation.rpc_devices())):
        names.add(f"CUDA{i}")
    for item in invocation.items():
        dev = item.device
        if (dev and dev != HOST and not dev.startswith("RPC")
                and invocation.engine.device_name_error(dev) is None):
            names.add(dev)

    return assumed_gpus_sorted(names)


def assumed_gpus_sorted(names: Iterable[str]) -> list[str]:
    """GPU names in the engine's order: by backend, then number (CUDA2 before CUDA10)."""
    def key(name: str) -> tuple[str, int]:
        m = re.fullmatch(r"(\D+?)(\d+)(?:_Private)?", name)
        return (m.group(1), int(m.group(2))) if m else (name, -1)

    return sorted(set(names), key=key)


def ik_split(invocation: Invocation, inv: Inventory, ngl: int, ts: Sequence[float],
             n_devices: int) -> list[int] | str:
    """ik_llama.cpp's layer split by -ts (moeconf/iksplit.py), from the invocation's own settings."""
    from moeconf.iksplit import ik_layer_split, read_ik_split_settings

    settings = read_ik_split_settings([a.text for a in invocation.args],
                                      {k: v.text for k, v in invocation.env.items()})
    if isinstance(settings, str):
        return settings
    return ik_layer_split(inv, invocation.engine, settings, ngl, ts, n_devices)


def explain_invocation(inv: Inventory, invocation: Invocation, gpus: Sequence[str] | None,
                       layer_devices: Sequence[int] | None = None) -> Explanation:
    """Simulate the invocation. `gpus=None`: the machine's GPUs are not known (see assumed_gpus).
    `layer_devices`: where ik_llama.cpp put each block (then the output layer) when it split
    them over several devices, as its log reports it; None: predicted from `-ts` in `-sm layer`
    (ik_split), else unknown (ik splits by free memory: GPU(auto))."""
    eng = invocation.engine
    from_ts = ""
    if gpus is None:
        gpus = assumed_gpus(invocation)
        if invocation.tensor_split is not None and len(assumed_gpus(invocation, ts=False)) < len(gpus):
            from_ts = (f"{len(gpus)} GPUs ({', '.join(gpus)}) assumed from -ts {invocation.tensor_split.text}: "
                       "the machine's GPUs are not given (explain --gpus, or gpus in .moeconf.toml)")
    devices = available_devices(invocation, gpus)
    accel = devices[1:]
    refusals: list[str] = [msg for _arg, msg in invocation.problems]
    refusals += [unknown_flag_message(eng, arg.text, closest) for arg, closest in invocation.unknown_flags]
    if invocation.model is not None and first_shard(invocation.model.text) != invocation.model.text:
        refusals.append(f"-m {invocation.model.text} is not the first shard of a split model: the engine loads "
                        f"only from the first (\"model must be loaded with the first split\"): write -m "
                        f"{first_shard(invocation.model.text)}")
    notes: list[str] = [from_ts] if from_ts else []
    ngl = invocation.n_gpu_layers()
    if ngl < 0:
        ngl = -1
    sm = invocation.split_mode.text if invocation.split_mode else None
    ts = invocation.tensor_split_values()
    if eng.has_fit and eng.fit_default_on and invocation.fit is None and not (
            invocation.ngl or invocation.ot or invocation.cpu_moe or invocation.n_cpu_moe or invocation.n_cpu_ffn):
        notes.append("--fit is on by default and nothing is set by hand: fit chooses -ngl and overrides at "
                     "load time from free memory; the map shows everything offloaded")
    # (a value the engine cannot read as a number is among invocation.problems: engines/flags.py)
    main_gpu = c_int(invocation.main_gpu.text) if invocation.main_gpu is not None else None
    spread, refused = layer_gpus(eng, accel, sm, main_gpu)
    if refused:
        refusals.append(refused)
    elif spread != accel:
        notes.append(f"-sm none: {eng.label} keeps only {spread[0]} (-mg {main_gpu or 0}) for the layers"
                     if spread else f"-sm none -mg {main_gpu}: {eng.label} uses no GPU, every layer stays on the CPU")
        # the context gets backends for the model's devices only: a tensor -ot puts on another one
        # is loaded there, then the scheduler aborts ("pre-allocated tensor ... in a buffer ... that
        # cannot run the operation"), measured on llama.cpp as vendored by llama-cpp-python 0.3.36
        for dev in dict.fromkeys(r.device for r in invocation.items() if r.device in accel and r.device not in spread):
            refusals.append(f"-ot names {dev}, but with -sm none {eng.label} runs only "
                            f"{spread[0] if spread else 'the CPU'}: it aborts at start (\"pre-allocated tensor in a "
                            f"buffer ({dev}) that cannot run the operation\"); drop -sm none or send those tensors to "
                            f"{spread[0] if spread else HOST}")
    if layer_devices is None and eng.name == "ik_llama.cpp" and len(spread) > 1 and ts is not None \
            and (sm or "layer") == "layer" and ngl != 0:
        predicted = ik_split(invocation, inv, ngl, ts, len(spread))
        if isinstance(predicted, str):
            notes.append(f"{eng.label} splits the layers over {len(spread)} devices by free memory here "
                         f"({predicted}): they show as {AUTO_GPU}")
        else:
            layer_devices = predicted
    defaults = default_devices(inv, eng, ngl, spread, ts, sm, layer_devices)
    names = [t.name for t in inv.tensors]
    matches: dict[str, frozenset[str]] = {}  # pattern -> the names std::regex_search finds it in
    budget = TimeBudget()
    for raw in invocation.items():
        if raw.pattern is None:
            refusals.append(f"-ot item {raw.text!r} has no '=' (REGEX=DEVICE)")
            continue
        if raw.device not in devices:
            refusals.append(f"unknown buffer type {raw.device!r} (available: {', '.join(devices)})")
        if raw.pattern in matches:
            continue
        found = ecmascript_search(raw.pattern, names, budget.limit())
        if isinstance(found, RegexProblem):
            refusals.append(f"regex {raw.pattern!r}: {found.message}")
            continue
        matches[raw.pattern] = found
        notes.extend(f"regex {raw.pattern!r}: {m.message}" for m in misreadings(raw.pattern))
        differs = python_disagreement(raw.pattern)
        if differs:
            notes.append(f"regex {raw.pattern!r} is read as ECMAScript (std::regex), not as Python's re: {differs}")
    items = engine_items(invocation, inv, len(accel), layer_devices)
    if eng.ot_needs_gpu and (not accel or ngl == 0) and items:
        notes.append(f"{eng.label} drops every -ot and --n-cpu-moe rule with -ngl 0 or no GPU")
        items = []
    else:
        notes += ncmoe_notes(invocation, inv, accel, layer_devices)
    if invocation.ngl is None and eng.default_ngl == 0 and accel:
        notes.append(f"{eng.label} offloads nothing without -ngl (default 0): every layer stays on the CPU")
    usable = [(p, d, o, k) for p, d, o, k in items
              if d in devices and (p in matches or (k is None and check_regex(p) is None))]

    def matcher(pattern: str) -> Callable[[str], bool]:
        found = matches.get(pattern)
        return found.__contains__ if found is not None else ecmascript_matcher(pattern)

    overrides = [OverrideItem(p, d, o) for p, d, o, _ in usable]
    sim = simulate(inv, overrides, defaults, matcher)
    reasons = {}
    for t in inv.tensors:
        k = sim.matched_by[t.name]
        if sim.devices[t.name] is None:
            reasons[t.name] = "not loaded by the engine"
        elif k is None:
            reasons[t.name] = "default (-ngl)" if defaults[t.name] != AUTO_GPU else "default (split by free memory)"
        else:
            p, d, o, _ = usable[k]
            reasons[t.name] = f"{o}: {p}={d}"
    reports = tuple(
        ItemReport(p, d, o, raw_k, sim.hits[n], sim.touches[n]) for n, (p, d, o, raw_k) in enumerate(usable)
    )
    placement = Placement(inv, eng, sim.devices, defaults, reasons)
    # the file, not the command line: the engine's loader stops on it ("tensor ... not found", "wrong number of
    # tensors")
    overridden = {key for key, _ in read_kv_overrides([a.text for a in invocation.args], eng)[0]}
    loads = (load_refusals(inv, overridden=overridden) if eng.name == "llama.cpp"
             else (*ik_load_refusals(inv), *ik_key_stops(inv, overridden)))
    return Explanation(invocation, placement, reports, tuple(refusals), tuple(notes), dict(sim.matched_by),
                       tuple(accel), load_refusals=loads)


def ncmoe_notes(invocation: Invocation, inv: Inventory, accel: Sequence[str],
                layer_devices: Sequence[int] | None = None) -> list[str]:
    """What each --n-cpu-moe / --cpu-moe takes, said in the engine's own terms."""
    out = []
    for take, origin, _order in invocation_ncmoe(invocation, inv, len(accel), layer_devices):
        if take.path == "all":
            continue
        if take.path == "none":
            out.append(f"{origin}: {invocation.engine.label} applies no --n-cpu-moe rule with -sm none and "
                       f"{len(accel)} devices")
            continue
        blocks = format_ranges(sorted(take.blocks)) if take.blocks else "none"
        if take.path == "per-device":
            per = "; ".join(f"{accel[d]}: {c} layers -> {k}" for d, (c, k) in enumerate(take.shares))
            est = (" (the layer split is moeconf's estimate: ik splits layers by free memory)"
                   if take.estimated_split else "")
            out.append(f"{origin}: shared over {len(accel)} devices by their layer counts ({per}); each gives "
                       f"up its own last blocks, experts or not: blocks {blocks}, weights only{est}")
        else:
            out.append(f"{origin}: blocks {blocks}")
    return out


def explain(inv: Inventory, engine: Engine, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            gpus: Sequence[str] | None = None, layer_devices: Sequence[int] | None = None) -> Explanation:
    """Simulate `argv` (the engine's command line, binary first or not) on the model. Without
    `gpus`, CUDA0 and every well-formed GPU name the items use are simulated."""
    args = [Arg(a) for a in argv]
    envs = {k: Arg(v) for k, v in (env or {}).items()}
    return explain_invocation(inv, parse_invocation(args, engine, envs), gpus, layer_devices)
