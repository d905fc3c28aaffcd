"""The memory-relevant settings of an engine invocation (context, batch, cache types, flash
attention, KV offload, parallel sequences, SWA cache size, ik's MLA mode), read from argv and
the `LLAMA_ARG_*` environment the way each engine reads them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from moeconf.engines import Engine
from moeconf.engines.argvread import read_argv
from moeconf.engines.extrafiles import read_extra_files  # projectors, LoRA, control vectors (refused)
from moeconf.engines.flags import c_int
from moeconf.engines.kvoverride import read_kv_overrides  # --override-kv (refused where it sizes anything)
from moeconf.engines.llamaconfig import CACHE_TYPES, FALSE_WORDS, TRUE_WORDS, flash_attn_refusal, flash_attn_word
from moeconf.engines.options import EngineOption, negated_env, out_of_range, row, row_of, with_settings
from moeconf.engines.speculative import read_speculation  # speculative decoding (a refused family)
from moeconf.errors import MoeconfError
from moeconf.units import GIB, MIB

DEFAULT_RESERVE = GIB

IK_ONLY_CACHE_TYPES = ("q6_0",)  # beside llama.cpp's (engines/llamaconfig.py CACHE_TYPES)
# ik's q8_KV cache type, spelled as ik reads it (its rows' bytes: memory/cachetypes.py cache_row_bytes)
Q8_KV = "q8_KV"


_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": MIB, "mb": 1000**2, "mib": MIB,
          "g": GIB, "gb": 1000**3, "gib": GIB, "t": 1024**4, "tb": 1000**4, "tib": 1024**4}


def parse_size(text: str, where: str = "size") -> int:
    """'24 GiB', '16GiB', '512MiB', '24G', '24GB' (10**9) -> bytes. A unit is required: a bare
    number is an error naming the GiB reading (`24` is not 24 bytes by accident)."""
    t = text.strip().replace(" ", "").replace("_", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = t[len(num):].lower()
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if value >= 0 and unit == "" and num:
        raise MoeconfError(f"{where}: {text!r} has no unit: write {num}GiB (or {num}GB for 10^9 bytes, {num}MiB)")
    if not value >= 0 or unit not in _UNITS:  # (nan and negative sizes too)
        raise MoeconfError(f"{where}: {text!r} is not a size (write 24GiB, 16 GiB, 512MiB)")
    size = value * _UNITS[unit]
    if size >= MAX_SIZE:
        raise MoeconfError(f"{where}: {text!r} is more than any machine holds (at most {MAX_SIZE // 1024**5:,} PiB)")
    return int(size)


MAX_SIZE = 2**60  # 1 EiB: a size moeconf accepts is below it (no machine's memory comes near)


def cache_types(engine: Engine) -> tuple[str, ...]:
    """The KV cache types `engine`'s -ctk/-ctv accept."""
    return (*CACHE_TYPES, *IK_ONLY_CACHE_TYPES, Q8_KV) if engine.name == "ik_llama.cpp" else CACHE_TYPES


def read_cache_type(text: str, engine: Engine) -> str | None:
    """A -ctk/-ctv value as `engine` reads it: as written (both engines compare the words exactly: ik's
    kv_cache_type_from_str refuses `q8_kv` or `Q8_KV` for its `q8_KV`); None where `engine` does not accept it."""
    return text if text in cache_types(engine) else None


