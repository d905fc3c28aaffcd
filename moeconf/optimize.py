"""`moeconf fit --optimize generation|prompt|balanced`: the trade-off between prompt and generation
speed that the batch size and the KV cache type decide, searched with fit's own solver.

A larger `-ub` spreads each prompt ubatch's op-offload copy (every host expert tensor the ubatch's
tokens select, over PCIe) over more tokens, and takes GPU memory for compute that could have held
routed experts, which every generated token then reads from system RAM; a quantized KV cache gives
memory back. For each `-ub` of 512, 1024, 2048 and 4096 (and the command's own, when it gives
another; `-b` raised to the `-ub` where it is smaller, as the engine takes at most `-b` tokens a
ubatch) and each KV cache type allowed, `fit` solves the command for the same budgets and flags,
and the solved command's traffic (moeconf/traffic.py) at the context depth gives the bytes that
decide the speeds: host bytes read per generated token, PCIe bytes per prompt ubatch and per prompt
token. A `Predictor` (the seam for the speed model, moeconf/speed.py) turns a solved setting into
predicted tokens/s with their error, or says why it cannot.

The choice (`choose`):

- generation: the highest predicted generation tokens/s; without predictions, the least host bytes
  read per generated token;
- prompt: the highest predicted prompt tokens/s; without predictions, the least PCIe bytes per
  prompt token;
- balanced: among the settings within 10% of the best generation speed (predicted tokens/s at least
  90% of the highest; without predictions, host bytes per token at most 10% above the least), the
  best prompt speed (the highest predicted prompt tokens/s; without, the least PCIe bytes per prompt
  token).

Ties go to the smaller `-ub`, then to the earlier cache type in the order given. Predictions are
used only when every setting that fits has one (a predicted and an unpredicted setting are not
compared); a setting without the figure the rule needs (its traffic is not modelled) makes the
choice a refusal that names it. Returns data; `moeconf.report.optimize` renders it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from moeconf.engines import HOST
from moeconf.errors import MoeconfError

if TYPE_CHECKING:
    from moeconf.engines import Engine
    from moeconf.engines.settings import MemorySettings
    from moeconf.fit import Budget, FitResult
    from moeconf.machine import Machine
    from moeconf.model.inventory import Inventory
    from moeconf.placement import Placement
    from moeconf.traffic import Traffic

Goal = Literal["generation", "prompt", "balanced"]
GOALS: tuple[Goal, ...] = ("generation", "prompt", "balanced")
UBATCHES = (512, 1024, 2048, 4096)
BALANCED_WITHIN = 0.10  # balanced: the settings within this share of the best generation speed

RULES: dict[str, tuple[str, str]] = {  # goal -> (the rule on predicted tokens/s, the rule on traffic)
    "generation": ("the highest predicted generation tokens/s",
                   "the least host bytes read per generated token"),
    "prompt": ("the highest predicted prompt tokens/s", "the least PCIe bytes per prompt token"),
    "balanced": (f"the highest predicted prompt tokens/s among the settings whose predicted generation tokens/s "
                 f"is within {BALANCED_WITHIN:.0%} of the highest",
                 f"the least PCIe bytes per prompt token among the settings whose host bytes per generated token "
                 f"are within {BALANCED_WITHIN:.0%} of the least"),
}
TIES = "ties to the smaller -ub, then the earlier cache type"


@dataclass(frozen=True)
class Speed:
    """A prediction of one solved setting: tokens/s with the relative error measured for each
    (0.25: the measured runs were within 25% of the prediction), and what it assumed."""

    prompt_tps: float
    generation_tps: float
    prompt_error: float
    generation_error: float
    assumptions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # a speed without its measured error is a guess: the predictor's answer is checked, not printed as is
        for name in ("prompt_tps", "generation_tps", "prompt_error", "generation_error"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"a predicted speed needs a positive {name}, not {value!r}")

    def json(self) -> dict[str, Any]:
        return {"prompt_tps": self.prompt_tps, "generation_tps": self.generation_tps,
                "prompt_error": self.prompt_error, "generation_error": self.generation_error,
                "assumptions": list(self.assumptions)}


@dataclass(frozen=True)
class NotPredicted:
    """Why a setting has no predicted speed (a figure the machine description lacks, a model the
    predictor does not cover, no predictor at all)."""

    why: str

    def json(self) -> dict[str, Any]:
        return {"not_predicted": self.why}


class Predictor(Protocol):
    """The seam for the speed model: a solved setting's placement, its memory settings (the solved
    command's) and its traffic at the table's depth -> the predicted speeds, or why not."""

    def __call__(self, placement: Placement, settings: MemorySettings, traffic: Traffic, /) -> Speed | NotPredicted:
        ...


NO_PREDICTOR = ("no machine described (optimize(..., predictor=machine_predictor(machine))): the choice reads the "
                "traffic instead")


def no_predictor(placement: Placement, settings: MemorySettings, traffic: Traffic) -> Speed | NotPredicted:
    """The predictor where no machine is described: every setting is not predicted."""
    return NotPredicted(NO_PREDICTOR)


def machine_predictor(machine: Machine) -> Predictor:
    """The speed model (moeconf/speed.py) on `machine` as the table's predictor: a setting whose
    generation or prompt speed the model does not give (a figure missing, a prompt it refuses) is
    not predicted, with the reason."""
    from moeconf.speed import predict

    def run(placement: Placement, settings: MemorySettings, traffic: Traffic, /) -> Speed | NotPredicted:
        pred = predict(traffic, machine)
        if pred.missing:
            return NotPredicted("the machine description lacks " + ", ".join(pred.missing))
        if pred.generation is None or pred.prompt is None:
            return NotPredicted("; ".join(pred.refused) or "not predicted")
        return Speed(pred.prompt.tps, pred.generation.tps, pred.prompt.error, pred.generation.error,
                     pred.assumptions)
    return run


@dataclass(frozen=True)
class Setting:
    ubatch: int
    batch: int  # the command's -b, raised to the -ub where it is smaller
    write_batch: bool  # whether -b is written (raised; else the command's own stands)
    cache_type_k: str | None  # None: the command's own
    cache_type_v: str | None

    def fields(self) -> dict[str, object]:
        """The plan flag fields fit solves this setting with."""
        out: dict[str, object] = {"ubatch": self.ubatch}
        if self.write_batch:
            out["batch"] = self.batch
        if self.cache_type_k is not None:
            out["cache_type_k"] = self.cache_type_k
        if self.cache_type_v is not None:
            out["cache_type_v"] = self.cache_type_v
        return out

    def flags(self) -> str:
        words = [f"-ub {self.ubatch}"] + ([f"-b {self.batch}"] if self.write_batch else [])
        if self.cache_type_k is not None:
            words.append(f"-ctk {self.cache_type_k}")
        if self.cache_type_v is not None:
            words.append(f"-ctv {self.cache_type_v}")
        return " ".join(words)


@dataclass(frozen=True)
class Row:
    """One setting: fit's result (or why there is none), its traffic (or why not) and its speed."""

    setting: Setting
    result: FitResult | None
    why: str | None = None  # does not fit, or the engine would refuse the setting (`refused`)
    refused: bool = False
    traffic: Traffic | None = None
    traffic_why: str | None = None
    speed: Speed | NotPredicted | None = None  # None where the setting does not fit

    @property
    def fits(self) -> bool:
        return self.result is not None

    @property
    def cache_types(self) -> tuple[str, str]:
        assert self.result is not None
        s = self.result.memory.settings
        return s.cache_type_k, s.cache_type_v

    @property
    def batch(self) -> int:
        assert self.result is not None
        return self.result.memory.settings.n_batch

    def expert_layers(self) -> dict[str, tuple[int, int]]:
        """GPU -> (layers whose routed experts it holds whole, layers it holds a part of)."""
        assert self.result is not None
        out = {d: (len(ls), 0) for d, ls in self.result.gpu_expert_layers.items()}
        for _il, d, _kinds in self.result.split_layers:
            whole, part = out.get(d, (0, 0))
            out[d] = (whole, part + 1)
        return out

    def experts_on_gpus(self) -> int:
        """Bytes of routed experts on the GPUs."""
        assert self.result is not None
        inv = self.result.compiled.inventory
        devices = self.result.compiled.placement.devices
        return sum(t.nbytes for t in inv.tensors if t.group == "experts" and devices[t.name] not in (None, HOST))

    def gpu_memory(self) -> dict[str, int]:
        """Each budgeted GPU's predicted total (bytes)."""
        assert self.result is not None
        return {b.device: self.result.memory.devices[b.device].total for b in self.result.budgets
                if b.device in self.result.memory.devices}

    @property
    def host_bytes_per_token(self) -> int | None:
        """Bytes the host reads from RAM per generated token (weights, experts, KV and state there)."""
        if self.traffic is None:
            return None
        r = self.traffic.reads.get(HOST)
        return r.total if r is not None else 0

    @property
    def pcie_bytes_per_ubatch(self) -> int | None:
        return None if self.traffic is None else self.traffic.link_bytes(self.traffic.ubatch_copies, "pcie")

    @property
    def pcie_bytes_per_prompt_token(self) -> float | None:
        per = self.pcie_bytes_per_ubatch
        return None if per is None or self.traffic is None else per / self.traffic.n_ubatch

    def json(self) -> dict[str, Any]:
        s = self.setting
        out: dict[str, Any] = {"ubatch": s.ubatch, "flags": s.flags(), "fits": self.fits, "why": self.why,
                               "refused": self.refused}
        if self.result is None:
            return out
        k, v = self.cache_types
        out.update({
            "batch": self.batch, "cache_type_k": k, "cache_type_v": v, "argv": list(self.result.argv),
            "expert_layers": {d: {"whole": w, "part": p} for d, (w, p) in self.expert_layers().items()},
            "experts_on_gpus": self.experts_on_gpus(), "gpu_memory": self.gpu_memory(),
            "traffic": self.traffic.json() if self.traffic is not None else {"unmodelled": self.traffic_why},
            "host_bytes_per_token": self.host_bytes_per_token, "pcie_bytes_per_ubatch": self.pcie_bytes_per_ubatch,
            "pcie_bytes_per_prompt_token": self.pcie_bytes_per_prompt_token,
            "speed": self.speed.json() if self.speed is not None else None,
        })
        return out


