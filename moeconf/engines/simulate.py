"""Simulate an engine: default placement for `-ngl`, and `-ot` rules applied the way the
engines apply them (`std::regex_search`, ECMAScript, unanchored, first match wins)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import repeat

from moeconf.engines import AUTO_GPU, HOST, Engine
from moeconf.engines.regex import RegexProblem
from moeconf.model.homes import global_home, swa_blocks
from moeconf.model.inventory import Inventory, Tensor
from moeconf.model.percache import per_inventory
from moeconf.model.taxonomy import classify_name, mtp_loaded_names, mtp_skipped, unused_kinds

Matcher = Callable[[str], Callable[[str], bool]]


@dataclass(frozen=True)
class OverrideItem:
    """One `regex=DEVICE` item, in the order the engine tests them. `origin` says where it came
    from (a plan rule, `-ot` argument k item j, `--cpu-moe`, an env var)."""

    pattern: str
    device: str
    origin: str = ""

    def render(self) -> str:
        return f"{self.pattern}={self.device}"


def created(t: Tensor, inv: Inventory, eng: Engine) -> bool:
    """Whether the engine's loader creates (and so places) this tensor at all.

    Outside MTP/nextn blocks: always. In one (MTP not loaded, the default): only the tensors the
    architecture's loader creates without the skip flag (moeconf.model.nametable, read from the
    pinned sources): deepseek32 and glm-dsa create the MTP block's `exp_probs_b.bias` with
    TENSOR_NOT_REQUIRED alone, so mainline loads it on its layer's device
    (src/models/deepseek32.cpp, glm-dsa.cpp: load_arch_tensors)."""
    if eng.name == "llama.cpp" and _never_loaded(t.name):
        return False
    if eng.creates_nextn_tensors or t.layer is None:
        return True
    if t.group != "nextn":
        # the loaders that skip MTP blocks pick them by index: the last nextn_predict_layers blocks
        n_nextn = inv.metadata.nextn_predict_layers or 0
        if not (n_nextn and t.layer >= inv.block_count - n_nextn and mtp_skipped(eng.name, inv.arch)):
            return True
    rest = t.name[len(f"blk.{t.layer}."):]
    return rest in mtp_loaded_names(eng.name, inv.arch)


def _never_loaded(name: str) -> bool:
    """Mainline creates tensors of these kinds as unused, whatever the architecture (their
    LLM_TENSOR_INFOS op is GGML_OP_NONE: "model has unused tensor ... -- ignoring",
    src/llama-model-loader.cpp create_tensor)."""
    kinds = classify_name(name).kinds
    return bool(kinds) and all(k in unused_kinds() for k in kinds)


def _splits(gpus: Sequence[str], tensor_split: Sequence[float] | None) -> list[float] | None:
    """`-ts` as each GPU's cumulative share (None: one GPU, or no -ts)."""
    if len(gpus) == 1 or not tensor_split:
        return None
    total = sum(tensor_split[: len(gpus)])
    splits, acc = [], 0.0
    for i in range(len(gpus)):
        acc += tensor_split[i] if i < len(tensor_split) else 0.0
        splits.append(acc / total if total else 0.0)
    return splits


def _gpu_for(il: int, i_gpu_start: int, act: int, gpus: Sequence[str], splits: list[float] | None) -> str:
    """Layer `il`'s GPU by the cumulative shares (`_splits`, computed once per placement)."""
    if len(gpus) == 1:
        return gpus[0]
    if splits is None:
        return AUTO_GPU
    x = float(il - i_gpu_start) / act
    for i, s in enumerate(splits):  # std::upper_bound
        if s > x:
            return gpus[i]
    return gpus[-1]


