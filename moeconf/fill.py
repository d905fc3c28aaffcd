"""Fill rules (`experts -> gpu, gpu1, cpu`) and the layer split over several GPUs.

The selected tensors go, layer by layer in the plan's `[budget] policy` order, to the first
device of the list whose predicted memory still fits its `[budget]`; the last device takes the
rest. A device that refuses a layer takes no later one (each keeps a contiguous run of layers);
with `split = true` it first takes the part of that layer that uses its remaining room best: the
subset of the layer's expert tensor kinds (down, gate, up) with the most bytes that still fits.
Memory is the memory model's (weights, KV cache, compute, reserve) for the plan's own flags, and
the result is measured again as a whole: where a device is still over, the fewest bytes of its
last layer that bring it back go to the rule's last device.

With several GPUs on llama.cpp and no `tensor_split`, moeconf chooses `-ts` itself: each GPU gets
a contiguous range of layers (`-ts` holds the layer counts, which llama.cpp maps back to exactly
those ranges), every range's always-active tensors, KV cache and compute must fit its GPU's
budget, and among the splits the search measures (each through the engine's graph), the one that
lets the fill put the most bytes on the GPUs wins. The search starts at the split proportional to the
budgets and walks each boundary between two GPUs one layer at a time while the rank improves, with
some patience (`_Filler.walk`; more than two GPUs: one boundary at a time until nothing improves).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, pairwise
from typing import TYPE_CHECKING

from moeconf.engines import AUTO_GPU, Engine
from moeconf.engines.settings import DEFAULT_RESERVE
from moeconf.engines.simulate import default_devices, default_layer_devices, layer_gpus, offloaded_range
from moeconf.errors import PlanError
from moeconf.memory import HOST, DeviceMemory, MemoryEstimate, MemorySettings, estimate, parse_size, read_settings
from moeconf.memory.estimate import alloc_size, pipeline_parallel
from moeconf.memory.ikarchs import next_step
from moeconf.memory.support import unmodelled
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement
from moeconf.plan import Plan
from moeconf.plan.rules import Rule
from moeconf.planengine import gpu_devices, n_gpu_layers, plan_ik_settings, plan_ik_split
from moeconf.units import MIB as MiB

if TYPE_CHECKING:
    from moeconf.iksplit import LayerSizes

_MARGIN_MIN = 16 * MiB
# splits finished only for the tie-breaks (experts away from home, room left); each finish is one to four
# measures through the graph. Over fourteen two-GPU fits (GLM-5 and DeepSeek-V3.2 at 24+16, 16+12 and 48+24
# GiB, GLM-5.3-Flash 12+8, Qwen3-30B-A3B 8+6, Qwen3.5-35B-A3B 8+6, Kimi-Linear 10+8, GLM-4.5-Air 14+10,
# 24+16 and 24+12, HY4 24+16; -c 8192) finishing 1 or 2 chose the same split and fill in every one; 0 chose
# another split on GLM-4.5-Air 24+16 (the same bytes on the GPUs, more of them away from their layer's GPU)
_TIES_FINISHED = 1


# the split search walks one layer at a time from the best split it has measured, in each direction, and
# gives up on a direction after this many splits in a row that put no more bytes on the GPUs
# (`_Filler.walk`; over the fourteen fits of `_TIES_FINISHED`, 3 lost 0.07 GiB on Qwen3.5-35B-A3B 8+6 and chose
# other splits on GLM-4.5-Air 24+16 and Kimi-Linear 10+8)
_PATIENCE = 4
SPLIT_KINDS = ("ffn_down_exps", "ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps")


class DoesNotFit(PlanError):
    """The budgets cannot hold what the plan fixes (the always-active tensors, KV cache and
    compute of each device's layers), or cannot be checked at all."""


@dataclass(frozen=True)
class FillRequest:
    rule: Rule
    devices: tuple[str, ...]  # resolved, in preference order; the last takes the rest
    tensors: tuple[str, ...]  # what the rule still decides after later rules


def plan_settings(plan: Plan, eng: Engine) -> MemorySettings:
    """The memory settings of the command line the plan compiles to."""
    f = plan.config.flags
    argv: list[str] = []
    for flag, v in (("-c", f.ctx_size), ("-b", f.batch), ("-ub", f.ubatch), ("-ctk", f.cache_type_k),
                    ("-ctv", f.cache_type_v), ("-fa", f.flash_attn)):
        if v is not None:
            argv += [flag, str(v)]
    argv += list(f.extra)
    budget = plan.config.budget
    reserve = _size(plan, "reserve", budget.reserve) if budget is not None else DEFAULT_RESERVE
    # the sequences as the binary the plan's command line runs defaults them (llama-server: 4 slots)
    from moeconf.emitting.argv import DEFAULT_BINARY

    return read_settings(argv, eng, reserve=reserve, binary=plan.config.targets.binary or DEFAULT_BINARY)


def _size(plan: Plan, key: str, text: str) -> int:
    try:
        return parse_size(text, key)
    except Exception as e:
        raise plan.error_at_key(("budget", key), str(e).split(": ", 1)[-1]) from None


def budgets(plan: Plan, device_of: Callable[[str], str]) -> dict[str, int]:
    """`[budget]` device keys resolved to buffer types -> bytes."""
    b = plan.config.budget
    if b is None:
        return {}
    out: dict[str, int] = {}
    for key, value in (b.model_extra or {}).items():
        if not isinstance(value, str):
            raise plan.error_at_key(("budget", key), "expected a size like \"24 GiB\"")
        try:
            dev = device_of(key)
        except PlanError as e:
            raise plan.error_at_key(("budget", key), e.message) from None
        out[dev] = _size(plan, key, value)
    return out


@dataclass(frozen=True)
class FillMeasure:
    """The chosen fill as the search measured it last (exact, every setting family checked): the
    memory of the compiled command line where that reads back to the same placement, settings and
    pipeline (`Compiled.memory`), so the result is measured once."""

    mem: MemoryEstimate
    settings: MemorySettings
    placement: Placement
    pipeline: bool


@dataclass(frozen=True)
class FillSolution:
    devices: dict[str, str]  # each fill tensor -> its device
    tensor_split: tuple[int, ...] | None  # the -ts moeconf chose; None: the plan's own
    defaults: dict[str, str | None]  # the engine's default placement under that split
    measured: FillMeasure | None = None


@dataclass
class _Candidate:
    """One layer split, measured with every fill tensor on its rule's last device."""

    counts: tuple[int, ...] | None  # layers per device (the search's coordinates)
    ts: tuple[int, ...] | None  # the -ts value that gives them (mainline: the counts themselves)
    defaults: dict[str, str | None]
    devices: dict[str, str | None]
    mem: MemoryEstimate
    over: dict[str, int]
    score: int = -1  # bytes the greedy fill puts on accelerators (-1: the split does not fit)
    slack: int = 0  # the least room the greedy fill leaves on a GPU
    away: int = 0  # of its bytes, those on a GPU other than their layer's (its activations cross over)
    filled: dict[str, str] | None = None  # the greedy fill's devices (fill tensor -> device)


class _Filler:
    def __init__(self, plan: Plan, inv: Inventory, eng: Engine, overlay: Mapping[str, str | None],
                 requests: list[FillRequest], sizes: dict[str, int], settings: MemorySettings) -> None:
        self.plan, self.inv, self.eng, self.overlay, self.requests = plan, inv, eng, overlay, requests
        self.sizes, self.settings = sizes, settings
        self.split_mode: str | None = plan.config.flags.split_mode
        # the devices -ngl and -ts spread layers over (-sm none: main_gpu's alone)
        self.accelerators, _ = layer_gpus(eng, gpu_devices(plan, eng), self.split_mode, plan.config.flags.main_gpu)
        self.ngl = n_gpu_layers(plan)
        self.ik = not eng.ngl_counts_output  # ik_llama.cpp: -ts weighs ik's own layer sizes
        self._ik_sizes: LayerSizes | str | None = None
        self._measures: dict[tuple[frozenset[tuple[str, str | None]], frozenset[tuple[str, str | None]]],
                             MemoryEstimate] = {}
        budget = plan.config.budget
        self.policy: str = budget.policy
        self.split: bool = budget.split
        self.merge_up_gate = bool(plan.config.flags.merge_up_gate)
        self.last_device = {n: req.devices[-1] for req in requests for n in req.tensors}
        # a rule's last device takes the rest: its budget is checked once the others are filled
        self.sinks = {req.devices[-1] for req in requests} - {d for req in requests for d in req.devices[:-1]}

    # -- measuring -------------------------------------------------------------------------------

    def candidate(self, ts: Sequence[float] | None, counts: tuple[int, ...] | None = None) -> _Candidate:
        defaults = default_devices(self.inv, self.eng, self.ngl, self.accelerators, ts, self.split_mode,
                                   self.ik_layer_devices(ts))
        devices = {**defaults, **self.overlay}
        mem = self.measure(devices, defaults)
        return _Candidate(counts, tuple(int(x) for x in ts) if ts is not None else None, defaults, devices, mem,
                          self.over(mem, sinks=False))

    def ik_layer_devices(self, ts: Sequence[float] | None) -> list[int] | None:
        """ik_llama.cpp's split for `ts`, predicted as its loader computes it (None: mainline, or
        ik splits by free memory, or the split cannot be predicted)."""
        if not self.ik or not ts:
            return None
        return plan_ik_split(self.plan, self.inv, self.eng, len(self.accelerators), ts)

    def measure(self, devs: Mapping[str, str | None], defaults: Mapping[str, str | None]) -> MemoryEstimate:
        # setting families moeconf does not model are checked on the chosen fill (`_refuse_unmodelled`); a
        # placement measured before (a finish's larger part that another split's finish tried) is not measured again
        key = (frozenset(devs.items()), frozenset(defaults.items()))
        if key not in self._measures:
            pl, settings, pipe = self._measured(devs, defaults)
            self._measures[key] = estimate(pl, settings, pipeline=pipe, families=False)
        return self._measures[key]

    def _measured(self, devs: Mapping[str, str | None], defaults: Mapping[str, str | None]) -> tuple[
            Placement, MemorySettings, bool]:
        """What `measure` estimates: the placement, the settings, and whether pipeline parallelism is on."""
        pl = Placement(self.inv, self.eng, dict(devs), dict(defaults), {})
        # (the same keys, as every measure here has: one comparison of the two dicts)
        overrides = pl.devices != pl.defaults if devs.keys() == defaults.keys() else any(
            devs[n] != d for n, d in defaults.items())
        accel = len(set(defaults.values()) - {None, HOST})
        return pl, self.settings, pipeline_parallel(pl, accel, self.ngl, self.split_mode, self.settings, overrides)

    def over(self, mem: MemoryEstimate, *, sinks: bool = False) -> dict[str, int]:
        """Devices over their budget, by how much (the compute model's tolerance kept free); the
        rules' last devices (which take the rest) only with `sinks`."""
        return {d: -f for d, f in self.free(mem).items() if f < 0 and (sinks or d not in self.sinks)}

    def check_sinks(self, mem: MemoryEstimate) -> None:
        """The rules' last devices, once every other device holds what fits."""
        bad = {d: e for d, e in self.over(mem, sinks=True).items() if d in self.sinks}
        if bad:
            raise DoesNotFit(rest_message(mem, bad, self.sizes), path=self.plan.path)

    def free(self, mem: MemoryEstimate) -> dict[str, int]:
        return {d: s - (mem.devices[d].total + model_margin(mem.devices[d])) if d in mem.devices else s
                for d, s in self.sizes.items()}

    # -- filling ---------------------------------------------------------------------------------

    def greedy(self, free: dict[str, int]) -> tuple[dict[str, str], dict[str, list[list[str]]], dict[str, int]]:
        """Each request's units (layers, in policy order) to the first device with room; a device
        that refuses a unit closes, after taking the best-packed part of it when `split` is on."""
        free = dict(free)
        assign: dict[str, str] = {}
        placed: dict[str, list[list[str]]] = defaultdict(list)  # device -> units (tensor names), in order
        for req in self.requests:
            closed: set[str] = set()
            for unit in _units(self.inv, req.tensors, self.policy):
                rest = list(unit)
                for dev in req.devices[:-1]:
                    if dev in closed or not rest:
                        continue
                    need = sum(alloc_size(self.inv.by_name[n], dev) for n in rest)
                    if need <= free[dev]:
                        placed[dev].append(rest)
                        free[dev] -= need
                        assign.update((n, dev) for n in rest)
                        rest = []
                        continue
                    closed.add(dev)
                    # a device measured over by more than the room it had starts a round with none
                    if self.split and free[dev] > 0:
                        part = pack(self.inv, rest, dev, free[dev], self.merge_up_gate)
                        used = sum(alloc_size(self.inv.by_name[n], dev) for n in part)
                        if used > free[dev] or not set(part) <= set(rest):
                            raise AssertionError(f"fill: the packing of {dev}'s split layer takes {used:,} bytes "
                                                 f"where {free[dev]:,} are free")
                        if part:
                            placed[dev].append(part)
                            free[dev] -= used
                            assign.update((n, dev) for n in part)
                            rest = [n for n in rest if n not in part]
        return assign, placed, free

    def complete(self, cand: _Candidate) -> tuple[dict[str, str | None], MemoryEstimate]:
        """The fill on one split, measured again as a whole. A device's compute grows when experts
        run there: where a device comes out over, the fill runs again with its room smaller by the
        excess (a few rounds), and if it is still over, the fewest bytes of its last unit that
        cover the excess go back to the rule's last device, until every budget holds."""
        mem = cand.mem
        free = self.free(mem)
        bad: dict[str, int] = {}
        fitted: tuple[dict[str, str | None], MemoryEstimate, dict[str, list[list[str]]]] | None = None
        last: dict[str, str] | None = None
        for _round in range(4):
            assign, placed, left = self.greedy(free)
            if assign == last:
                break
            last = assign
            devices: dict[str, str | None] = {**cand.devices, **assign}
            mem = self.measure(devices, cand.defaults)
            bad = self.over(mem)
            if bad and fitted is not None:
                # the room a round found (below) was not there after all: keep the round that fit
                devices, mem, placed = fitted
                bad = {}
                break
            if bad:
                # where a device came out over, its room was that much smaller: fill again with less
                for d, excess in bad.items():
                    free[d] -= excess
                continue
            # a device's compute can shrink when experts run there (fewer host weights copied
            # over for a large batch): where one came out with more room than the fill left it,
            # fill again with that much more
            fitted = (devices, mem, placed)
            room = self.free(mem)
            more = {d: room[d] - left[d] for d in self.accelerators if room[d] - left[d] > _MARGIN_MIN}
            if not more:
                break
            for d, extra in more.items():
                free[d] += extra
        if fitted is not None and not bad:
            devices, mem = self._grown(cand, devices, mem, placed)
        while bad:
            for d, excess in bad.items():
                if not placed[d]:
                    raise DoesNotFit(shortfall_message(mem, bad, self.sizes), path=self.plan.path)
                unit = placed[d][-1]
                drop = _cover(self.inv, unit, d, excess)
                for n in drop:
                    devices[n] = self.last_device[n]
                unit[:] = [n for n in unit if n not in drop]
                if not unit:
                    placed[d].pop()
            mem = self.measure(devices, cand.defaults)
            bad = self.over(mem)
        self.check_sinks(mem)
        return devices, mem

    def _grown(self, cand: _Candidate, devices: dict[str, str | None], mem: MemoryEstimate,
               placed: dict[str, list[list[str]]]) -> tuple[dict[str, str | None], MemoryEstimate]:
        """A fill that fits, each GPU's split layer tried with a larger part of it (the parts `pack` can choose
        that need at most the room left plus one tensor of the layer more, largest first), each try measured:
        a GPU's compute can shrink as experts run there (fewer host weights copied for a batch), which the room
        measured before the fill does not show; a try is kept where the graph says every budget holds."""
        room = self.free(mem)
        for d in self.accelerators:
            if not placed[d]:
                continue
            part = placed[d][-1]
            il = self.inv.by_name[part[0]].layer
            unit = [*part, *(n for n, last in self.last_device.items()
                             if devices.get(n) == last and last != d and self.inv.by_name[n].layer == il)]
            parts = _parts(self.inv, unit, self.merge_up_gate)
            now = sum(alloc_size(self.inv.by_name[n], d) for n in part)
            most = now + self.growth(d, unit, room[d], mem)
            sizes = sorted({total for r in range(1, len(parts) + 1) for combo in combinations(parts, r)
                            if now < (total := sum(alloc_size(self.inv.by_name[n], d) for _, p in combo for n in p))
                            <= most}, reverse=True)
            for size in sizes:
                bigger = pack(self.inv, unit, d, size, self.merge_up_gate)
                grown: dict[str, str | None] = {**devices, **{n: self.last_device[n] for n in part},
                                                **{n: d for n in bigger}}
                after = self.measure(grown, cand.defaults)
                if not self.over(after):
                    devices, mem = grown, after
                    room = self.free(mem)
                    break
        return devices, mem

    def growth(self, d: str, unit: Sequence[str], room: int, mem: MemoryEstimate) -> int:
        """The most bytes a larger part of GPU `d`'s split layer (`unit`: its tensors) may add and still
        fit: the room left, plus at most one tensor's worth (the compute a GPU sheds is the host copies of
        such tensors), and never more than its whole compute buffer and the margin kept on it beyond the
        least (the rest of its total does not shrink as weights come): a larger part cannot fit, whatever
        the graph says of the compute, and is not measured."""
        dm = mem.devices[d]
        shed = dm.compute + model_margin(dm) - _MARGIN_MIN
        return room + min(max(alloc_size(self.inv.by_name[n], d) for n in unit), shed)

    def slack(self, mem: MemoryEstimate) -> int:
        """The least room left on an accelerator."""
        return min(self.free(mem)[d] for d in self.accelerators)

    def away(self, devices: Mapping[str, str | None], defaults: Mapping[str, str | None]) -> int:
        """Bytes of the fill's tensors on a GPU other than their layer's."""
        return sum(self.inv.by_name[n].nbytes for n in self.last_device
                   if devices.get(n) not in (None, HOST) and devices.get(n) != defaults[n])

    def gpu_bytes(self, devices: Mapping[str, str | None]) -> int:
        """Bytes of the fill's tensors on accelerators."""
        return sum(self.inv.by_name[n].nbytes for n in self.last_device if devices.get(n) not in (None, HOST))

    # -- the layer split -------------------------------------------------------------------------

    def chooses_split(self) -> bool:
        """moeconf picks -ts: several accelerators, llama.cpp's -ngl/-ts semantics (ik spreads
        layers by its own size estimate), layer split mode, and the plan gives no tensor_split."""
        return bool(self.plan.config.flags.tensor_split is None and len(self.accelerators) >= 2
                    and (self.split_mode or "layer") == "layer")

    def split_range(self) -> tuple[int, int]:
        """(first, how many) of the layers -ts spreads, the output layer as layer block_count where
        the split counts it (mainline always; ik when -ngl exceeds the block count)."""
        if not self.ik:
            return offloaded_range(self.inv, self.eng, self.ngl)
        n_layer = self.inv.block_count
        ngl = n_layer + 1 if self.ngl < 0 else self.ngl
        i0 = max(n_layer - ngl, 0)
        return i0, n_layer + (1 if ngl > n_layer else 0) - i0

    def ik_sizes(self) -> LayerSizes | str:
        """ik's own size of each layer and its largest compute buffer, which its -ts split weighs."""
        if self._ik_sizes is None:
            from moeconf.iksplit import layer_sizes

            settings = plan_ik_settings(self.plan)
            n_layer = self.inv.block_count
            self._ik_sizes = settings if isinstance(settings, str) else layer_sizes(
                self.inv, self.eng, settings, n_layer + 1 if self.ngl < 0 else self.ngl)
        return self._ik_sizes

    def ts_for(self, counts: Sequence[int]) -> tuple[int, ...]:
        """The -ts value that gives each device `counts` layers. llama.cpp: the counts (it splits
        layers in proportion to -ts). ik_llama.cpp splits the sum of its layer sizes and compute
        buffers in proportion to -ts, each device taking layers while its running total stays
        within its share (the one crossing it when that is closer): each share ends a quarter of
        the next layer past the device's last layer, in MiB."""
        if not self.ik:
            return tuple(counts)
        ls = self.ik_sizes()
        assert not isinstance(ls, str)
        i0, n = self.split_range()
        points: list[float] = []  # where each device's share ends, in ik's running total
        total, at = 0.0, i0
        for c in counts:
            total += ls.max_compute + sum(ls.sizes[at:at + c])
            at += c
            points.append(total + (ls.sizes[at] / 4 if at < i0 + n else 0.0))
        points[-1] = total
        shares = [points[0]] + [b - a for a, b in pairwise(points)]
        return tuple(max(1, round(x / MiB)) for x in shares)

    def proportional(self, act: int) -> tuple[int, ...]:
        """Layer counts proportional to each GPU's budget less its reserve (largest remainder),
        at least one layer each: the start of the search and its tie-break."""
        usable = [max(self.sizes[d] - self.settings.reserve, 1) for d in self.accelerators]
        spare = act - len(usable)
        exact = [spare * u / sum(usable) for u in usable]
        counts = [int(x) for x in exact]
        for i in sorted(range(len(usable)), key=lambda i: counts[i] - exact[i])[: spare - sum(counts)]:
            counts[i] += 1
        return tuple(c + 1 for c in counts)

    def search(self) -> list[_Candidate]:
        """Every split measured (`walk`), best first: the ones that fit by the bytes the fill puts on the GPUs,
        then by the fewest of those on a GPU other than their layer's (each such layer sends its
        activations from one GPU to the other and back), then by the most room left on the
        fullest GPU, then by closeness to the proportional split."""
        missing = [d for d in self.accelerators if d not in self.sizes]
        if missing:
            key = missing[0] if missing[0].isalnum() else f'"{missing[0]}"'
            raise self.plan.error_at_key(
                ("budget",), f"no [budget] for {missing[0]}: with several GPUs moeconf chooses -ts (the layers "
                "of each) from every GPU's budget",
                hint=f'for example: {key} = "16 GiB"; or pin the split with [flags] tensor_split')
        if self.ik:
            ls = self.ik_sizes()
            if isinstance(ls, str):
                raise DoesNotFit(_auto_split_message(self.eng, self.accelerators, ls), path=self.plan.path)
        _, act = self.split_range()
        k = len(self.accelerators)
        if act < k:
            raise PlanError(f"{act} offloaded layer(s) for {k} GPUs: offload at least one layer per GPU "
                            "(n_gpu_layers) or set [flags] tensor_split", path=self.plan.path)
        start = self.proportional(act)
        seen: dict[tuple[int, ...], _Candidate] = {}

        def evaluate(counts: tuple[int, ...]) -> _Candidate:
            if counts not in seen:
                ts = self.ts_for(counts)
                cand = self.candidate(ts, counts)
                exact = self.check_ranges(counts, ts)
                if exact and not cand.over and AUTO_GPU not in cand.mem.devices and cand.mem.complete:
                    assign, _, left = self.greedy(self.free(cand.mem))
                    cand.score = self.gpu_bytes(assign)
                    cand.slack = min(left[d] for d in self.accelerators)
                    cand.away = self.away(assign, cand.defaults)
                    cand.filled = assign
                seen[counts] = cand
            return seen[counts]

        def rank(c: _Candidate) -> tuple[int, int, int, int]:
            assert c.counts is not None
            return c.score, -c.away, c.slack, -sum(abs(a - b) for a, b in zip(c.counts, start, strict=True))

        best = evaluate(start)
        for _sweep in range(4):
            improved = False
            for j in range(k - 1):  # the boundary between GPU j and GPU j+1
                counts = list(best.counts or start)
                pair = counts[j] + counts[j + 1]

                def at(a: int, j: int = j, counts: list[int] = counts, pair: int = pair) -> _Candidate:
                    return evaluate((*counts[:j], a, pair - a, *counts[j + 2:]))

                for c in self.walk(at, best, j, pair, rank):
                    if rank(c) > rank(best):
                        best, improved = c, True
            if not improved or k == 2:
                break
        return sorted(seen.values(), key=rank, reverse=True)

    def walk(self, at: Callable[[int], _Candidate], best: _Candidate, j: int, pair: int,
             rank: Callable[[_Candidate], tuple[int, int, int, int]]) -> list[_Candidate]:
        """The splits a local search measures on the boundary between GPU j and GPU j+1 (`at(a)`: the
        split with `a` layers on GPU j, measured once), from the best one so far. Where that does not
        fit because one GPU of the two is over, first the nearest split where that GPU is not (its
        weights and KV cache shrink with each layer it gives up: the split those bytes point to, then
        doubling steps, then halving the gap). Then, in each direction, one layer at a time from the best
        so far, up to `_PATIENCE` splits in a row that put no more bytes on the GPUs (the tie-breaks of
        `rank` choose among the splits measured, but do not prolong the walk: each step is a whole measure
        through the graph), and never past one over on the GPU that gains layers."""
        lo, hi = self.accelerators[j], self.accelerators[j + 1]
        tried = [best]

        def settle(c: _Candidate, fits: _Candidate | None = None) -> _Candidate:
            """`c`, or where one GPU of the two is over there, the nearest split where it is not (from
            `fits`, one where it is not on that side, if given)."""
            assert c.counts is not None
            a0 = c.counts[j]
            gives = -1 if lo in c.over and hi not in c.over else 1 if hi in c.over and lo not in c.over else 0
            if not gives:
                return c
            over_dev = lo if gives < 0 else hi
            near, step, far = a0, 1, None  # near: a split still over on over_dev; far: one that is not
            if fits is not None and fits.counts is not None and over_dev not in fits.over and (
                    fits.counts[j] - a0) * gives > 0:
                far = fits.counts[j]
            # first, the split the layers' own bytes point to (each layer over_dev gives up takes its weights and
            # KV cache with it; compute moves little), then the split one nearer: where the guess holds, two
            # measures where halving from `far` takes about log2 of the gap
            guess = min(max(a0 + gives * self.layers_covering(c, j, over_dev, gives), 1), pair - 1)
            if guess != a0 and (far is None or (far - guess) * gives > 0):
                tried.append(at(guess))
                if over_dev in tried[-1].over:
                    near = guess
                else:
                    far = guess
                    if guess - gives != near:
                        tried.append(at(guess - gives))
                        if over_dev in tried[-1].over:
                            near = guess - gives
                        else:
                            far = guess - gives
            while far is None:
                a = min(max(near + gives * step, 1), pair - 1)
                if a == near:
                    return c
                tried.append(at(a))
                if over_dev in tried[-1].over:
                    near, step = a, step * 2
                else:
                    far = a
            while abs(far - near) > 1:
                mid = (near + far) // 2
                tried.append(at(mid))
                if over_dev in tried[-1].over:
                    near = mid
                else:
                    far = mid
            return at(far)

        top = max([best, settle(best)], key=rank)
        # the split whose boundary is where the greedy fill of the best one changes GPU (its experts then on
        # their own layers' GPUs: the fewest activations crossing over, the shortest -ot), a few times
        for _ in range(3):
            a = self.own_boundary(top, j)
            if a is None or not 1 <= a < pair or top.counts is None or a == top.counts[j]:
                break
            c = settle(at(a), top)
            tried.append(c)
            if rank(c) <= rank(top):
                break
            top = c
        top = max(tried, key=rank)
        for d in (-1, 1):
            gains = lo if d > 0 else hi
            assert top.counts is not None
            a, misses = top.counts[j], 0
            while misses < _PATIENCE and 1 <= a + d < pair:
                a += d
                c = at(a)
                tried.append(c)
                misses = 0 if c.score > top.score else misses + 1
                if rank(c) > rank(top):
                    top = c
                if gains in c.over:
                    break
        return tried

    def layers_covering(self, c: _Candidate, j: int, dev: str, gives: int) -> int:
        """How many layers GPU `dev` (GPU j or GPU j+1 of `c`'s split) must give up across the boundary
        between them for the bytes that go with them (the layer's tensors on `dev`, its share of the KV
        cache) to cover what `c` measured it over by; at least one."""
        assert c.counts is not None
        i0, _ = self.split_range()
        first = i0 + sum(c.counts[:j])  # GPU j's first layer
        boundary = first + c.counts[j]  # GPU j+1's first layer
        held = c.counts[j] if gives < 0 else c.counts[j + 1]
        per_kv = c.mem.devices[dev].kv // held if dev in c.mem.devices and held else 0
        by_layer: dict[int, int] = defaultdict(int)
        for n, d in c.devices.items():
            if d == dev and (il := self.inv.by_name[n].layer) is not None:
                by_layer[il] += alloc_size(self.inv.by_name[n], dev)
        order = range(boundary - 1, first - 1, -1) if gives < 0 else range(boundary, boundary + held)
        excess, k = c.over[dev], 0
        for il in order:
            k += 1
            excess -= by_layer[il] + per_kv
            if excess <= 0:
                break
        return max(k, 1)

    def own_boundary(self, c: _Candidate, j: int) -> int | None:
        """The layers GPU j would hold for the expert layers of `c`'s greedy fill on GPU j and GPU j+1 to be
        their own: GPU j+1's range starting at its first such layer (none there: after GPU j's last);
        None where the fill put none on either, or not in layer order."""
        if c.filled is None or c.counts is None or not c.away:  # (none away: they are already)
            return None
        on = [sorted({self.inv.by_name[n].layer or 0 for n, d in c.filled.items() if d == self.accelerators[i]})
              for i in (j, j + 1)]
        i0, _ = self.split_range()
        start = i0 + sum(c.counts[:j])  # GPU j's first layer
        if on[1]:
            first = on[1][0]
            return first - start if not on[0] or on[0][0] <= first else None
        return on[0][-1] + 1 - start if on[0] else None

    def check_ranges(self, counts: Sequence[int], ts: Sequence[float]) -> bool:
        """Whether the -ts value, read with the engine's own -ngl/-ts semantics, gives each GPU
        exactly the contiguous range of layers the counts mean (the output layer counted last).
        llama.cpp's rule is exact, so a mismatch there is an internal error; ik's split is
        predicted from its layer sizes, and a value whose predicted split differs is not used."""
        i0, act = self.split_range()
        got = default_layer_devices(self.inv, self.eng, self.ngl, self.accelerators, ts, self.split_mode,
                                    self.ik_layer_devices(ts))
        want: dict[int, str] = {}
        il = i0
        for dev, c in zip(self.accelerators, counts, strict=True):
            for _ in range(c):
                want[il] = dev
                il += 1
        if il == i0 + act and all(got[i] == d for i, d in want.items()):
            return True
        if self.ik:
            return False
        raise AssertionError(f"fill: -ts {','.join(map(str, ts))} does not give each GPU the layers "
                             "it was chosen for")


def fill(plan: Plan, inv: Inventory, eng: Engine, overlay: Mapping[str, str | None], requests: list[FillRequest],
         device_of: Callable[[str], str]) -> FillSolution:
    """Where each tensor of the fill rules goes, and the -ts moeconf chose for several GPUs.
    `overlay`: what the plan's rules decide (tensor -> device), fill tensors on their rule's last
    device."""
    budget = plan.config.budget
    sizes = budgets(plan, device_of)
    if budget is None:
        raise plan.error_at_rule(requests[0].rule, requests[0].rule.fill_spans[0],
                                 "a rule with several devices fills them up to their memory: add a [budget] table",
                                 hint='for example: [budget] gpu = "24 GiB"')
    for req in requests:
        for dev, span in zip(req.devices[:-1], req.rule.fill_spans, strict=True):
            if dev not in sizes:
                raise plan.error_at_rule(req.rule, span, f"no [budget] for {dev}: how much memory may it fill?",
                                         hint=f'for example: [budget] {req.rule.text[span.start:span.end]} = "24 GiB"')
    settings = plan_settings(plan, eng)
    if settings.problems:
        raise PlanError("; ".join(settings.problems), path=plan.path)
    not_modelled = unmodelled(inv, eng.name)
    if not_modelled and eng.name == "ik_llama.cpp":  # what the user can do instead (memory/ikarchs.py)
        not_modelled.append(next_step(inv, not unmodelled(inv, "llama.cpp")))
    if not_modelled:
        # refuse before any search: an estimate without the KV cache and compute would fit anything
        raise PlanError("filling the GPUs needs the model's memory, which moeconf cannot compute here: "
                        + "; ".join(not_modelled), path=plan.path)
    f = _Filler(plan, inv, eng, overlay, requests, sizes, settings)
    if f.chooses_split():
        ranked = f.search()
        feasible = [c for c in ranked if c.score >= 0]
        if not feasible:
            least = min(ranked, key=lambda c: sum(c.over.values()))
            if not least.mem.complete:
                raise PlanError("filling the GPUs needs the model's memory, which moeconf cannot compute here: "
                                + "; ".join(least.mem.notes), path=plan.path)
            assert least.ts is not None
            raise DoesNotFit(f"no split of the layers over {', '.join(f.accelerators)} fits (the closest is -ts "
                             f"{','.join(map(str, least.ts))}); " + shortfall_message(least.mem, least.over, sizes),
                             path=plan.path)
        # measured again, a fill may give part of a layer back (compute grows where experts run):
        # finish every split whose first fill could still beat the best finished one on bytes,
        # and the first few of those that could only tie with it (for the room they leave)
        best: tuple[tuple[int, int, int], _Candidate, dict[str, str | None], MemoryEstimate] | None = None
        ties = 0
        for c in feasible:
            if best is not None and c.score < best[0][0]:
                break
            if best is not None and c.score == best[0][0]:
                ties += 1
                if ties > _TIES_FINISHED:
                    break
            devices, mem = f.complete(c)
            key = (f.gpu_bytes(devices), -f.away(devices, c.defaults), f.slack(mem))
            if best is None or key > best[0]:
                best = (key, c, devices, mem)
        assert best is not None
        _, cand, devices, mem = best
    else:
        cand = f.candidate(plan.config.flags.tensor_split)
        ts_given = plan.config.flags.tensor_split
        if not cand.mem.complete:
            raise PlanError("filling the GPUs needs the model's memory, which moeconf cannot compute here: "
                            + "; ".join(cand.mem.notes), path=plan.path)
        if AUTO_GPU in cand.mem.devices:
            why = None
            if f.ik and ts_given:
                ls = f.ik_sizes()
                why = ls if isinstance(ls, str) else None
            raise DoesNotFit(_auto_split_message(eng, f.accelerators, why), path=plan.path)
        if cand.over:
            raise DoesNotFit(shortfall_message(cand.mem, cand.over, sizes), path=plan.path)
        devices, mem = f.complete(cand)
    measured = _refuse_unmodelled(plan, f, devices, cand.defaults, mem)
    filled = {n: d for n in f.last_device if (d := devices[n]) is not None}
    return FillSolution(filled, cand.ts if f.chooses_split() else None, cand.defaults, measured)


def _refuse_unmodelled(plan: Plan, f: _Filler, devices: Mapping[str, str | None],
                       defaults: Mapping[str, str | None], mem: MemoryEstimate) -> FillMeasure | None:
    """The fill chosen, in a setting family moeconf does not model (memory/families.py: e.g. -nkvo
    with routed experts left on the CPU), is refused: the search measured its candidates without
    that check (each starts from every fill-able tensor on the CPU), its memory is not known.
    `mem`: the search's last measure of it (exact, `families=False`). Given back as the measure of
    the compiled command line (`FillMeasure`) where the estimate's own families step adds nothing
    to it (on ik_llama.cpp its llama.cpp twin checks them as well: measured again there)."""
    from moeconf.memory.estimate import families_refused, output_family_checked
    from moeconf.memory.families import unmodelled_settings

    pl, settings, pipe = f._measured(devices, defaults)
    gpus = list(f.accelerators)
    why = unmodelled_settings(pl, f.settings, gpus, output_family_checked(pl, f.settings))
    # a search candidate whose settings or placement the model does not cover has no compute: the
    # chosen fill's own measure says so
    if not why and not mem.complete:
        why = list(mem.notes)
    if why:
        raise PlanError("filling the GPUs needs the model's memory, which moeconf cannot compute here: "
                        + "; ".join(why), path=plan.path)
    if f.eng.name == "ik_llama.cpp" or families_refused(pl, settings):
        return None
    return FillMeasure(mem, settings, pl, pipe)


def _auto_split_message(eng: Engine, accelerators: Sequence[str], why: str | None = None) -> str:
    if not eng.ngl_counts_output:
        reason = f" ({why})" if why else ""
        return (f"{eng.label}'s split of the layers over {', '.join(accelerators)} cannot be predicted here{reason}: "
                "which device holds each layer's attention and KV cache is not known in advance, so a fill rule "
                "cannot be checked against the budgets (ik splits by free memory without -ts, and by its own "
                "layer sizes with it; leave split_mode at layer and moeconf chooses -ts)")
    return (f"layers are spread over {', '.join(accelerators)} by the engine's free memory: a fill rule cannot be "
            "checked against the budgets (leave split_mode at layer and tensor_split unset, and moeconf chooses "
            "-ts; or set tensor_split)")


def _units(inv: Inventory, names: tuple[str, ...], policy: str) -> list[list[str]]:
    by_layer: dict[int, list[str]] = defaultdict(list)
    glob: list[str] = []
    for n in names:
        t = inv.by_name[n]
        (by_layer[t.layer].append(n) if t.layer is not None else glob.append(n))
    order = sorted(by_layer, reverse=policy == "last")
    return ([glob] if glob else []) + [by_layer[il] for il in order]


def _parts(inv: Inventory, names: Sequence[str], merge_up_gate: bool) -> list[tuple[int, list[str]]]:
    """The parts a layer may be split into: one per expert tensor kind (a kind's weight and bias
    together), in SPLIT_KINDS order; gate and up as one part with ik's -muge (it merges them only
    when both land in the same buffer)."""
    parts: dict[int, list[str]] = defaultdict(list)
    for n in names:
        base = inv.by_name[n].base
        if base in SPLIT_KINDS:
            k = SPLIT_KINDS.index("ffn_gate_exps" if merge_up_gate and base == "ffn_up_exps" else base)
            parts[k].append(n)
    return sorted(parts.items())


def pack(inv: Inventory, names: Sequence[str], dev: str, room: int, merge_up_gate: bool = False) -> list[str]:
    """The part of a layer to put on `dev`: the subset of its expert tensor kinds with the most
    bytes that fits `room` (on ties, fewer kinds, then the earlier kinds of SPLIT_KINDS)."""
    parts = _parts(inv, names, merge_up_gate)
    sizes = [sum(alloc_size(inv.by_name[n], dev) for n in part) for _, part in parts]
    best: tuple[int, ...] = ()
    best_key: tuple[int, int, tuple[int, ...]] = (0, 0, ())
    for r in range(1, len(parts) + 1):
        for combo in combinations(range(len(parts)), r):
            total = sum(sizes[i] for i in combo)
            key = (total, -r, tuple(-parts[i][0] for i in combo))
            if total <= room and key > best_key:
                best, best_key = combo, key
    return [n for i in best for n in parts[i][1]]


def _cover(inv: Inventory, unit: Sequence[str], dev: str, excess: int) -> list[str]:
    """What to take back from a device's last unit when it is `excess` bytes over: the parts
    (expert tensor kinds) with the fewest bytes that free at least that much, else the unit."""
    parts = _parts(inv, unit, False)
    if len(parts) > 8 or sum(len(p) for _, p in parts) != len(unit):
        return list(unit)
    sizes = [sum(alloc_size(inv.by_name[n], dev) for n in part) for _, part in parts]
    best: tuple[int, ...] | None = None
    for r in range(1, len(parts) + 1):
        for combo in combinations(range(len(parts)), r):
            total = sum(sizes[i] for i in combo)
            if total >= excess and (best is None or total < sum(sizes[i] for i in best)):
                best = combo
    return list(unit) if best is None else [n for i in best for n in parts[i][1]]


def model_margin(m: DeviceMemory) -> int:
    """What a fill keeps free on a GPU beyond its predicted total: the compute model's tolerance
    against the engine's own figures (16 MiB or 3% of the compute buffer, the larger), so that a
    filled GPU stays within its budget by the engine's count too. None on the host."""
    return 0 if m.device == HOST else max(_MARGIN_MIN, m.compute * 3 // 100)


def rest_message(mem: MemoryEstimate, over: Mapping[str, int], budgets: Mapping[str, int]) -> str:
    """A rule's last device (which takes what the others cannot hold) is over its budget."""
    parts = []
    for d, short in over.items():
        m = mem.devices[d]
        what = "system RAM" if d == HOST else d
        parts.append(f"{what} holds {m.total / MiB:,.0f} MiB (weights {m.weights / MiB:,.0f}, KV "
                     f"{m.kv / MiB:,.0f}, compute {m.compute / MiB:,.0f}, reserve {m.reserve / MiB:,.0f}) once the "
                     f"devices before it in the rule hold all they can: {short / MiB:,.0f} MiB over its "
                     f"{budgets[d] / MiB:,.0f} MiB budget")
    hints = ["more memory on the devices before it in the rule (each MiB there is one less here)",
             "a smaller quant of the routed experts"]
    if HOST in over:
        hints.append("or a larger cpu budget: with mmap (the default) the engine still starts, but pages routed "
                     "experts from disk on every token")
    else:
        hints.append("or one more device at the end of the rule (\"..., cpu\")")
    return "does not fit: " + "; ".join(parts) + ". What would help: " + "; ".join(hints)


def shortfall_message(mem: MemoryEstimate, over: Mapping[str, int], budgets: Mapping[str, int],
                      when: str = "before any fill", margin_kept: bool = True) -> str:
    """Which device is short, by how much, and what would make it fit."""
    parts = []
    for d, short in over.items():
        m = mem.devices[d]
        margin = model_margin(m) if margin_kept else 0
        kept = f" and {margin / MiB:,.0f} MiB kept for the compute estimate's tolerance" if margin else ""
        parts.append(f"{d} needs {m.total / MiB:,.0f} MiB (weights {m.weights / MiB:,.0f}, KV {m.kv / MiB:,.0f}, "
                     f"compute {m.compute / MiB:,.0f}, reserve {m.reserve / MiB:,.0f}){kept} {when}: "
                     f"{short / MiB:,.0f} MiB over its {budgets[d] / MiB:,.0f} MiB budget")
    s = mem.settings
    hints = []
    kv = sum(mem.devices[d].kv for d in over)
    if kv:
        hints.append(f"a smaller -c (the KV cache takes {kv / MiB:,.0f} MiB there; half the context, half of it)")
        if s.cache_type_k == "f16" or s.cache_type_v == "f16":
            # a quantized V cache needs flash attention (off by -fa off, or forced off: grok)
            hints.append("-ctk q8_0 -ctv q8_0 (about half the KV cache)" if mem.flash_attn else
                         "-ctk q8_0 (a quantized K cache; with flash attention off the engine refuses a quantized V)")
    if s.n_ubatch > 128:
        hints.append(f"a smaller -ub (compute grows with it; -ub {s.n_ubatch // 2} roughly halves it)")
    if any(d != HOST for d in over):
        hints.append("fewer layers on the GPU, or a smaller reserve if you know your driver's overhead")
    if HOST in over:
        hints.append("for system RAM: more routed experts on the GPUs, or a smaller quant")
    return "does not fit: " + "; ".join(parts) + ". What would help: " + "; ".join(hints)