@dataclass(frozen=True)
class Optimized:
    goal: Goal
    rows: tuple[Row, ...]
    chosen: int | None  # index into rows; None: `why`
    by_prediction: bool  # the choice read predicted tokens/s (else the traffic)
    depth: int | None  # the context depth of the traffic (None: no setting fits)
    why: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def rule(self) -> str:
        return RULES[self.goal][0 if self.by_prediction else 1] + f" ({TIES})"

    @property
    def result(self) -> FitResult:
        if self.chosen is None:
            raise MoeconfError(self.why or "no setting chosen")
        result = self.rows[self.chosen].result
        assert result is not None
        return result

    def json(self) -> dict[str, Any]:
        return {"goal": self.goal, "rule": self.rule, "by": "prediction" if self.by_prediction else "traffic",
                "depth": self.depth, "chosen": self.chosen, "why": self.why, "notes": list(self.notes),
                "rows": [r.json() for r in self.rows]}


def cache_type_list(text: str, eng: Engine) -> list[str]:
    """`--cache-types f16,q8_0` -> the types, each read as the engine reads -ctk/-ctv (K and V alike:
    ik's q8_KV as ik spells it)."""
    from moeconf.engines.settings import cache_types, read_cache_type

    out: list[str] = []
    for w in (w.strip() for w in text.split(",")):
        if not w:
            raise MoeconfError(f"--cache-types {text!r}: a comma-separated list of KV cache types (f16,q8_0)")
        t = read_cache_type(w, eng)
        if t is None:
            raise MoeconfError(f"--cache-types: {eng.label} does not accept cache type {w!r} (it takes "
                               f"{', '.join(sorted(cache_types(eng)))})")
        if t not in out:
            out.append(t)
    return out


