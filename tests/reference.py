"""A small reference model of plans and of the two engines, written for the tests from
shared/engine-facts.md and the engines' own loaders (mainline `llama-model.cpp`, ik_llama.cpp
`src/llama.cpp`), sharing no code with moeconf's resolver, simulator or argv reader. The
property tests compare moeconf's output with it, so a bug in moeconf's engine model (match order,
`-ngl` counting, the `-ts` split, which rules run first) shows up as a disagreement instead of
being checked against itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import regress

from moeconf.model import nametable
from moeconf.model.inventory import Inventory, Tensor

AUTO = "GPU(auto)"  # a GPU the engine picks by free memory: not knowable from the files


@dataclass(frozen=True)
class Facts:
    """What the reference needs to know about an engine version (engine-facts sections 2, 4, 5)."""

    ngl_counts_output: bool  # mainline: -ngl N = output layer + the last N-1 blocks
    drops_ot_without_gpu: bool  # ik (newer than 0.1.5): -ngl 0 or no GPU ignores every -ot
    creates_nextn: bool  # does the loader create a nextn block's tensors
    ik_moe_rules: bool  # --n-cpu-moe: ik's (after every user -ot; the last N layers with experts)
    gate_up: bool  # mainline --cpu-moe pattern has gate_up (b8307+)
    loader: str = "llama.cpp"  # whose loader facts (moeconf.model.nametable, read from its source) apply


FACTS: dict[tuple[str, str | None], Facts] = {
    ("llama.cpp", None): Facts(ngl_counts_output=True, drops_ot_without_gpu=False, creates_nextn=False,
                               ik_moe_rules=False, gate_up=True),
    ("llama.cpp", "b7600"): Facts(ngl_counts_output=True, drops_ot_without_gpu=False, creates_nextn=False,
                                  ik_moe_rules=False, gate_up=False),
    ("ik_llama.cpp", None): Facts(ngl_counts_output=False, drops_ot_without_gpu=True, creates_nextn=False,
                                  ik_moe_rules=True, gate_up=True, loader="ik_llama.cpp"),
    # 0.1.5's --n-cpu-moe (engine-facts 4) is not modelled here: the property tests give it none.
    # It skips a nextn block's tensors without -mtp (the engine suite's runs; engine-facts 2 said
    # otherwise before those runs)
    ("ik_llama.cpp", "0.1.5"): Facts(ngl_counts_output=False, drops_ot_without_gpu=False, creates_nextn=False,
                                     ik_moe_rules=True, gate_up=True, loader="ik_llama.cpp"),
}


def plan_placement(inv: Inventory, rules: Sequence[tuple[Sequence[str], str, str]], gpus: Sequence[str],
                   defaults: dict[str, str | None]) -> dict[str, str | None]:
    """A plan's meaning: each tensor goes where the LAST rule that selects it says, else its
    default. `rules` are (targets, layer set text, device word)."""
    out = dict(defaults)
    kinds = {layer.index: layer.kind for layer in inv.layers}
    for targets, layers, word in rules:
        device = _device(word, gpus)
        chosen = [t for t in inv.tensors if any(_target(t, w) for w in targets)]
        chosen = _layer_filter(chosen, layers, inv.block_count - 1, kinds)
        for t in chosen:
            if out[t.name] is not None:
                out[t.name] = device
    return out


def _device(word: str, gpus: Sequence[str]) -> str:
    if word == "cpu":
        return "CPU"
    if word.startswith("gpu"):
        return gpus[int(word[3:] or 0)]
    return word


def _target(t: Tensor, word: str) -> bool:
    if word == "all":
        return True
    if word == "layer":
        return t.layer is not None
    return t.group == word or t.base == word


def _layer_filter(ts: list[Tensor], layers: str, last: int, kinds: dict[int, str]) -> list[Tensor]:
    spec = layers.strip()
    if not spec:
        return ts
    if spec.startswith(("first ", "last ")):
        k = int(spec.split()[1])
        have = sorted({t.layer for t in ts if t.layer is not None})
        keep = set(have[:k] if spec.startswith("first") else have[-k:])
        return [t for t in ts if t.layer in keep]
    body = spec.removeprefix("layers ").strip()
    if body in ("moe", "dense", "nextn"):
        return [t for t in ts if t.layer is not None and kinds.get(t.layer) == body]
    wanted: set[int] = set()
    for part in body.split(","):
        part = part.strip()
        if ".." in part:
            lo, hi = part.split("..")
            wanted.update(range(int(lo) if lo else 0, (int(hi) if hi else last) + 1))
        else:
            wanted.add(int(part))
    return [t for t in ts if t.layer in wanted]


def default_placement(inv: Inventory, facts: Facts, ngl: int, gpus: Sequence[str],
                      ts: Sequence[float] | None, sm: str | None) -> dict[str, str | None]:
    """Where each tensor goes with no override (None: never created)."""
    n_layer = inv.block_count
    kinds = {layer.index: layer.kind for layer in inv.layers}
    if facts.ngl_counts_output:
        layer_dev = _mainline_layers(n_layer, ngl, gpus, ts)
    else:
        layer_dev = _ik_layers(n_layer, ngl, gpus, sm)
    # the loaders' MTP facts, generated from their sources: the architectures whose loader skips
    # the last nextn_predict_layers blocks, and the tensors it still creates there
    ml = facts.loader == "llama.cpp"
    skips = inv.arch in (nametable.ML_MTP_SKIPPED if ml else nametable.IK_MTP_SKIPPED)
    still = set((nametable.ML_MTP_LOADED if ml else nametable.IK_MTP_LOADED).get(inv.arch, ()))
    n_nextn = inv.metadata.nextn_predict_layers or 0
    unused = {n for table in (nametable.BLOCK_TENSORS, nametable.GLOBAL_TENSORS) for n, ks in table.items()
              if all(k in nametable.ML_UNUSED_KINDS for k in ks)} if ml else set()
    out: dict[str, str | None] = {}
    for t in inv.tensors:
        rest = t.name[len(f"blk.{t.layer}."):] if t.layer is not None else t.name
        if rest.rsplit(".", 1)[0] in unused:
            out[t.name] = None
        elif t.layer is not None:
            mtp = kinds.get(t.layer) == "nextn" or (skips and n_nextn and t.layer >= n_layer - n_nextn)
            if mtp and not facts.creates_nextn and rest not in still:
                out[t.name] = None
            else:
                out[t.name] = layer_dev[t.layer]
        else:
            home = _global_home(inv, t, ml)
            out[t.name] = "CPU" if home is None else layer_dev[n_layer if home == "output" else home]
    return out


def _global_home(inv: Inventory, t: Tensor, ml: bool) -> str | int | None:
    """The layer of a tensor outside `blk.N` by the engines' generated tables (the loaders' own
    facts: moeconf.model.layertable): "output", a block, or None for the input layer (host)."""
    from moeconf.model import layertable

    stem = t.name.rsplit(".", 1)[0] if t.name.endswith((".weight", ".bias")) else t.name
    kinds = set(nametable.GLOBAL_TENSORS.get(stem, ()))
    # (an architecture ik does not know, which ik refuses to load: mainline's kinds, as moeconf reads it)
    made = set((nametable.ML_ARCH_TENSORS if ml else nametable.IK_ARCH_TENSORS).get(inv.arch, ())
               or nametable.ML_ARCH_TENSORS.get(inv.arch, ()))
    kinds = (kinds & made) or kinds
    if not ml and inv.arch in layertable.IK_GLOBAL_HOMES:
        homes = {layertable.IK_GLOBAL_HOMES[inv.arch].get(k) for k in kinds}
        if "output" in homes:
            return "output"
        block = next((h for h in homes if h is not None and h.startswith("block")), None)
        return None if block is None else _first(block[len("block"):].strip(), inv)
    classes = {layertable.ML_TENSOR_LAYERS.get(k) for k in kinds}
    if "output" in classes:
        return "output"
    if "repeating" in classes:
        for k in kinds:
            if k in layertable.ML_BLOCK_HOMES.get(inv.arch, {}):
                block, guard, _ = layertable.ML_BLOCK_HOMES[inv.arch][k]
                return block if block >= 0 else _first(guard, inv)
        return 0
    return None


def _first(guard: str, inv: Inventory) -> int:
    """The first block where a loader's guard holds: '' any; 'full_attention' no sliding window
    (an array of flags in attention.sliding_window_pattern; else the last block of each period)."""
    if guard != "full_attention":
        return 0
    pat = inv.metadata.sliding_window_pattern
    for il in range(inv.block_count):
        swa = (bool(pat[il]) if il < len(pat) else False) if isinstance(pat, tuple) else (
            pat is not None and (pat == 0 or il % pat < pat - 1))
        if not swa:
            return il
    return 0


def _mainline_layers(n_layer: int, ngl: int, gpus: Sequence[str], ts: Sequence[float] | None) -> list[str]:
    # llama-model.cpp: i_gpu_start = max(n_layer + 1 - ngl, 0), act = min(ngl, n_layer + 1), then
    # std::upper_bound over the float32 cumulative split points
    start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1) if gpus else 0
    if ts and any(x != 0 for x in ts[: len(gpus)]):
        parts = [np.float32(ts[i]) if i < len(ts) else np.float32(0) for i in range(len(gpus))]
        acc = np.float32(0)
        cum = []
        for p in parts:
            acc = np.float32(acc + p)
            cum.append(acc)
        splits = [np.float32(c / acc) for c in cum]
    else:
        splits = None
    out = []
    for il in range(n_layer + 1):
        if il < start or il - start >= act:
            out.append("CPU")
        elif len(gpus) == 1:
            out.append(gpus[0])
        elif splits is None:
            out.append(AUTO)
        else:
            x = np.float32(np.float32(il - start) / np.float32(act))
            k = next((i for i, s in enumerate(splits) if s > x), len(splits))
            out.append(gpus[min(k, len(gpus) - 1)])
    return out


def _ik_layers(n_layer: int, ngl: int, gpus: Sequence[str], sm: str | None) -> list[str]:
    # src/llama.cpp: i_gpu_start = max(n_layer - ngl, 0); the output layer is offloaded when
    # ngl > n_layer, or, outside `-sm layer`, whenever ngl > 0. Several GPUs: by free memory.
    start = max(n_layer - ngl, 0)
    gpu = gpus[0] if len(gpus) == 1 else AUTO
    out = ["CPU" if (il < start or not gpus or ngl <= 0) else gpu for il in range(n_layer)]
    mode = sm or "layer"
    on = bool(gpus) and (ngl > n_layer or (mode != "layer" and ngl > 0))
    out.append(gpu if on else "CPU")
    return out


def read_argv(argv: Sequence[str]) -> tuple[int | None, list[float] | None, str | None, list[tuple[str, object]]]:
    """(-ngl, -ts, -sm, the placement sources in command-line order) of a command line, by hand:
    ("ot", [(pattern, device), ...]), ("cpu-moe", None), ("n-cpu-moe", N)."""
    ngl = ts = sm = None
    sources: list[tuple[str, object]] = []
    for k, a in enumerate(argv):
        nxt = argv[k + 1] if k + 1 < len(argv) else ""
        if a in ("-ngl", "--n-gpu-layers", "--gpu-layers"):
            ngl = int(nxt)
        elif a in ("-ts", "--tensor-split"):
            ts = [float(x) for x in nxt.split(",")]
        elif a in ("-sm", "--split-mode"):
            sm = nxt
        elif a in ("-ot", "--override-tensor"):
            sources.append(("ot", [tuple(item.split("=", 1)) for item in nxt.split(",")]))
        elif a in ("-cmoe", "--cpu-moe"):
            sources.append(("cpu-moe", None))
        elif a in ("-ncmoe", "--n-cpu-moe"):
            sources.append(("n-cpu-moe", int(nxt)))
    return ngl, ts, sm, sources


def _moe_items(inv: Inventory, facts: Facts, kind: str, n: int | None) -> list[tuple[str, str]]:
    """The CPU rules --cpu-moe / --n-cpu-moe N add (engine-facts 4, newest builds, one GPU)."""
    if facts.ik_moe_rules:
        kinds = {layer.index: layer.kind for layer in inv.layers}
        with_experts = sorted({t.layer for t in inv.tensors if t.layer is not None
                               and t.name.startswith(f"blk.{t.layer}.ffn_down_exps.") and kinds[t.layer] != "nextn"})
        take = with_experts if kind == "cpu-moe" else (with_experts[-n:] if n else [])
        return [(rf"blk\.{il}\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)", "CPU") for il in take]
    body = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps" if facts.gate_up else r"\.ffn_(up|down|gate)_(ch|)exps"
    if kind == "cpu-moe":
        return [(body, "CPU")]
    return [(rf"blk\.{il}" + body, "CPU") for il in range(min(n or 0, inv.block_count))]


def engine_placement(inv: Inventory, facts: Facts, argv: Sequence[str], gpus: Sequence[str],
                     default_ngl: int) -> dict[str, str | None]:
    """What the engine does with `argv`: std::regex_search (ECMAScript) of each item in order,
    the first match wins; tensors no item matches keep the `-ngl` default. Mainline tests the
    sources in command-line order; ik_llama.cpp every user -ot first, then its MoE rules."""
    ngl, ts, sm, sources = read_argv(argv)
    n = default_ngl if ngl is None else ngl
    defaults = default_placement(inv, facts, n, gpus, ts, sm)
    user: list[tuple[str, str]] = []
    moe: list[tuple[str, str]] = []
    ordered: list[tuple[str, str]] = []
    for kind, value in sources:
        if kind == "ot":
            items = list(value)  # type: ignore[call-overload]
            user += items
            ordered += items
        else:
            rules = _moe_items(inv, facts, kind, value)  # type: ignore[arg-type]
            moe += rules
            ordered += rules
    items = user + moe if facts.ik_moe_rules else ordered
    if facts.drops_ot_without_gpu and (n == 0 or not gpus):
        items = []
    compiled = [(regress.Regex(p), d) for p, d in items]
    out: dict[str, str | None] = {}
    for t in inv.tensors:
        d = defaults[t.name]
        if d is not None:
            for rx, dev in compiled:
                if rx.find(t.name) is not None:
                    d = dev
                    break
        out[t.name] = d
    return out