def layer_gpus(eng: Engine, gpus: Sequence[str], split_mode: str | None,
               main_gpu: int | None) -> tuple[list[str], str | None]:
    """The devices `-ngl` and `-ts` spread layers over, and why the engine would refuse to load.
    llama.cpp with `-sm none` keeps only the model device `-mg` names (default 0; negative: none,
    every layer stays on the CPU) and stops on an index beyond its devices (src/llama.cpp,
    "invalid value for main_gpu"). `-ot` may still name any device. ik_llama.cpp's `-sm none`
    (matrices on the main GPU, the rest by the layer split) is not modelled here."""
    if eng.name != "llama.cpp" or (split_mode or "layer") != "none" or not gpus:
        return list(gpus), None
    mg = 0 if main_gpu is None else main_gpu
    if mg < 0:
        return [], None
    if mg >= len(gpus):
        return list(gpus), (f"-sm none -mg {mg}: {eng.label} stops with \"invalid value for main_gpu: {mg} "
                            f"(available devices: {len(gpus)})\"")
    return [gpus[mg]], None


def offloaded_range(inv: Inventory, eng: Engine, n_gpu_layers: int) -> tuple[int, int]:
    """(first offloaded layer, how many): the layers `-ngl` puts on the accelerators, counting
    the output layer as layer `block_count` where the engine's -ngl counts it (mainline)."""
    n_layer = inv.block_count
    n = n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
    if eng.ngl_counts_output:
        return max(n_layer + 1 - n, 0), min(n, n_layer + 1)
    return max(n_layer - n, 0), min(n, n_layer)


def default_layer_devices(
    inv: Inventory,
    eng: Engine,
    n_gpu_layers: int,
    gpus: Sequence[str],
    tensor_split: Sequence[float] | None = None,
    split_mode: str | None = None,
    layer_devices: Sequence[int] | None = None,
) -> dict[int, str]:
    """Each block's device when no `-ot` rule matches (see default_devices), and the output
    layer's under the index `block_count`."""
    n_layer = inv.block_count
    n = n_layer + 1 if n_gpu_layers < 0 else n_gpu_layers
    i_gpu_start, act = offloaded_range(inv, eng, n_gpu_layers)
    splits = _splits(gpus, tensor_split)

    def layer_device(il: int) -> str:
        if not gpus or act <= 0:
            return HOST
        if il == n_layer:
            if eng.ngl_counts_output:
                on_gpu = il >= i_gpu_start
            elif (split_mode or "layer") in eng.output_on_gpu_any_ngl_modes:
                on_gpu = n > 0
            else:
                on_gpu = n > n_layer
        else:
            on_gpu = il >= i_gpu_start and (il - i_gpu_start) < act
        if not on_gpu:
            return HOST
        if not eng.ngl_counts_output and len(gpus) > 1:
            return gpus[layer_devices[il]] if layer_devices is not None else AUTO_GPU
        return _gpu_for(min(il, n_layer), i_gpu_start, max(act, 1), gpus, splits)

    return {il: layer_device(il) for il in range(n_layer + 1)}


def default_devices(
    inv: Inventory,
    eng: Engine,
    n_gpu_layers: int,
    gpus: Sequence[str],
    tensor_split: Sequence[float] | None = None,
    split_mode: str | None = None,
    layer_devices: Sequence[int] | None = None,
) -> dict[str, str | None]:
    """Where each tensor goes when no `-ot` rule matches it; None for tensors never created.

    `n_gpu_layers` < 0 (auto / all, with `--fit` off) offloads everything. ik_llama.cpp splits
    layers over 2+ devices by free memory, which the files do not tell: those layers get
    GPU(auto), unless `layer_devices` (ik's device index per block, then the output layer) says
    where they went: read from its log, or predicted from `-ts` (moeconf/iksplit.py, which the
    callers run since it needs the context and cache settings)."""
    per_layer: dict[int, str | None] = dict(
        default_layer_devices(inv, eng, n_gpu_layers, gpus, tensor_split, split_mode, layer_devices))
    per_layer[_NOT_CREATED] = None
    per_layer[_INPUT] = HOST  # the input layer (token_embd) always stays on the CPU
    names, ats = _home_columns(inv, eng)
    return dict(zip(names, map(per_layer.get, ats, repeat(HOST)), strict=True))


_NOT_CREATED, _INPUT = -2, -1


def home_layer(t: Tensor, inv: Inventory, eng: Engine) -> int:
    """The layer whose device `t` takes: its block; for a tensor outside `blk.N` the layer the
    engine's loader puts it in (moeconf.model.homes, from the pinned sources): the output layer
    (as `block_count`), a block, or the input layer (-1)."""
    if t.layer is not None:
        return t.layer
    md = inv.metadata
    home = global_home(eng.name, inv.arch, t.name, swa_blocks(md.sliding_window_pattern, inv.block_count))
    if home == "output":
        return inv.block_count
    if home == "input":
        return _INPUT
    return home