def settings_to_try(user: MemorySettings, n_ctx: int,
                    cache_types: Sequence[str] | None) -> tuple[list[Setting], list[str]]:
    """The settings of the table, and notes on the ones left out: each -ub of UBATCHES (and the
    command's own where it gave another), -b raised to it where the command's is smaller, for each
    cache type (K and V alike; None: the command's own). A -ub the context caps to one already tried
    is left out (the engine takes at most -c tokens a batch, llama-context.cpp)."""
    ubs = sorted({*UBATCHES, *([user.n_ubatch] if user.n_ubatch > 0 else [])})
    kinds: list[tuple[str | None, str | None]] = [(t, t) for t in cache_types] if cache_types else [(None, None)]
    out: list[Setting] = []
    notes: list[str] = []
    seen: dict[int, int] = {}
    for ub in ubs:
        batch = max(user.n_batch, ub)
        effective = min(n_ctx, batch, ub)
        if effective in seen:
            notes.append(f"-ub {ub}: left out, the same as -ub {seen[effective]} at -c {n_ctx} (the engine takes at "
                         "most -c tokens a batch)")
            continue
        seen[effective] = ub
        for k, v in kinds:
            out.append(Setting(ub, batch, batch != user.n_batch, k, v))
    return out, notes


def optimize(inv: Inventory, eng: Engine, budgets: Sequence[Budget], user_argv: Sequence[str], goal: Goal, *,
             cache_types: Sequence[str] | None = None, predictor: Predictor | None = None, depth: int | None = None,
             **fit_kwargs: Any) -> Optimized:
    """Fit every setting (`settings_to_try`) for the same budgets and flags (`fit_kwargs`: fit's
    keyword arguments), measure each solved command's traffic at `depth` (default: its context),
    predict its speed with `predictor` (default: none), and choose by `goal` (`choose`). A setting
    that does not fit, or that the engine would refuse, is a row that says why; an error in the
    command itself (a flag the engine does not know) is raised as fit raises it."""
    from moeconf.engines.settings import read_settings
    from moeconf.fit import FitError, default_context, fit
    from moeconf.traffic import TrafficUnmodelled, traffic

    if goal not in GOALS:
        raise MoeconfError(f"--optimize {goal}: one of {', '.join(GOALS)}")
    predictor = predictor or no_predictor
    user = read_settings(list(user_argv), eng)
    n_ctx = user.n_ctx or default_context(inv)
    settings, notes = settings_to_try(user, n_ctx, cache_types)
    rows: list[Row] = []
    refused: list[MoeconfError] = []
    for s in settings:
        try:
            res = fit(inv, eng, budgets, user_argv, fields=s.fields(), **fit_kwargs)
        except FitError as e:
            rows.append(Row(s, None, e.message))
            continue
        except MoeconfError as e:
            # the engine would refuse this setting (a quantized V cache with flash attention off, ...)
            refused.append(e)
            rows.append(Row(s, None, e.message, refused=True))
            continue
        pl, ms = res.compiled.placement, res.memory.settings
        try:
            tr = traffic(pl, ms, depth)
        except TrafficUnmodelled as e:
            rows.append(Row(s, res, traffic_why=str(e), speed=NotPredicted(str(e))))
            continue
        except ValueError as e:
            raise MoeconfError(f"depth: {e}") from None
        rows.append(Row(s, res, traffic=tr, speed=predictor(pl, ms, tr)))
    if refused and len(refused) == len(rows) and len({e.message for e in refused}) == 1:
        raise refused[0]  # every setting refused alike: the command's own problem, said as fit says it
    chosen, by_prediction, why = choose(rows, goal)
    depths = [r.traffic.depth for r in rows if r.traffic is not None]
    return Optimized(goal, tuple(rows), chosen, by_prediction, depths[0] if depths else None, why, tuple(notes))


