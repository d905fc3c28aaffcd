"""`moeconf fit`: the most routed-expert layers that fit each GPU's memory budget, as a plan that
compiles to a verified command line.

Always-active tensors (attention, shared experts, router, norms, output) and every layer's KV
cache go to the GPUs (all layers offloaded; with several GPUs, `-ts` gives each a contiguous
range sized by its budget); routed experts start in system RAM and whole layers move to the GPU
holding them, lowest blocks first (`first`, the guides' layout) or highest (`last`), while the
device's predicted total (weights + KV + compute + reserve) stays within its budget. Optionally
one more layer per GPU is split by tensor kind (down, gate, up: each that fits). The result is re-checked
with the memory model on the compiled command line before it is returned; the user's context,
batch and cache types are never changed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from moeconf.compile import Compiled, compile_plan
from moeconf.engines import Engine
from moeconf.errors import MoeconfError
from moeconf.explanation import explain
from moeconf.memory import MemoryEstimate, estimate_explained, pipeline_parallel, read_settings
from moeconf.memory.estimate import alloc_size
from moeconf.model.inventory import Inventory, format_ranges
from moeconf.placement import Placement
from moeconf.plan import plan_from_text
from moeconf.resolve import resolve

MiB = 1024 * 1024
Policy = Literal["first", "last"]
SPLIT_KINDS = ("ffn_down_exps", "ffn_gate_exps", "ffn_up_exps")  # the order llama.cpp's fit overflows them

# engine flags fit decides itself
_REFUSED = {"-ngl", "--gpu-layers", "--n-gpu-layers", "-ot", "--override-tensor", "-ts", "--tensor-split",
            "-ncmoe", "--n-cpu-moe", "-cmoe", "--cpu-moe", "-fit", "--fit", "-m", "--model"}
# engine flags that are plan fields; the rest goes to flags.extra as written
_FIELDS = {"-c": "ctx_size", "--ctx-size": "ctx_size", "-b": "batch", "--batch-size": "batch",
           "-ub": "ubatch", "--ubatch-size": "ubatch", "-ctk": "cache_type_k", "--cache-type-k": "cache_type_k",
           "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v", "-fa": "flash_attn", "--flash-attn": "flash_attn",
           "-sm": "split_mode", "--split-mode": "split_mode", "-mg": "main_gpu", "--main-gpu": "main_gpu"}
_INT_FIELDS = {"ctx_size", "batch", "ubatch", "main_gpu"}
_SWITCHES_WITH_VALUE = {"-np", "--parallel", "-mla", "--mla-use", "-t", "--threads", "-amb"}


class FitError(MoeconfError):
    """The budgets cannot hold even the always-active tensors, KV cache and compute."""


@dataclass(frozen=True)
class Budget:
    device: str  # buffer-type name (CUDA0, RPC0[host:port])
    size: int  # bytes


@dataclass(frozen=True)
class FitResult:
    plan_text: str
    compiled: Compiled
    memory: MemoryEstimate
    gpu_expert_layers: dict[str, list[int]]  # device -> blocks whose routed experts it holds
    split_layers: tuple[tuple[int, str, tuple[str, ...]], ...]  # (block, device, kinds): layers split by kind
    budgets: tuple[Budget, ...]

    @property
    def argv(self) -> tuple[str, ...]:
        return self.compiled.argv

    @property
    def ot(self) -> str:
        return self.compiled.ot

    def json(self) -> dict[str, object]:
        return {"argv": list(self.argv), "ot": self.ot, "memory": self.memory.json(),
                "budgets": {b.device: b.size for b in self.budgets},
                "gpu_expert_layers": {d: ls for d, ls in self.gpu_expert_layers.items()}}


def _engine_flags(argv: Sequence[str]) -> tuple[dict[str, object], list[str], list[str]]:
    """User engine flags -> (plan flag fields, rpc servers, extra arguments)."""
    fields: dict[str, object] = {}
    rpc: list[str] = []
    extra: list[str] = []
    i = 0
    words = list(argv)
    while i < len(words):
        w = words[i]
        name, eq, inline = w.partition("=") if w.startswith("--") else (w, "", "")
        if name in _REFUSED:
            raise MoeconfError(f"fit chooses {name} itself: leave it out (and give budgets with --gpu)")
        needs = name in _FIELDS or name == "--rpc" or name in _SWITCHES_WITH_VALUE or name in (
            "-dev", "--device", "--host", "--port", "-a", "--alias")
        value = inline if eq else None
        if needs and value is None:
            if name in ("-fa", "--flash-attn") and (i + 1 >= len(words) or words[i + 1].startswith("-")):
                value = "on"
            elif i + 1 >= len(words):
                raise MoeconfError(f"{name} needs a value")
            else:
                value = words[i + 1]
                i += 1
        i += 1
        if name == "--rpc":
            assert value is not None
            rpc += [s for s in value.split(",") if s]
        elif name in _FIELDS:
            key = _FIELDS[name]
            assert value is not None
            if key in _INT_FIELDS:
                try:
                    fields[key] = int(value)
                except ValueError:
                    raise MoeconfError(f"{name} needs a number, not {value!r}") from None
            elif key == "flash_attn":
                low = value.lower()
                fields[key] = "on" if low in ("on", "1", "true", "enabled") else (
                    "off" if low in ("off", "0", "false", "disabled") else "auto")
            else:
                fields[key] = value
        else:
            extra += [name, value] if value is not None and not eq else [w]
    return fields, rpc, extra


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _plan_text(model_path: str, serve_path: str | None, eng: Engine, gpus: list[str], rpc: list[str],
               fields: dict[str, object],
               extra: list[str], ts: list[int] | None, rules: list[str], budgets: Sequence[Budget],
               reserve: int, policy: Policy) -> str:
    lines = ["# Written by `moeconf fit`: routed experts on the GPUs up to each budget, the rest in RAM.",
             "# Budgets used (total per device, reserve included): "
             + ", ".join(f"{b.device} = {b.size / 2**30:.2f} GiB" for b in budgets)
             + f"; reserve {reserve / 2**30:.2f} GiB per GPU; policy {policy}.",
             "# Edit the rules freely; `moeconf explain` shows what a change costs.",
             "rules = ["]
    lines += [f"  {_toml_str(r)}," for r in rules]
    lines += ["]", "", "[model]", f"path = {_toml_str(model_path)}"]
    if serve_path:
        lines.append(f"serve_path = {_toml_str(serve_path)}")
    lines += ["", "[engine]", f"name = {_toml_str(eng.name)}"]
    if eng.version:
        lines.append(f"version = {_toml_str(eng.version)}")
    lines.append("gpus = [" + ", ".join(_toml_str(g) for g in gpus) + "]")
    lines += ["", "[flags]", 'n_gpu_layers = "all"']
    for k, v in fields.items():
        lines.append(f"{k} = {v}" if isinstance(v, int) else f"{k} = {_toml_str(str(v))}")
    if ts:
        lines.append("tensor_split = [" + ", ".join(str(x) for x in ts) + "]")
    if rpc:
        lines.append("rpc = [" + ", ".join(_toml_str(r) for r in rpc) + "]")
    if extra:
        lines.append("extra = [" + ", ".join(_toml_str(x) for x in extra) + "]")
    return "\n".join(lines) + "\n"


def _rules(inv: Inventory, assigned: dict[str, list[int]], splits: list[tuple[int, str, tuple[str, ...]]],
           names: dict[str, str]) -> list[str]:
    rules = ["experts -> cpu"]
    for dev, layers in assigned.items():
        if layers:
            rules.append(f"experts layers {format_ranges(layers, '..')} -> {names[dev]}")
    for il, dev, kinds in splits:
        rules.append(f"{', '.join(kinds)} layers {il} -> {names[dev]}")
    return rules


class _Solver:
    def __init__(self, inv: Inventory, eng: Engine, budgets: Sequence[Budget], user_argv: Sequence[str],
                 model_path: str, serve_path: str | None, plan_dir: str, reserve: int, policy: Policy,
                 split: bool) -> None:
        self.inv, self.eng, self.budgets, self.reserve, self.policy, self.split = (
            inv, eng, list(budgets), reserve, policy, split)
        self.fields, self.rpc, self.extra = _engine_flags(user_argv)
        self.model_path = model_path
        self.serve_path = serve_path
        self.plan_dir = plan_dir
        rpc_names = [f"RPC0[{s}]" if eng.rpc_indexed else f"RPC[{s}]" for s in self.rpc]
        for b in self.budgets:
            if b.device.startswith("RPC") and b.device not in rpc_names:
                raise MoeconfError(f"--gpu {b.device}: no such RPC device; give its server with --rpc "
                                   f"(devices from --rpc: {', '.join(rpc_names) or 'none'})")
            problem = eng.device_name_error(b.device)
            if problem or b.device == "CPU":
                raise MoeconfError(f"--gpu {b.device}: {problem or 'the CPU is not a GPU'}")
        self.gpus = [b.device for b in self.budgets if not b.device.startswith("RPC")]
        # the engine's device order: RPC servers first, then local GPUs
        self.order = [*[r for r in rpc_names if r in {b.device for b in self.budgets}], *self.gpus]
        missing = [r for r in rpc_names if r not in self.order]
        if missing:
            raise MoeconfError(f"give a budget for every --rpc device: --gpu '{missing[0]}=SIZE'")
        self.budget = {b.device: b.size for b in self.budgets}
        self.names = {d: d for d in self.order}
        self.settings = read_settings(list(user_argv), eng, reserve=reserve)
        if self.settings.problems:
            raise MoeconfError("; ".join(self.settings.problems))

    def _text(self, assigned: dict[str, list[int]], splits: list[tuple[int, str, tuple[str, ...]]],
              ts: list[int] | None) -> str:
        return _plan_text(self.model_path, self.serve_path, self.eng, self.gpus, self.rpc, self.fields, self.extra,
                          ts, _rules(self.inv, assigned, splits, self.names), self.budgets, self.reserve,
                          self.policy)

    def measure(self, assigned: dict[str, list[int]], splits: list[tuple[int, str, tuple[str, ...]]],
                ts: list[int] | None) -> tuple[Placement, MemoryEstimate]:
        """The plan's placement (resolved, not yet compiled to -ot) and its memory."""
        from moeconf.memory import estimate

        plan = plan_from_text(self._text(assigned, splits, ts), os.path.join(self.plan_dir, "fit.plan.toml"))
        placement = resolve(plan, self.inv).placement
        overrides = any(placement.devices[n] != d for n, d in placement.defaults.items())
        pipe = pipeline_parallel(placement, len(self.order), -1, self.fields.get("split_mode"),  # type: ignore[arg-type]
                                 self.settings, overrides)
        return placement, estimate(placement, self.settings, pipeline=pipe)

    def compile(self, assigned: dict[str, list[int]], splits: list[tuple[int, str, tuple[str, ...]]],
                ts: list[int] | None) -> tuple[str, Compiled, MemoryEstimate]:
        """Compile to the engine's command line, simulate that command line, and measure it."""
        text = self._text(assigned, splits, ts)
        plan = plan_from_text(text, os.path.join(self.plan_dir, "fit.plan.toml"))
        compiled = compile_plan(plan, inventory=self.inv)
        argv = list(compiled.argv)
        ex = explain(self.inv, self.eng, argv, gpus=self.gpus)
        if ex.placement.devices != compiled.placement.devices:
            raise AssertionError("fit: the compiled command line does not reproduce the plan's placement")
        settings = read_settings(argv, self.eng, reserve=self.reserve)
        if settings.problems:
            raise MoeconfError("; ".join(settings.problems))
        return text, compiled, estimate_explained(ex, settings)

    def over(self, mem: MemoryEstimate) -> dict[str, int]:
        return {d: mem.devices[d].total - self.budget[d] for d in self.order
                if d in mem.devices and mem.devices[d].total > self.budget[d]}

    def solve(self) -> FitResult:
        ts = self._tensor_split()
        assigned: dict[str, list[int]] = {d: [] for d in self.order}
        placement, mem = self.measure(assigned, [], ts)
        if not mem.complete:
            raise FitError("this model's memory cannot be computed: " + "; ".join(mem.notes))
        over = self.over(mem)
        if over:
            raise self._infeasible(mem, over)
        home = self._homes(placement)
        free = {d: self.budget[d] - mem.devices[d].total for d in self.order}
        layers = sorted({t.layer for t in self.inv.tensors if t.group == "experts" and t.layer is not None})
        if self.policy == "last":
            layers.reverse()
        sizes = self._expert_sizes(placement)
        closed: set[str] = set()
        candidates: list[tuple[int, str]] = []
        for il in layers:
            dev = home.get(il)
            if dev is None or dev in closed:
                continue
            need = sizes.get((il, dev), 0)
            if need <= free[dev]:
                assigned[dev].append(il)
                free[dev] -= need
            else:
                closed.add(dev)
                candidates.append((il, dev))
        splits = self._split(candidates, free) if self.split else []
        # measure the whole model; back off one layer at a time where a device overflows
        while True:
            placement, mem = self.measure(assigned, splits, ts)
            over = self.over(mem)
            if not over:
                break
            if any(sp[1] in over for sp in splits):
                splits = [sp for sp in splits if sp[1] not in over]
                continue
            for d in over:
                if not assigned[d]:
                    raise self._infeasible(mem, over)
                assigned[d].pop()
        # the command line itself, simulated and measured again: what is printed is what was checked
        text, compiled, mem = self.compile(assigned, splits, ts)
        if compiled.placement.devices != placement.devices or self.over(mem):
            raise AssertionError("fit: the compiled command line does not match the solved placement")
        return FitResult(text, compiled, mem, {d: sorted(v) for d, v in assigned.items()}, tuple(splits),
                         tuple(self.budgets))

    def _split(self, candidates: list[tuple[int, str]],
               free: dict[str, int]) -> list[tuple[int, str, tuple[str, ...]]]:
        """One more layer per device, by tensor kind (down, gate, up: each that still fits)."""
        out = []
        for il, dev in candidates:
            kinds: list[str] = []
            room = free[dev]
            for kind in SPLIT_KINDS:
                t = self.inv.by_name.get(f"blk.{il}.{kind}.weight")
                if t is None:
                    continue
                need = alloc_size(t, dev)
                if need <= room:
                    kinds.append(kind)
                    room -= need
            if kinds:
                out.append((il, dev, tuple(kinds)))
        return out

    def _tensor_split(self) -> list[int] | None:
        if len(self.order) < 2:
            return None
        usable = [max(self.budget[d] - self.reserve, 1) for d in self.order]
        return [max(1, round(u / MiB)) for u in usable]

    def _homes(self, placement: Placement) -> dict[int, str]:
        out: dict[int, str] = {}
        for t in self.inv.tensors:
            if t.layer is not None and t.layer not in out:
                d = placement.defaults.get(t.name)
                if d in self.budget:
                    out[t.layer] = d
        return out

    def _expert_sizes(self, placement: Placement) -> dict[tuple[int, str], int]:
        """Bytes a layer's routed experts take on each device (aligned and padded as there)."""
        out: dict[tuple[int, str], int] = {}
        for t in self.inv.tensors:
            if t.group == "experts" and t.layer is not None and placement.devices.get(t.name) is not None:
                for dev in self.order:
                    out[(t.layer, dev)] = out.get((t.layer, dev), 0) + alloc_size(t, dev)
        return out

    def _infeasible(self, mem: MemoryEstimate, over: dict[str, int]) -> FitError:
        parts = []
        s = mem.settings
        for d, short in over.items():
            m = mem.devices[d]
            parts.append(f"{d} needs {m.total / MiB:,.0f} MiB (weights {m.weights / MiB:,.0f}, KV {m.kv / MiB:,.0f}, "
                         f"compute {m.compute / MiB:,.0f}, reserve {m.reserve / MiB:,.0f}) with every routed expert "
                         f"in system RAM: {short / MiB:,.0f} MiB over its {self.budget[d] / MiB:,.0f} MiB budget")
        hints = []
        kv = sum(mem.devices[d].kv for d in over)
        if kv:
            hints.append(f"a smaller -c (the KV cache takes {kv / MiB:,.0f} MiB there; half the context, half of it)")
            if s.cache_type_k == "f16" or s.cache_type_v == "f16":
                hints.append("-ctk q8_0 -ctv q8_0 (about half the KV cache)")
        if s.n_ubatch > 128:
            hints.append(f"a smaller -ub (compute grows with it; -ub {s.n_ubatch // 2} roughly halves it)")
        hints.append("fewer layers on the GPU, or a smaller --reserve if you know your driver's overhead")
        return FitError("does not fit: " + "; ".join(parts) + ". What would help: " + "; ".join(hints))


