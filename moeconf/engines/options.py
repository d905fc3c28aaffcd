"""The one table of the engine options moeconf understands: for each, its spellings and
`LLAMA_ARG_*` variable (read from llama.cpp's parser table, engines/configtable.py; for an
ik_llama.cpp-only option, checked against ik's flag table, engines/flagtable.py), the plan field
that sets it (`[flags]` or `[targets]`, moeconf/plan/model.py), the memory setting it decides
(engines/settings.py MemorySettings, moeconf/iksplit.py IkSplitSettings), how the engine reads its
value (flagtable MAINLINE_VALUES / IK_VALUES: `int`; `text` for a word; `switch` for an option
without a value) and moeconf's own lower bound for a number.

Every reader and writer of these mappings (fit, the plan compiler's argv and env forms, the
memory settings, the invocation reader, `[flags] extra` checks) takes them from here; the rows
are in the order the plan compiler writes its fields (emitting/argv.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Final


@dataclass(frozen=True)
class EngineOption:
    """One option: `flag` is its first spelling (the parser's own first name)."""

    flag: str
    names: tuple[str, ...]  # every spelling that sets it (the first is `flag`)
    negs: tuple[str, ...]  # spellings that turn a switch off
    env: str  # the LLAMA_ARG_* variable llama.cpp reads ("" none)
    ik_env: bool  # ik_llama.cpp reads `env` too (its short fixed list, common/common.cpp)
    field: str | None  # the plan key that sets it (in `section`)
    section: str  # the plan table of `field`: "model", "flags" or "targets" ("": no field)
    setting: str | None  # the memory setting it decides
    value: str  # int, uint, float, floats (as std::sto* reads it), text, switch
    minimum: int | None  # moeconf's lower bound for a number (None: the engine's only)

    @property
    def spellings(self) -> tuple[str, ...]:
        return (*self.names, *self.negs)


# (first spelling, plan field, section, memory setting, minimum) and, for an option llama.cpp's
# parser does not have, ik_llama.cpp's spellings (checked against its flag table)
_ROWS: Final[tuple[tuple[str, str | None, str, str | None, int | None, tuple[str, ...]], ...]] = (
    # plan fields, in the order the plan compiler writes them
    ("-m", "serve_path", "model", None, None, ()),
    ("--rpc", "rpc", "flags", None, None, ()),  # before -ot: the RPC device must exist when -ot names it
    ("-ngl", "n_gpu_layers", "flags", None, None, ()),
    ("-fit", "fit", "flags", None, None, ()),
    ("-c", "ctx_size", "flags", "n_ctx", 0, ()),
    ("-b", "batch", "flags", "n_batch", 1, ()),
    ("-ub", "ubatch", "flags", "n_ubatch", 1, ()),
    ("-fa", "flash_attn", "flags", "flash_attn", None, ()),
    ("-ctk", "cache_type_k", "flags", "cache_type_k", None, ()),
    ("-ctv", "cache_type_v", "flags", "cache_type_v", None, ()),
    ("--no-mmap", "no_mmap", "flags", None, None, ("--no-mmap",)),
    ("--mlock", "mlock", "flags", None, None, ("--mlock",)),
    ("-lm", None, "", None, None, ()),  # mainline b10108+: no_mmap and mlock as one value (emitting/argv.py)
    ("-mqkv", "merge_qkv", "flags", None, None, ("-mqkv", "--merge-qkv")),
    ("-muge", "merge_up_gate", "flags", None, None, ("-muge", "--merge-up-gate-experts")),
    ("-sm", "split_mode", "flags", None, None, ()),
    ("-ts", "tensor_split", "flags", None, None, ()),
    ("-mg", "main_gpu", "flags", None, 0, ()),
    ("-t", "threads", "flags", None, 1, ()),
    ("--host", "host", "targets", None, None, ()),
    ("--port", "port", "targets", None, 1, ()),
    # placement a plan writes as rules, and the model the engine fetches
    ("-ot", None, "", None, None, ()),
    ("-cmoe", None, "", None, None, ()),
    ("-ncmoe", None, "", None, 0, ()),
    ("-ncffn", None, "", None, 0, ()),
    ("-dev", None, "", None, None, ()),
    ("-hf", None, "", None, None, ()),
    ("-hff", None, "", None, None, ()),
    ("--offline", None, "", None, None, ()),
    # what fit decides itself: llama.cpp's fit tuning, ik_llama.cpp's fit margin and device cap
    ("-fitt", None, "", None, None, ()),
    ("-fitc", None, "", None, None, ()),
    ("--fit-margin", None, "", None, None, ("--fit-margin",)),
    ("-gfm", None, "", None, None, ("-gfm", "--gpu-fit-margin")),
    ("--max-gpu", None, "", None, None, ("--max-gpu",)),
    # memory settings a plan carries in `[flags] extra`
    ("-np", None, "", "n_parallel", None, ()),  # -1: auto
    ("-mla", None, "", "mla", 0, ("-mla", "--mla-use")),
    ("-amb", None, "", "amb", 0, ("-amb", "--attention-max-batch")),
    ("-wgt", None, "", "worst_graph_tokens", None, ("-wgt", "--worst-graph-tokens")),
    ("-cram", None, "", "cache_ram", None, ()),  # any negative: no limit
    ("-ctxcp", None, "", "ctx_checkpoints", 0, ()),
    ("--kv-unified-per-slot", None, "", "kv_per_slot", None, ()),
    ("-kvo", None, "", "offload_kqv", None, ()),
    ("--swa-full", None, "", "swa_full", None, ()),
    ("-kvu", None, "", "kv_unified", None, ()),
    ("--no-host", None, "", "no_host", None, ()),
    ("--repack", None, "", "repack", None, ()),
    ("--op-offload", None, "", "op_offload", None, ()),
    ("--embedding", None, "", "embedding", None, ()),
    ("--rerank", None, "", "embedding", None, ()),
    ("--pooling", None, "", "embedding", None, ()),
)
# ik_llama.cpp's `-no-fa`/`--no-flash-attn`: flash attention off (mainline: `-fa off`)
IK_NO_FA: Final = ("-no-fa", "--no-flash-attn")
# the variables ik_llama.cpp reads (common/common.cpp gpt_params_parse_ex, its fixed list)
_IK_ENV: Final = frozenset({"-c", "-b", "-ub", "-ctk", "-ctv", "-fa", "-np"})


def _kind(flag: str, config_kind: str | None) -> str:
    from moeconf.engines.flagtable import IK, IK_VALUES, MAINLINE, MAINLINE_VALUES

    kind = MAINLINE_VALUES.get(flag) or IK_VALUES.get(flag)
    if kind is not None:
        return kind.split("|")[0]
    if config_kind in ("void", "bool"):
        return "switch"
    if config_kind is None:
        return "text" if (MAINLINE.get(flag) or IK.get(flag)) else "switch"
    return "text"


@cache
def options() -> tuple[EngineOption, ...]:
    """Every row, its spellings and variable filled in from the engines' tables."""
    from moeconf.engines.configtable import OPTIONS as CONFIG
    from moeconf.engines.flagtable import IK
    from moeconf.engines.flagtable_iknewest import IK_NEWEST

    out = []
    names: tuple[str, ...]
    negs: tuple[str, ...]
    for flag, fld, section, setting, minimum, ik_names in _ROWS:
        if ik_names:
            missing = [n for n in ik_names if n not in IK and n not in IK_NEWEST]
            assert not missing, f"{missing} in no ik_llama.cpp flag table"
            names, negs, env, kind = ik_names, (), "", _kind(flag, None)
        else:
            row = next(r for r in CONFIG if flag in r[0])
            names, negs, env, kind = row[0], row[1], row[2], _kind(flag, row[3])
        out.append(EngineOption(flag, tuple(names), tuple(negs), env, flag in _IK_ENV, fld, section, setting,
                                kind, minimum))
    return tuple(out)


@cache
def _by_flag() -> dict[str, EngineOption]:
    return {o.flag: o for o in options()}


def row(flag: str) -> EngineOption:
    """The row whose first spelling is `flag`."""
    return _by_flag()[flag]


@cache
def spellings(flag: str) -> frozenset[str]:
    """Every spelling of the option whose first spelling is `flag` (negated ones included)."""
    return frozenset(row(flag).spellings)


def env_var(flag: str) -> str:
    """The `LLAMA_ARG_*` variable of the option whose first spelling is `flag`."""
    return row(flag).env


def for_field(field: str, section: str = "flags") -> EngineOption:
    """The row of a plan field."""
    return next(o for o in options() if o.field == field and o.section == section)


def setting_row(setting: str) -> EngineOption:
    """The (first) row that decides a memory setting."""
    return next(o for o in options() if o.setting == setting)


def plain_fields() -> Iterator[EngineOption]:
    """The rows of the plan fields written as the option and the value as it is (or the switch
    alone), in the order the plan compiler writes them: all but the model, the servers, -ngl,
    fit, flash attention (by version), the load mode and -ts (their own forms)."""
    special = ("serve_path", "rpc", "n_gpu_layers", "fit", "flash_attn", "no_mmap", "mlock", "tensor_split")
    return (o for o in options() if o.field is not None and o.field not in special)


def with_settings() -> Iterator[EngineOption]:
    """The rows that decide a memory setting, in table order."""
    return (o for o in options() if o.setting is not None)


def negated_env(o: EngineOption) -> str:
    """The variable of a switch's negated form (`LLAMA_ARG_NO_KV_OFFLOAD`)."""
    return o.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)


def out_of_range(o: EngineOption, n: int) -> bool:
    """Whether moeconf refuses the number `n` for `o` (below its minimum)."""
    return o.minimum is not None and n < o.minimum


@cache
def _by_spelling() -> dict[str, EngineOption]:
    out: dict[str, EngineOption] = {}
    for o in options():
        for n in o.spellings:
            out.setdefault(n, o)
    return out


def row_of(name: str) -> EngineOption | None:
    """The row one of whose spellings (negated ones included) is `name`, None for an option the
    table does not have."""
    return _by_spelling().get(name)