@dataclass(frozen=True)
class MemorySettings:
    """What decides the KV cache and compute buffers. `n_ctx` 0 means the model's training
    context; `flash_attn` is on|off|auto (auto resolves to on for the devices modelled here)."""

    n_ctx: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    offload_kqv: bool = True
    n_parallel: int = 1
    kv_unified: bool = False
    swa_full: bool = False
    mla: int | None = None  # ik_llama.cpp -mla (None: the engine's default)
    amb: int | None = None  # ik_llama.cpp -amb, MiB (None: the engine's default)
    reserve: int = DEFAULT_RESERVE  # per GPU, for what no engine reports (CUDA context, cuBLAS)
    problems: tuple[str, ...] = ()
    host_cpu: str = "plain"  # or "amx": llama.cpp packs the CPU layers' matrices in its AMX buffer (memory/amx.py)
    # llama.cpp's host buffer choices (src/llama-model.cpp make_cpu_buft_list): --no-host skips the
    # GPU's pinned host buffer type, -nr/--no-repack the CPU's extra buffer types (AMX, CPU_REPACK)
    no_host: bool = False
    repack: bool = True
    op_offload: bool = True  # False: --no-op-offload, the scheduler copies no host weights to the GPU for an op
    # llama-server's host caches (memory/servercache.py): --cache-ram MiB (-1: no limit) and
    # --ctx-checkpoints per slot; None: the binary's default
    cache_ram: int | None = None
    ctx_checkpoints: int | None = None
    # the binary the sequence count was defaulted for (None: none on the line) and whether
    # n_parallel/kv_unified are that binary's default (`server_slots`) rather than given
    binary: str | None = field(default=None, compare=False)
    auto_slots: bool = field(default=False, compare=False)
    # (kind, the flag or variable) of speculative decoding (engines/speculative.py) and of the files loaded beside
    # the model (engines/extrafiles.py); (the key, the flag and item) of --override-kv (engines/kvoverride.py)
    speculation: tuple[tuple[str, str], ...] = ()
    extra_files: tuple[tuple[str, str], ...] = ()
    kv_overrides: tuple[tuple[str, str], ...] = ()
    # the output rows the context reserves its worst-case graph for (llama.cpp's n_outputs_max,
    # `server_outputs`); 0: as many as the batch (every binary but llama-server). Derived from the
    # binary (which is not compared either) and the flags
    n_outputs: int = field(default=0, compare=False)

    def output_rows(self, n_tokens: int) -> int:
        """The rows the worst-case graph of a ubatch of `n_tokens` outputs: `n_outputs`, never fewer than
        the sequences (one row each), at most the ubatch (all of it where `n_outputs` is 0)."""
        return min(n_tokens, max(self.n_outputs, self.n_parallel)) if self.n_outputs else n_tokens


# llama-server's slots when -np is not given (or is -1, "auto"), from llama.cpp b7079 on; every other binary,
# and ik_llama.cpp's server, keeps one (docs/memory-architectures.md, "Sequences: each binary's default")
SERVER_AUTO_SLOTS = 4
SERVER_AUTO_SLOTS_SINCE = 7079
SERVER_BINARIES = frozenset({"llama-server"})


# llama-server's output reservation since llama.cpp b9474: min(n_batch, n_parallel * (1 + draft length)) rows, at
# least 1, n_batch with --embedding or pooling; ik_llama.cpp has none (docs/memory.md, "llama-server's output
# reservation")
SERVER_OUTPUTS_SINCE = 9474


def server_outputs(binary: str | None, engine: Engine, n_batch: int, n_parallel: int, embedding: bool) -> int:
    """The output rows `binary` reserves (0: as many as the batch). Speculation (draft tokens per
    slot) is refused by the estimate (engines/speculative.py), so none is counted here."""
    limited = binary in SERVER_BINARIES and engine.name == "llama.cpp" and (engine.build or 0) >= SERVER_OUTPUTS_SINCE
    return max(1, min(n_batch, n_parallel)) if limited and not embedding else 0


def binary_name(word: str | None) -> str | None:
    """`/opt/llama.cpp/build/bin/llama-server.exe` -> `llama-server`; None for an option or nothing."""
    if not word or word.startswith("-"):
        return None
    return word.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".exe")


def server_slots(binary: str | None, engine: Engine) -> int | None:
    """The slots `binary` runs with when -np is auto (not given, or -1), in one unified KV cache;
    None where the binary has no auto slots (one sequence unless -np says otherwise)."""
    auto = binary in SERVER_BINARIES and engine.name == "llama.cpp" and (engine.build or 0) >= SERVER_AUTO_SLOTS_SINCE
    return SERVER_AUTO_SLOTS if auto else None


