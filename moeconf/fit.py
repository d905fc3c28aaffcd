"""`moeconf fit`: the most routed-expert layers that fit each GPU's memory budget, as a plan that
compiles to a verified command line.

The plan it writes is the answer: every layer offloaded, a `[budget]` table with each GPU's
memory, and one fill rule, `experts -> CUDA0, CUDA1, cpu`, which `resolve` solves with the memory
model (see `moeconf.fill`); with several GPUs the same solver chooses `-ts` (each GPU's range of
layers), so `moeconf compile` on the written plan gives the same command. The plan is compiled
once; the compiled command line is read back as the engine reads it (once, by the compiler) and its
memory is the fill's own last measure wherever it reads back to that placement and those settings
(`Compiled.memory`), checked against the budgets before it is returned; the user's context, batch
and cache types are never changed."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import moeconf.engines.options as _options
import moeconf.engines.specflags as specflags
from moeconf.compile import compile_plan
from moeconf.compiled import Compiled
from moeconf.engines import HOST, Engine, engine_device_order
from moeconf.engines.flags import FIT_TUNING
from moeconf.engines.llamaconfig import AUTO_WORDS, FALSE_WORDS, TRUE_WORDS
from moeconf.errors import MoeconfError, PlanError
from moeconf.fill import DoesNotFit, plan_settings
from moeconf.memory import DEFAULT_RESERVE, MemoryEstimate, parse_size, read_settings
from moeconf.memory.estimate import refused_settings
from moeconf.memory.families import unmodelled_speculation
from moeconf.memory.servercache import PROMPT_CACHE_DEFAULT_MIB
from moeconf.model.inventory import Inventory, first_shard
from moeconf.plan import plan_from_text
from moeconf.sizing import estimate_explained
from moeconf.units import GIB as GiB
from moeconf.units import MIB as MiB

Policy = Literal["first", "last"]

# engine flags fit decides itself (placement and the devices), in every spelling
_REFUSED = {n for f in ("-ngl", "-ot", "-ts", "-ncmoe", "-cmoe", "-ncffn", "-fit", "-dev", "--max-gpu", *FIT_TUNING)
            for n in _options.spellings(f)}
# engine flags that are plan fields (memory and the split), from the one option table
# (engines/options.py); the rest goes to flags.extra as written
_MODEL = frozenset(_options.row("-m").names)
_FIELDS = {n: o.field for o in _options.options() if o.field in (
    "ctx_size", "batch", "ubatch", "cache_type_k", "cache_type_v", "flash_attn", "split_mode", "main_gpu")
    for n in o.names}
_BOOL_FIELDS = {n: o.field for o in _options.options() if o.field in ("merge_qkv", "merge_up_gate") for n in o.names}
_NO_FA = frozenset(_options.IK_NO_FA)  # ik_llama.cpp's switch for -fa off
_INT_FIELDS = {f for f in _FIELDS.values() if _options.for_field(f).value == "int"}
# flags that load more onto the devices than the memory model knows of: refused, not guessed
_NOT_MODELLED = {
    # a draft model: the flags that load one in either engine (engines/specflags.py, from the parsers);
    # the other ways speculation turns on are refused from the settings (engines/speculative.py, memory/families.py)
    **dict.fromkeys(sorted(specflags.MAINLINE_DRAFT | specflags.IK_DRAFT), "a draft model"),
    **dict.fromkeys(("-mm", "--mmproj", "-mmu", "--mmproj-url", "--mmproj-auto"), "a multimodal projector"),
    **dict.fromkeys(("--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled"),
                    "LoRA adapters and control vectors"),
    **dict.fromkeys((*sorted(_options.spellings("-hf") | _options.spellings("-hff")), "-mu", "--model-url",
                     "--docker-repo"),
                    "a model downloaded by the engine (give the file as MODEL and --serve-path)"),
}


class FitError(MoeconfError):
    """The budgets cannot hold even the always-active tensors, KV cache and compute."""


@dataclass(frozen=True)
class Budget:
    device: str  # buffer-type name (CUDA0, RPC0[host:port])
    size: int  # bytes
    given: str | None = None  # as the user wrote it (24GB), for the assumptions


@dataclass(frozen=True)
class FitResult:
    plan_text: str
    compiled: Compiled
    memory: MemoryEstimate
    gpu_expert_layers: dict[str, list[int]]  # device -> blocks whose routed experts it holds
    split_layers: tuple[tuple[int, str, tuple[str, ...]], ...]  # (block, device, kinds): layers split by kind
    budgets: tuple[Budget, ...]
    notes: tuple[str, ...] = ()  # values fit completed (-ctv to match -ctk on an MLA model, ...)
    assumptions: dict[str, object] = field(default_factory=dict)

    @property
    def argv(self) -> tuple[str, ...]:
        return self.compiled.argv

    @property
    def ot(self) -> str:
        return self.compiled.ot

    def json(self) -> dict[str, object]:
        return {"argv": list(self.argv), "ot": self.ot, "memory": self.memory.json(),
                "budgets": {b.device: b.size for b in self.budgets},
                "gpu_expert_layers": {d: ls for d, ls in self.gpu_expert_layers.items()},
                "memory_estimated": {d: list(m.estimated) for d, m in self.memory.devices.items() if m.estimated},
                "notes": list(self.notes), "assumptions": dict(self.assumptions),
                "server_caches": self.memory.server.json() if self.memory.server is not None else None}


@dataclass
class _UserFlags:
    fields: dict[str, object] = field(default_factory=dict)
    rpc: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    serve_path: str | None = None
    notes: list[str] = field(default_factory=list)


def _engine_flags(argv: Sequence[str], eng: Engine) -> _UserFlags:
    """User engine flags -> plan flag fields, rpc servers, the model path (-m) and extra
    arguments (passed through as written, in order). Every word is read as the engine reads it,
    against its flag table (engines/flagtable.py): an unknown flag, a value the engine refuses,
    or `--flag=value` (which neither engine splits) is an error naming it."""
    from moeconf.engines.argvread import REMOVED_FLAGS, closest_flag, read_argv, unknown_flag_message

    out = _UserFlags()
    from moeconf.engines.argvread import is_bench

    if is_bench(argv):
        raise MoeconfError("'llama-bench': fit writes a server's command from its flags; a llama-bench line is "
                           "explained (`moeconf explain MODEL -- llama-bench ...`), not fitted: give fit the "
                           "server's flags (-c for the test's context, -p + -n)")
    # the engine's reading of the words (no binary: fit's own options are not among them); a -fa
    # followed by another flag is the switch that was meant
    for given in read_argv(argv, eng, binary=False, bare_fa=True).options:
        w, name = given.word.text, given.name
        if given.inline:
            raise MoeconfError(unknown_flag_message(eng, w, closest_flag(eng, w)))
        if given.kind == "word":
            raise MoeconfError(f"{w!r}: an engine flag was expected here ({eng.label} stops at a word it does not "
                               "know); the model is moeconf's MODEL argument, or --serve-path for the path in "
                               "the command")
        if given.kind == "unknown":
            removed = REMOVED_FLAGS.get(eng.name, {}).get(name)
            raise MoeconfError(unknown_flag_message(eng, w, None if removed else closest_flag(eng, name)))
        if name in _REFUSED:
            raise MoeconfError(f"fit chooses {name} itself: leave it out (and give budgets with --gpu)")
        if name in _options.spellings("--kv-unified-per-slot"):
            # llama-server sizes its KV pool n_parallel x N when -c is not given (tools/server/server.cpp)
            raise MoeconfError("--kv-unified-per-slot: fit sizes the KV cache from -c; give -c (the number of "
                               "slots times the context per slot) instead")
        if name in _NOT_MODELLED:
            raise MoeconfError(f"{name}: {_NOT_MODELLED[name]} is not modelled by fit's memory estimate, so it "
                               "cannot promise a fit with it; size it without, then leave room with --reserve")
        if name in _options.spellings("-fa") and eng.fa_takes_value and not given.wanted:
            # the engine would read the next word as the value and stop: what was meant is on
            out.notes.append(f"{name} without a value: {eng.label} takes on|off|auto after it; written as "
                             f"{name} on")
            out.fields["flash_attn"] = "on"
            continue
        if len(given.values) < given.wanted:
            raise MoeconfError(f"{name} needs a value")
        values = [v.text for v in given.values]
        if name in _MODEL:
            out.serve_path = values[0]
        elif name in _options.spellings("--rpc"):
            out.rpc += [s for s in values[0].split(",") if s]
        elif name in _BOOL_FIELDS:
            out.fields[_BOOL_FIELDS[name]] = True
        elif name in _NO_FA:
            out.fields["flash_attn"] = "off"
        elif name in _FIELDS:
            key = _FIELDS[name]
            value = values[0] if values else "on"  # a bare -fa switch (engines before -fa took a value)
            if key in _INT_FIELDS:
                try:
                    n = int(value)
                except ValueError:
                    raise MoeconfError(f"{name} needs a number, not {value!r}") from None
                if key == "main_gpu" and n < 0:
                    raise MoeconfError(f"{name} {value}: a negative main GPU keeps every layer on the CPU "
                                       "(-sm none): there is nothing for fit to place on a GPU")
                if _options.out_of_range(_options.for_field(key), n):
                    raise MoeconfError(f"{name} {value} is out of range")
                out.fields[key] = n
            elif key == "flash_attn":
                # deliberately lenient (any case, either engine's words): fit writes the value back as
                # on, off or auto, which both engines take, so a spelling one engine would refuse is mended
                low = value.lower()
                if low in TRUE_WORDS:
                    out.fields[key] = "on"
                elif low in FALSE_WORDS:
                    out.fields[key] = "off"
                elif low in AUTO_WORDS:
                    out.fields[key] = "auto"
                else:
                    raise MoeconfError(f"unknown value for {name}: {value!r} ({eng.label} takes on, off or auto "
                                       "after it, and stops otherwise)")
            else:
                out.fields[key] = value
        else:
            out.extra += [w, *values]
    return out


# plan words in a compile error -> the flags fit's user gave (the option table's spellings)
_PLAN_WORDS = (("; or set tensor_split)", ")"), ('split_mode = "none"', "-sm none"),
               *((f"flags.{f}", _options.for_field(f).flag) for f in ("main_gpu",)),
               *((f, _options.for_field(f).flag) for f in ("main_gpu", "split_mode", "tensor_split")), ("flags.", ""))


def _flag_words(text: str) -> str:
    for plan_word, flag in _PLAN_WORDS:
        text = text.replace(plan_word, flag)
    return text


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _plan_text(model_path: str, serve_path: str | None, eng: Engine, gpus: list[str], rpc: list[str],
               fields: dict[str, object],
               extra: list[str], rules: list[str], budgets: Sequence[Budget],
               reserve: int, policy: Policy, split: bool, ram: int | None = None, ram_headroom: int = 0) -> str:
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
        lines.append(f"cpu = {_toml_str(_size_text(ram))}  # system RAM less {_size_text(ram_headroom)} kept for the "
                     "system (--ram-headroom): what the GPUs leave must fit")
    lines += [f"reserve = {_toml_str(_size_text(reserve))}", f"policy = {_toml_str(policy)}",
              f"split = {'true' if split else 'false'}"]
    return "\n".join(lines) + "\n"


def _size_text(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


DEFAULT_RAM_HEADROOM = 4 * GiB


def assumed_version(eng: Engine) -> str:
    """The engine version the facts are read for: the one given, else the newest moeconf knows."""
    from moeconf.engines import IK_NEWEST_DATE, NEWEST_MAINLINE_BUILD

    if eng.version:
        return eng.version
    return f"b{NEWEST_MAINLINE_BUILD}" if eng.name == "llama.cpp" else IK_NEWEST_DATE


def default_context(inv: Inventory) -> int:
    """The context fit writes where the command gives no -c: the model's trained context, else 4,096."""
    return inv.metadata.context_length or 4096