def choose(rows: Sequence[Row], goal: Goal) -> tuple[int | None, bool, str | None]:
    """(the chosen row's index, whether predictions decided, why none was chosen). Rows are in the
    order ties go to (smaller -ub first, then the cache types in the order given)."""
    fitting = [i for i, r in enumerate(rows) if r.fits]
    if not fitting:
        # the first setting the engine takes (the smallest -ub: the least compute) says what would help
        r = next((r for r in rows if not r.refused), rows[0])
        return None, False, f"no setting fits the budgets; at {r.setting.flags()}: {r.why}"
    speeds = {i: rows[i].speed for i in fitting}
    predicted = {i: s for i, s in speeds.items() if isinstance(s, Speed)}
    by_prediction = len(predicted) == len(fitting)
    if by_prediction:
        # compared as printed, at the digits their error allows: settings whose speeds print alike tie
        # (to the smaller -ub), rather than being told apart by differences inside the error
        from moeconf.speed import rounded

        def shown(v: float, err: float) -> float:
            return float(rounded(v, err).replace(",", ""))

        gen = {i: shown(s.generation_tps, s.generation_error) for i, s in predicted.items()}
        prompt = {i: shown(s.prompt_tps, s.prompt_error) for i, s in predicted.items()}
        return _pick(fitting, goal, gen, prompt, higher=True), True, None
    lacking = [i for i in fitting if rows[i].traffic is None]
    if lacking:
        r = rows[lacking[0]]
        return None, False, (f"--optimize {goal} reads each setting's predicted speed, or its traffic without one: "
                             f"{r.setting.flags()} has neither ({r.traffic_why}); run fit with the -ub you want, or "
                             "--engine llama.cpp, whose traffic is modelled")
    host = {i: float(rows[i].host_bytes_per_token or 0) for i in fitting}
    pcie = {i: float(rows[i].pcie_bytes_per_prompt_token or 0.0) for i in fitting}
    return _pick(fitting, goal, host, pcie, higher=False), False, None


def _pick(order: Sequence[int], goal: Goal, gen: Mapping[int, float], prompt: Mapping[int, float], *,
          higher: bool) -> int:
    """The first row (in `order`) best by the goal's rule: `gen` and `prompt` are tokens/s (higher
    is better) or bytes (lower is better)."""
    def best(values: Mapping[int, float], among: Sequence[int]) -> int:
        target = max(values[i] for i in among) if higher else min(values[i] for i in among)
        return next(i for i in among if values[i] == target)

    if goal == "generation":
        return best(gen, order)
    if goal == "prompt":
        return best(prompt, order)
    top = gen[best(gen, order)]
    near = [i for i in order if (gen[i] >= top * (1 - BALANCED_WITHIN) if higher
                                 else gen[i] <= top * (1 + BALANCED_WITHIN))]
    return best(prompt, near)