# the variables of the rows that decide a memory setting (engines/options.py)
_BY_ENV = {o.env: o for o in with_settings() if o.env}
# the settings `read_settings` takes as read (their defaults where not given or not of their type); n_parallel
# is derived from its value
_READ = ("n_ctx", "n_batch", "n_ubatch", "cache_type_k", "cache_type_v", "flash_attn", "offload_kqv", "kv_unified",
         "swa_full", "mla", "amb", "no_host", "repack", "op_offload", "cache_ram", "ctx_checkpoints")


def read_settings(
    argv: Sequence[str], engine: Engine, env: Mapping[str, str] | None = None, *, reserve: int = DEFAULT_RESERVE,
    binary: str | None = None,
) -> MemorySettings:
    """Settings from argv (binary first or not) and env; a command-line value beats its env var.
    The sequence count defaults as the binary does (`server_slots`): argv's first word when it is
    one, else `binary` (the binary the command line will run, when known apart from argv)."""
    values: dict[str, object] = {}
    problems: list[str] = []

    def put(o: EngineOption, text: str, where: str) -> None:
        key = o.setting
        assert key is not None
        if o.value == "int":
            n = c_int(text)  # as the engine's std::stoi reads it (`4096k` is 4096)
            if n is None:
                problems.append(f"{where} needs a number, not {text!r}")
            # the table's bounds: any negative --cache-ram is "no limit" (server_prompt_cache); -np -1 is auto
            elif out_of_range(o, n):
                problems.append(f"{where} {n} is out of range")
            else:
                values[key] = n
        elif key in ("cache_type_k", "cache_type_v"):
            t = read_cache_type(text, engine)
            if t is None:
                problems.append(f"{where}: {engine.label} does not accept cache type {text!r} "
                                f"(allowed: {', '.join(cache_types(engine))})")
                return
            values[key] = t
        elif key == "flash_attn":
            word = flash_attn_word(text, engine)
            if word is None:  # the command line's own refusal (engines/cmdline.py), in the same words
                problems.append(flash_attn_refusal(where, text, engine))
            else:
                values[key] = word

    # `embedding`: an embedding or reranking server keeps n_batch outputs; -wgt: ik's layer split's (iksplit.py)
    for k, v in (env or {}).items():
        o = _BY_ENV.get(k)
        if engine.name == "ik_llama.cpp" and (o is None or not o.ik_env):
            continue  # ik_llama.cpp reads its short fixed list only
        key = o.setting if o is not None else None
        if engine.name == "ik_llama.cpp" and key == "flash_attn":
            # ik's get_env for a bool: "1" or "true" sets it, any other word clears it (common/common.cpp)
            values[key] = "on" if v in ("1", "true") else "off"
            continue
        if o is None or key is None:
            if k == negated_env(row("-kvo")):
                values["offload_kqv"] = False
        elif key == "embedding":  # --embedding's and --rerank's when truthy, --pooling's unless none
            # a switch's variable runs its handler only on a true word, as written (llama.cpp's env loop)
            if (v in TRUE_WORDS) if o.value == "switch" else v != "none":
                values[key] = True
        elif o.value == "switch":  # a switch without a negated form: set when truthy
            if v in TRUE_WORDS or (v in FALSE_WORDS and o.negs):
                values[key] = v in TRUE_WORDS
        else:
            put(o, v, k)
    words = list(argv)
    for given in read_argv(words, engine).options:  # as the engine steps over the line (its flag table)
        name, value = given.name, given.value.text if given.value is not None else None
        o = row_of(name)
        key = o.setting if o is not None else None
        if o is None or key is None or key == "worst_graph_tokens":
            continue
        if key == "embedding":  # --embedding, --rerank; --pooling unless none
            if o.value == "switch" or value is not None:
                values[key] = o.value == "switch" or value != "none"
        elif o.value == "switch":
            values[key] = name in o.names
        else:
            if value is None and key == "flash_attn" and not engine.fa_takes_value:
                value = "on"  # a bare switch (mainline before b6325, ik before 2025-11-13)
            if value is None:
                problems.append(f"{name} needs a value")
                break
            put(o, value, name)  # -fa: the next word, whatever it is (put() refuses a bad one)

    d = MemorySettings()

    def got(key: str) -> Any:
        """The value read for the setting `key` where it has the setting's type (an int where its default is
        None), else the default."""
        v, default = values.get(key), getattr(d, key)
        return v if isinstance(v, int if default is None else type(default)) else default

    run = binary_name(words[0]) if words and not words[0].startswith("-") else binary_name(binary)
    slots = server_slots(run, engine)
    given_np = values.get("n_parallel")
    if run in SERVER_BINARIES and given_np == 0:
        problems.append(f"{run} refuses -np 0 (give the number of slots, or -1 for auto)")
        values.pop("n_parallel")  # the figures are for the refused value at its default (auto slots)
        given_np = None
    auto = slots is not None and (not isinstance(given_np, int) or given_np < 0)
    if auto:
        values["n_parallel"] = slots
        values["kv_unified"] = True
    overrides, refused = read_kv_overrides(words, engine)
    problems.extend(refused)
    n_parallel = max(got("n_parallel"), 1)
    # llama-server --kv-unified-per-slot N (pinned llama.cpp b11312, tools/server/server.cpp
    # llama_server: after -np auto is resolved): without -c (`-c 0` pins the training context) the
    # KV pool is n_parallel * N cells
    per_slot = values.get("kv_per_slot")
    if (isinstance(per_slot, int) and per_slot > 0 and "n_ctx" not in values and run in SERVER_BINARIES
            and engine.name == "llama.cpp"):
        values["n_ctx"] = n_parallel * per_slot
    outputs = server_outputs(run, engine, got("n_batch"), n_parallel, values.get("embedding") is True)
    return replace(d, **{k: got(k) for k in _READ}, n_parallel=n_parallel, reserve=reserve, problems=tuple(problems),
                   binary=run, auto_slots=auto, speculation=read_speculation(words, engine, env, run),
                   extra_files=read_extra_files(words, engine, env, run), kv_overrides=overrides, n_outputs=outputs)


