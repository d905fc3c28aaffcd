"""`moeconf fit`: the most routed-expert layers that fit each GPU's memory budget, as a plan that
compiles to a verified command line.

The plan it writes is the answer: every layer offloaded, a `[budget]` table with each GPU's
memory, and one fill rule, `experts -> CUDA0, CUDA1, cpu`, which `resolve` solves with the memory
model (see `moeconf.fill`); with several GPUs the same solver chooses `-ts` (each GPU's range of
layers), so `moeconf compile` on the written plan gives the same command. The compiled command
line is simulated and measured again before it is returned; the user's context, batch and cache
types are never changed."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from moeconf.compile import Compiled, compile_plan
from moeconf.engines import Engine, engine_device_order
from moeconf.errors import MoeconfError, PlanError
from moeconf.explanation import explain
from moeconf.fill import DoesNotFit
from moeconf.memory import MemoryEstimate, estimate_explained, read_settings
from moeconf.model.inventory import Inventory
from moeconf.plan import plan_from_text

MiB = 1024 * 1024
Policy = Literal["first", "last"]

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
                if key == "main_gpu" and int(value) < 0:
                    raise MoeconfError(f"{name} {value}: a negative main GPU keeps every layer on the CPU "
                                       "(-sm none): there is nothing for fit to place on a GPU")
            elif key == "flash_attn":
                low = value.lower()
                fields[key] = "on" if low in ("on", "1", "true", "enabled") else (
                    "off" if low in ("off", "0", "false", "disabled") else "auto")
            else:
                fields[key] = value
        else:
            extra += [name, value] if value is not None and not eq else [w]
    return fields, rpc, extra


_PLAN_WORDS = (("; or set tensor_split)", ")"), ('split_mode = "none"', "-sm none"), ("flags.main_gpu", "-mg"),
               ("main_gpu", "-mg"), ("split_mode", "-sm"), ("tensor_split", "-ts"), ("flags.", ""))


def _flag_words(text: str) -> str:
    for plan_word, flag in _PLAN_WORDS:
        text = text.replace(plan_word, flag)
    return text


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _plan_text(model_path: str, serve_path: str | None, eng: Engine, gpus: list[str], rpc: list[str],
               fields: dict[str, object],
               extra: list[str], rules: list[str], budgets: Sequence[Budget],
               reserve: int, policy: Policy, split: bool, ram: int | None = None) -> str:
    lines = ["# Written by `moeconf fit`: routed experts fill the GPUs up to each [budget], in order; the rest",
             "# stays in system RAM. Edit the budgets or rules; `moeconf compile` solves it again.",
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
    if len(budgets) > 1:
        lines.append("# no tensor_split: compile chooses -ts (each GPU's layers) from the budgets; set it to pin them")
    if rpc:
        lines.append("rpc = [" + ", ".join(_toml_str(r) for r in rpc) + "]")
    if extra:
        lines.append("extra = [" + ", ".join(_toml_str(x) for x in extra) + "]")
    lines += ["", "[budget]"]
    lines += [f"{_toml_str(b.device)} = {_toml_str(_size_text(b.size))}" for b in budgets]
    if ram is not None:
        lines.append(f"cpu = {_toml_str(_size_text(ram))}  # system RAM: what the GPUs leave must fit")
    lines += [f"reserve = {_toml_str(_size_text(reserve))}", f"policy = {_toml_str(policy)}",
              f"split = {'true' if split else 'false'}"]
    return "\n".join(lines) + "\n"


def _size_text(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", MiB)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


class _Solver:
    def __init__(self, inv: Inventory, eng: Engine, budgets: Sequence[Budget], user_argv: Sequence[str],
                 model_path: str, serve_path: str | None, plan_dir: str, reserve: int, policy: Policy,
                 split: bool, ram: int | None = None, host_cpu: str = "plain") -> None:
        self.inv, self.eng, self.budgets, self.reserve, self.policy, self.split = (
            inv, eng, list(budgets), reserve, policy, split)
        self.ram = ram
        self.host_cpu = host_cpu
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
        self.gpus = engine_device_order([b.device for b in self.budgets if not b.device.startswith("RPC")])
        # the engine's device order: RPC servers first, then local GPUs
        self.order = [*[r for r in rpc_names if r in {b.device for b in self.budgets}], *self.gpus]
        missing = [r for r in rpc_names if r not in self.order]
        if missing:
            raise MoeconfError(f"give a budget for every --rpc device: --gpu '{missing[0]}=SIZE'")
        self.budget = {b.device: b.size for b in self.budgets}
        settings = read_settings(list(user_argv), eng, reserve=reserve)
        if settings.problems:
            raise MoeconfError("; ".join(settings.problems))

    def solve(self) -> FitResult:
        rules = [f"experts -> {', '.join(self.order)}, cpu"]
        text = _plan_text(self.model_path, self.serve_path, self.eng, self.gpus, self.rpc, self.fields, self.extra,
                          rules, self.budgets, self.reserve, self.policy, self.split, self.ram)
        plan = plan_from_text(text, os.path.join(self.plan_dir, "fit.plan.toml"))
        try:
            compiled = compile_plan(plan, inventory=self.inv)
        except DoesNotFit as e:
            raise FitError(_flag_words(e.message)) from None
        except PlanError as e:
            # the plan is fit's own (not a file the user has): say it in the command line's words
            raise MoeconfError(_flag_words(e.message), hint=_flag_words(e.hint) if e.hint else None) from None
        # the command line itself, simulated and measured again: what is printed is what was checked
        argv = list(compiled.argv)
        ex = explain(self.inv, self.eng, argv, gpus=self.gpus)
        if ex.placement.devices != compiled.placement.devices:
            raise AssertionError("fit: the compiled command line does not reproduce the plan's placement")
        mem = estimate_explained(ex, dataclasses.replace(read_settings(argv, self.eng, reserve=self.reserve),
                                                         host_cpu=self.host_cpu))
        over = {d: mem.devices[d].total - self.budget[d] for d in self.order
                if d in mem.devices and mem.devices[d].total > self.budget[d]}
        if self.ram is not None and mem.devices["CPU"].total > self.ram:
            over["CPU"] = mem.devices["CPU"].total - self.ram
        if over:
            raise AssertionError(f"fit: the compiled command line is over budget on {', '.join(over)}")
        per_dev: dict[str, dict[int, set[str]]] = {d: {} for d in self.order}
        all_kinds: dict[int, set[str]] = {}
        for t in self.inv.tensors:
            if t.group != "experts" or t.layer is None or compiled.placement.devices[t.name] is None:
                continue
            all_kinds.setdefault(t.layer, set()).add(t.name)
            d = compiled.placement.devices[t.name]
            if d in per_dev:
                per_dev[d].setdefault(t.layer, set()).add(t.name)
        whole = {d: sorted(il for il, names in v.items() if names == all_kinds[il]) for d, v in per_dev.items()}
        splits = tuple((il, d, tuple(sorted({self.inv.by_name[n].base for n in names})))
                       for d, v in per_dev.items() for il, names in sorted(v.items()) if names != all_kinds[il])
        return FitResult(text, compiled, mem, whole, splits, tuple(self.budgets))


def fit(inv: Inventory, eng: Engine, budgets: Sequence[Budget], user_argv: Sequence[str], *, model_path: str,
        plan_dir: str, reserve: int, policy: Policy = "first", split: bool = True,
        serve_path: str | None = None, ram: int | None = None, host_cpu: str = "plain") -> FitResult:
    """Solve the placement; raise FitError (with the shortfall and what would help) if nothing fits.
    `serve_path`: the GGUF path the engine loads, needed when `model_path` is a manifest; `ram`:
    system RAM for what the GPUs leave (weights in RAM and host compute), checked after the fill."""
    if not budgets:
        raise MoeconfError("give at least one --gpu SIZE")
    if serve_path is None and model_path.endswith(".json"):
        serve_path = manifest_gguf_name(model_path, plan_dir)
    return _Solver(inv, eng, budgets, user_argv, model_path, serve_path, plan_dir, reserve, policy,
                   split, ram, host_cpu).solve()


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