def fit(inv: Inventory, eng: Engine, budgets: Sequence[Budget], user_argv: Sequence[str], *, model_path: str,
        plan_dir: str, reserve: int, policy: Policy = "first", split: bool = True,
        serve_path: str | None = None) -> FitResult:
    """Solve the placement; raise FitError (with the shortfall and what would help) if nothing fits.
    `serve_path`: the GGUF path the engine loads, needed when `model_path` is a manifest."""
    if not budgets:
        raise MoeconfError("give at least one --gpu SIZE")
    if serve_path is None and model_path.endswith(".json"):
        serve_path = manifest_gguf_name(model_path, plan_dir)
    return _Solver(inv, eng, budgets, user_argv, model_path, serve_path, plan_dir, reserve, policy,
                   split).solve()


def manifest_gguf_name(model_path: str, plan_dir: str) -> str:
    """The GGUF file name a manifest was made from (its `source.file`), else NAME.gguf."""
    import json

    path = model_path if os.path.isabs(model_path) else os.path.join(plan_dir, model_path)
    try:
        with open(path) as f:
            src = json.load(f).get("source") or {}
        name = src.get("file") if isinstance(src, dict) else None
    except (OSError, ValueError):
        name = None
    return name if isinstance(name, str) and name else os.path.basename(model_path).removesuffix(
        ".manifest.json").removesuffix(".json") + ".gguf"