def slot_notes(s: MemorySettings, engine: Engine) -> list[str]:
    """What to say about the sequence count where it changes memory (a sliding-window cache holds
    one window per sequence in a unified cache): the binary's default slots, or the binary that
    was not given."""
    if s.auto_slots:
        return [f"{s.binary} runs {s.n_parallel} slots by default (-np auto) in one unified KV cache: the "
                f"sliding-window layers keep {s.n_parallel} windows (-np 1 keeps one)"]
    if s.binary is None and s.n_parallel == 1 and server_slots("llama-server", engine):
        return ["no binary on the command line: one sequence assumed (llama-cli, llama-completion); "
                f"llama-server runs {SERVER_AUTO_SLOTS} slots by default and its sliding-window layers keep "
                f"{SERVER_AUTO_SLOTS} windows: give the binary first, or -np"]
    return []


def settings_argv(s: MemorySettings, engine: Engine) -> list[str]:
    """The engine flags that reproduce `s` (only what differs from the defaults), in the form
    `moeconf fit` and `explain` take: the memory-relevant part of a launch, whatever spelling or
    `LLAMA_ARG_*` variable it came from."""
    d = MemorySettings()
    out: list[str] = []
    # a switch in its short form (its negation where off); -mla and -amb where given (default None)
    for flag in ("-c", "-b", "-ub", "-ctk", "-ctv", "-np", "-fa", "-kvo", "--swa-full", "-kvu", "-mla", "-amb"):
        o = row(flag)
        assert o.setting is not None
        v = getattr(s, o.setting)
        if v == getattr(d, o.setting):
            continue
        if flag == "-fa":
            out += ["-fa", v] if engine.fa_takes_value else (["-fa"] if v == "on" else [])
        elif o.value == "switch":
            out.append(o.flag if v else o.negs[0])
        else:
            out += [flag, str(v)]
    return out