class _Solver:
    def __init__(self, inv: Inventory, eng: Engine, budgets: Sequence[Budget], user_argv: Sequence[str],
                 model_path: str, serve_path: str | None, plan_dir: str, reserve: int, policy: Policy,
                 split: bool, ram: int | None = None, ram_headroom: int = DEFAULT_RAM_HEADROOM,
                 host_cpu: str = "plain", fields: Mapping[str, object] | None = None,
                 plan_path: str | None = None, docker_volumes: Sequence[str] = ()) -> None:
        self.inv, self.eng, self.budgets, self.reserve, self.policy, self.split = (
            inv, eng, list(budgets), reserve, policy, split)
        self.ram_total = ram
        self.ram_headroom = ram_headroom
        self.host_cpu = host_cpu
        if ram is not None and ram <= ram_headroom:
            raise MoeconfError(f"--ram {ram / MiB:,.0f} MiB leaves nothing after the {ram_headroom / MiB:,.0f} MiB "
                               "kept for the system (--ram-headroom)")
        self.ram = ram - ram_headroom if ram is not None else None
        uf = _engine_flags(user_argv, eng)
        self.fields, self.rpc, self.extra = {**uf.fields, **(fields or {})}, uf.rpc, uf.extra
        self.notes = list(uf.notes)
        if serve_path is not None and uf.serve_path is not None and serve_path != uf.serve_path:
            raise MoeconfError(f"-m {uf.serve_path} and --serve-path {serve_path}: give the served path once")
        self.model_path = model_path
        self.serve_path = serve_path or uf.serve_path
        if self.serve_path is not None and first_shard(self.serve_path) != self.serve_path:
            self.notes.append(f"-m {first_shard(self.serve_path)}, not {self.serve_path}: the engine loads a split "
                              "model only from its first shard")
        self.serve_assumed: str | None = None  # where -m came from when the user did not give it
        if self.serve_path is None and model_path.endswith(".json"):
            self.serve_path = manifest_gguf_name(model_path, plan_dir)
            self.serve_assumed = (f"-m {self.serve_path}: the GGUF the manifest names (--serve-path or -m to "
                                  "give the path the server loads)")
        self.plan_dir = plan_dir
        self.plan_path = plan_path or fit_plan_path(plan_dir, self.serve_path, model_path)
        self.docker_volumes = list(docker_volumes)
        rpc_names = [f"RPC0[{s}]" if eng.rpc_indexed else f"RPC[{s}]" for s in self.rpc]
        for b in self.budgets:
            if b.device.startswith("RPC") and b.device not in rpc_names:
                raise MoeconfError(f"--gpu {b.device}: no such RPC device; give its server with --rpc "
                                   f"(devices from --rpc: {', '.join(rpc_names) or 'none'})")
            problem = eng.device_name_error(b.device)
            if problem or b.device == HOST:
                raise MoeconfError(f"--gpu {b.device}: {problem or 'the CPU is not a GPU'}")
        self.gpus = engine_device_order([b.device for b in self.budgets if not b.device.startswith("RPC")])
        # the engine's device order: RPC servers first, then local GPUs
        self.order = [*[r for r in rpc_names if r in {b.device for b in self.budgets}], *self.gpus]
        missing = [r for r in rpc_names if r not in self.order]
        if missing:
            raise MoeconfError(f"give a budget for every --rpc device: --gpu '{missing[0]}=SIZE'")
        self.budget = {b.device: b.size for b in self.budgets}
        from moeconf.engines.argvread import Arg
        from moeconf.engines.cmdline import parse_invocation

        # a value the engine stops on (a number std::stoi cannot hold, -fa maybe): refused before any fill
        given = parse_invocation([Arg(w) for w in self._settings_argv()], eng).problems
        if given:
            raise MoeconfError(f"{eng.label} would refuse this command: {'; '.join(m for _a, m in given)}")
        self._complete()
        settings = read_settings(self._settings_argv(), eng, reserve=reserve)
        # speculative decoding (engines/speculative.py, memory/families.py): memory not modelled, so no fit is promised
        speculative = unmodelled_speculation(settings.speculation, inv)
        if speculative:
            raise MoeconfError(f"{speculative[0]}, so fit cannot promise a fit with it; size it without, then "
                               "leave room with --reserve")
        problems = refused_settings(inv, eng, settings)
        if problems:
            raise MoeconfError(f"{eng.label} would refuse this command: {'; '.join(problems)}")

    def _settings_argv(self) -> list[str]:
        out: list[str] = []
        for key in ("ctx_size", "batch", "ubatch", "cache_type_k", "cache_type_v", "flash_attn"):
            if key in self.fields:
                out += [_options.for_field(key).flag, str(self.fields[key])]
        return out + list(self.extra)

    def _complete(self) -> None:
        """Values the engine would take implicitly, or refuse without, written into the command,
        each said in `notes`: the other cache type on an MLA model (llama.cpp refuses different K
        and V types there), flash attention and the context the memory table assumes."""
        from moeconf.memory.geometry import GeometryUnknown, geometry

        f = self.fields
        try:
            geo = geometry(self.inv)
        except GeometryUnknown:
            geo = None
        if geo is not None and geo.mla and self.eng.name == "llama.cpp":
            k, v = f.get("cache_type_k"), f.get("cache_type_v")
            if k is not None and v is None and k != "f16":
                f["cache_type_v"] = k
                self.notes.append(f"-ctv {k} added to match -ctk {k}: {self.eng.label} refuses different K and V "
                                  "cache types on an MLA model")
            elif v is not None and k is None and v != "f16":
                f["cache_type_k"] = v
                self.notes.append(f"-ctk {v} added to match -ctv {v}: {self.eng.label} refuses different K and V "
                                  "cache types on an MLA model")
        if "flash_attn" not in f:
            # the memory table reads the engine's default (auto) as on: the command says so
            f["flash_attn"] = "on"
        if "ctx_size" not in f:
            f["ctx_size"] = default_context(self.inv)

    def assumptions(self, mem: MemoryEstimate) -> dict[str, object]:
        s = mem.settings
        out: dict[str, object] = {
            "engine": self.eng.name, "engine_version": assumed_version(self.eng),
            "engine_version_given": self.eng.version is not None,
            "ctx_size": mem.n_ctx, "batch": s.n_batch, "ubatch": s.n_ubatch,
            "cache_type_k": s.cache_type_k, "cache_type_v": s.cache_type_v,
            "flash_attn": "on" if mem.flash_attn else "off", "kv_offload": s.offload_kqv,
            "n_parallel": s.n_parallel, "reserve_per_gpu": self.reserve,
            "budgets": {b.device: {"bytes": b.size, "given": b.given or _size_text(b.size)} for b in self.budgets},
        }
        if self.ram_total is not None:
            out["ram"] = {"bytes": self.ram_total, "headroom": self.ram_headroom,
                          "budget": self.ram_total - self.ram_headroom}
        if self.serve_assumed is not None:
            out["model_path"] = self.serve_assumed
        return out

    def _server_cache_flags(self, mem: MemoryEstimate) -> list[str]:
        """`--ctx-checkpoints` / `--cache-ram` that keep llama-server's host caches (memory/servercache.py)
        within the RAM `--ram` leaves after the model's host memory; [] when their caps already fit
        (or no RAM was given). Values the user gave are kept, and refused when they do not fit."""
        sc = mem.server
        if self.ram is None or sc is None:
            return []
        left = self.ram - mem.devices[HOST].total
        if sc.cap is not None and sc.cap <= left:
            return []
        out: list[str] = []
        ckpt = sc.checkpoints_total
        round_bytes = sc.slots * sc.checkpoint_bytes
        if ckpt > left:
            n = left // round_bytes if round_bytes else 0
            if sc.checkpoints_given or n < 1:
                raise FitError(
                    f"llama-server's context checkpoints ({sc.slots} slot(s) x {sc.checkpoints} x "
                    f"{sc.checkpoint_bytes / MiB:,.1f} MiB, {sc.checkpoint_of}) need {ckpt / MiB:,.0f} MiB of host "
                    f"memory and --ram leaves {left // MiB:,} MiB after the model: give more --ram, fewer slots "
                    "(-np), or --ctx-checkpoints N (0 turns them off: a changed prompt is then processed again "
                    "from the start)")
            out += ["--ctx-checkpoints", str(n)]
            self.notes.append(f"--ctx-checkpoints {n} added: llama-server's default {sc.checkpoints} checkpoints "
                              f"per slot ({sc.slots} x {sc.checkpoints} x {sc.checkpoint_bytes / MiB:,.1f} MiB) would "
                              f"not fit in the {left // MiB:,} MiB of RAM left after the model")
            ckpt = n * round_bytes
        rest = left - ckpt
        if sc.prompt_cache is None or sc.prompt_cache > rest:
            if sc.prompt_cache_given:
                size = "no byte limit" if sc.prompt_cache is None else f"{sc.prompt_cache / MiB:,.0f} MiB"
                raise FitError(f"llama-server's prompt cache (--cache-ram: {size}) does not fit in the "
                               f"{rest // MiB:,} MiB of RAM left after the model"
                               + (" and its context checkpoints" if ckpt else "")
                               + f": give --cache-ram {rest // MiB} or less, or more --ram")
            mib = rest // MiB
            out += ["--cache-ram", str(mib)]
            self.notes.append(f"--cache-ram {mib} added: llama-server's prompt cache (default "
                              f"{PROMPT_CACHE_DEFAULT_MIB:,} MiB) would not fit in the {mib:,} MiB of RAM left "
                              "after the model" + (" and its context checkpoints" if ckpt else "")
                              + ("; 0 turns it off" if mib == 0 else ""))
        return out

    def solve(self) -> FitResult:
        rules = [f"experts -> {', '.join(self.order)}, cpu"]
        text = _plan_text(self.model_path, self.serve_path, self.eng, self.gpus, self.rpc, self.fields, self.extra,
                          rules, self.budgets, self.reserve, self.policy, self.split, self.ram, self.ram_headroom)
        if self.docker_volumes:
            text += "\n[targets]\ndocker_volumes = [" + ", ".join(_toml_str(v) for v in self.docker_volumes) + "]\n"
        plan_path = self.plan_path
        try:
            plan = plan_from_text(text, plan_path)
            compiled = compile_plan(plan, inventory=self.inv)
        except DoesNotFit as e:
            raise FitError(_flag_words(e.message)) from None
        except PlanError as e:
            # the plan is fit's own (not a file the user has): say it in the command line's words
            raise MoeconfError(_flag_words(e.message), hint=_flag_words(e.hint) if e.hint else None) from None
        except MoeconfError as e:
            raise unlocated(e, plan_path) from None
        # the command line itself, as the compiler read it back and measured it (once: the fill's own
        # measure where it reads back to the same placement and settings): what is printed is what
        # was checked. A host CPU with AMX is measured again (the fill's plan has no host CPU)
        argv = list(compiled.argv)
        ex = compiled.explained()
        settings = dataclasses.replace(read_settings(argv, self.eng, reserve=self.reserve), host_cpu=self.host_cpu)
        same = plan_settings(compiled.plan, self.eng) == settings
        mem = compiled.memory if same else estimate_explained(ex, settings)
        refused = [*ex.refusals, *mem.problems]
        if refused:
            # explain's own checks on the final command line: never print one the engine refuses
            raise MoeconfError(f"{self.eng.label} would refuse the command fit made: {'; '.join(refused)}")
        if ex.placement.devices != compiled.placement.devices:
            raise AssertionError("fit: the compiled command line does not reproduce the plan's placement")
        over = {d: mem.devices[d].total - self.budget[d] for d in self.order
                if d in mem.devices and mem.devices[d].total > self.budget[d]}
        if self.ram is not None and mem.devices[HOST].total > self.ram:
            over[HOST] = mem.devices[HOST].total - self.ram
        if over:
            raise AssertionError(f"fit: the compiled command line is over budget on {', '.join(over)}")
        cache_flags = self._server_cache_flags(mem)
        if cache_flags:
            # the caches' caps change no buffer: the same placement, with the flags that keep them in RAM
            self.extra = [*self.extra, *cache_flags]
            return self.solve()
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
        notes = list(self.notes)
        # devices holding a layer's tensor (experts: per_dev above)
        holding = {compiled.placement.devices[t.name] for t in self.inv.tensors if t.layer is not None}
        idle = [d for d in self.order if d not in holding]
        if len(self.order) > 1 and idle:
            # the search's order (docs/plans.md): bytes on the GPUs, then the fewest away from their
            # layer's GPU, then room: a GPU with nothing of its own left is that order's choice, said
            notes.append(f"{', '.join(idle)} holds no layer and no expert (the output layer at most): the split "
                         "that keeps the most routed experts on the GPUs with the fewest away from their layer's GPU "
                         "(docs/plans.md) leaves it without; give -ts to spread the layers anyway")
        return FitResult(text, compiled, mem, whole, splits, tuple(self.budgets), tuple(notes),
                         self.assumptions(mem))