@per_inventory
def output_layer_tensors(inv: Inventory, eng: Engine) -> tuple[str, ...]:
    """The created tensors the engine puts in the output layer (`output.weight`, `output_norm`,
    DeepSeek-V4's `output_hc_*`, LFM2's `token_embd_norm`, ...): they share its default device,
    which a tied output's copy of token_embd also takes."""
    return tuple(name for name, at in _homes(inv, eng) if at == inv.block_count
                 and inv.by_name[name].layer is None)


@per_inventory
def _homes(inv: Inventory, eng: Engine) -> tuple[tuple[str, int], ...]:
    """Each tensor's name and the layer whose device it takes (the output layer as block_count):
    a fit asks for the default placement of every split it tries."""
    return tuple((t.name, _NOT_CREATED if not created(t, inv, eng) else home_layer(t, inv, eng)) for t in inv.tensors)


@per_inventory
def _home_columns(inv: Inventory, eng: Engine) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """`_homes` as two columns, names and layers (a fit builds the default placement ~80 times)."""
    homes = _homes(inv, eng)
    return tuple(n for n, _ in homes), tuple(a for _, a in homes)


@cache
def python_matcher(pattern: str) -> Callable[[str], bool]:
    rx = re.compile(pattern)
    return lambda name: rx.search(name) is not None


@cache
def ecmascript_matcher(pattern: str) -> Callable[[str], bool]:
    """ECMAScript semantics through the `regress` engine (what std::regex ECMAScript reads), for
    patterns moeconf wrote. Raises ValueError for a pattern std::regex refuses. User patterns go
    through `bounded_matcher`, which also bounds the time."""
    from moeconf.engines.regex import check_regex, ecmascript_compiled

    problem = check_regex(pattern)
    if problem is not None:
        raise ValueError(f"{pattern!r}: {problem.message}")
    rx = ecmascript_compiled(pattern)
    return lambda name: rx.find(name) is not None


def bounded_matcher(names: Sequence[str]) -> tuple[Matcher, dict[str, RegexProblem]]:
    """A matcher for user patterns over `names` that never raises and never runs long: each
    pattern is matched once over all names, in bounded time (engines/regex.py). Patterns that
    std::regex refuses or that take too long match nothing and are listed in the dict."""
    from moeconf.engines.regex import ecmascript_search

    problems: dict[str, RegexProblem] = {}

    def matcher(pattern: str) -> Callable[[str], bool]:
        found = ecmascript_search(pattern, names)
        if isinstance(found, frozenset):
            return found.__contains__
        problems[pattern] = found
        return lambda _name: False

    return matcher, problems


@dataclass(frozen=True)
class Simulation:
    devices: dict[str, str | None]  # tensor -> device (None: not created)
    matched_by: dict[str, int | None]  # tensor -> index of the first matching item
    hits: tuple[int, ...]  # per item: how many created tensors it was the first match for
    touches: tuple[int, ...]  # per item: how many created tensors it matches at all


def simulate(
    inv: Inventory,
    items: Sequence[OverrideItem],
    defaults: Mapping[str, str | None],
    matcher: Matcher = python_matcher,
) -> Simulation:
    tests = [matcher(it.pattern) for it in items]
    devices: dict[str, str | None] = {}
    matched_by: dict[str, int | None] = {}
    hits = [0] * len(items)
    touches = [0] * len(items)
    for t in inv.tensors:
        d = defaults.get(t.name)
        if d is None:
            devices[t.name] = None
            matched_by[t.name] = None
            continue
        first: int | None = None
        for k, test in enumerate(tests):
            if test(t.name):
                touches[k] += 1
                if first is None:
                    first = k
        if first is not None:
            hits[first] += 1
            devices[t.name] = items[first].device
        else:
            devices[t.name] = d
        matched_by[t.name] = first
    return Simulation(devices, matched_by, tuple(hits), tuple(touches))