def fit(inv: Inventory | str, engine: Engine | str = "llama.cpp",
        budgets: Sequence[Budget] | Mapping[str, int | str] = (), user_argv: Sequence[str] = (), *,
        model_path: str | None = None, plan_dir: str | None = None, reserve: int = DEFAULT_RESERVE,
        policy: Policy = "first", split: bool = True, serve_path: str | None = None, ram: int | str | None = None,
        ram_headroom: int | str = DEFAULT_RAM_HEADROOM, version: str | None = None,
        host_cpu: str = "plain", fields: Mapping[str, object] | None = None, plan_path: str | None = None,
        docker_volumes: Sequence[str] = ()) -> FitResult:
    """Solve the placement; raise FitError (with the shortfall and what would help) if nothing fits.

    `inv`: an Inventory or a model path (GGUF or manifest); `engine`: "llama.cpp",
    "ik_llama.cpp" (at `version`, default the newest known) or an Engine; `budgets`: Budget
    objects or {"CUDA0": "24GiB", ...} (sizes need a unit; bytes as int); `user_argv`: the
    engine flags, as for `moeconf fit`. `model_path`: the plan's `[model] path` (default: the
    inventory's source); `plan_dir`: the folder the plan is for (default: the current one);
    `serve_path`: the GGUF path the command loads (default: the GGUF, or the file a manifest was
    made from); `ram`: system RAM, of which `ram_headroom` is kept for the system and the rest
    must hold what the GPUs leave (weights in RAM, host compute); `fields`: plan flag fields
    (ubatch, batch, cache_type_k, ...) set over the ones `user_argv` gives (`fit --optimize`);
    `plan_path`: where the plan would be written (default `fit_plan_path`: its name names the model
    for llama-swap); `docker_volumes`: the plan's `[targets] docker_volumes`, for the docker and
    compose targets."""
    from moeconf.engines import engine as engine_named
    from moeconf.engines import version_error
    from moeconf.model.load import load_inventory

    if isinstance(engine, str):
        bad = version_error(engine, version)
        if bad:
            raise MoeconfError(f"engine version: {bad}")
        eng = engine_named(engine, version)
    else:
        eng = engine
    if isinstance(inv, str):
        model_path = model_path or inv
        inv = load_inventory(inv)
    if isinstance(budgets, Mapping):
        budgets = [Budget(d, v if isinstance(v, int) else parse_size(v, f"budget {d}"),
                          None if isinstance(v, int) else v) for d, v in budgets.items()]
    if not budgets:
        raise MoeconfError("give at least one --gpu SIZE")
    model_path = model_path or inv.source
    plan_dir = plan_dir or os.getcwd()
    ram_b = parse_size(ram, "ram") if isinstance(ram, str) else ram
    headroom = parse_size(ram_headroom, "ram_headroom") if isinstance(ram_headroom, str) else ram_headroom
    return _Solver(inv, eng, budgets, user_argv, model_path, serve_path, plan_dir, reserve, policy,
                   split, ram_b, headroom, host_cpu, fields, plan_path, docker_volumes).solve()


def fit_plan_path(plan_dir: str, serve_path: str | None, model_path: str) -> str:
    """Where the plan fit writes would sit, named after the model it serves (its GGUF's name, or the
    model given): llama-swap's model name comes from it. Fit's own plan is no file unless -o writes
    it, so errors located in it are reported without it (`unlocated`)."""
    name = os.path.basename((serve_path or model_path).rstrip("/")) or "model"
    for suffix in (".gguf", ".manifest.json", ".json"):
        name = name.removesuffix(suffix)
    name = re.sub(r"-\d{5}-of-\d{5}$", "", name)  # a split model's first shard
    return os.path.join(plan_dir, (name or "model") + ".toml")


def unlocated(err: MoeconfError, plan_path: str) -> MoeconfError:
    """`err` without its location when that is fit's own plan, which is no file the user has."""
    if err.path == plan_path:
        err.path = err.line = err.column = err.offset = None
    return err


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
