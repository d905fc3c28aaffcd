"""An engine command line read as the engine's parser steps over it: each option with its
canonical flag (the flag and option tables), its values (as many as the engine takes), its kind
(known, removed, unknown, a plain word) and where it is written. The one argv reader: every
module that walks an engine's words reads them through `read_argv` (tests/test_argv_reader.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from moeconf.engines import Engine
from moeconf.engines.flags import PLAN_KEYS, flag_table, is_number
from moeconf.engines.options import EngineOption, row_of, spellings


@dataclass(frozen=True)
class Arg:
    """A word of a command line and where its text starts (1-based line and column; 0 when unknown)."""

    text: str
    path: str = ""
    line: int = 0
    column: int = 0

    def at(self, offset: int) -> tuple[int, int]:
        """Line and column of the character `offset` into this word."""
        return self.line, (self.column + offset) if self.column else 0


@dataclass(frozen=True)
class ConfigArg(Arg):
    """A key or value from a llama.cpp config file (engines/llamaconfig.py). Its own line and
    column stay 0, so a lint finding about it is placed at the launch it applies to; `file`,
    `file_line` and `file_column` say where it is written."""

    file: str = ""
    file_line: int = 0
    file_column: int = 0

    @property
    def where(self) -> str:
        return f"{self.file}:{self.file_line}"


def config_where(arg: Arg | None) -> str | None:
    """`PATH:LINE` of a config file's word, None for a word of the command line or environment."""
    return arg.where if isinstance(arg, ConfigArg) else None


# Binaries that read the engines' common argument parser (the flag table applies to them).
COMMON_ARG_BINARIES = frozenset({
    "llama-server", "llama-cli", "llama-completion", "llama-mtmd-cli", "server", "main",
})


@dataclass(frozen=True)
class RemovedFlag:
    """A flag the newest code no longer has: versions before `date` (ik_llama.cpp commit dates)
    or before build `build` (mainline) still take it."""

    date: str
    build: int
    values: int
    note: str


# Flags gone from the newest code read, with when they went (the flag table has only the newest).
# mainline: the load switches PR #20834 deprecated (b10108) are still in llama.cpp of 2026-08-22
# (ngxson/llama.cpp 3f545bec) and gone from the pinned llama-cpp-python 0.3.36's common/arg.cpp
# (0c1e57098, b11312: only -lm/--load-mode); PR #28334 (merged 2026-09-09) removed them. Its
# build number is not read, so builds before b11312 are taken to still have them.
_LOAD_SWITCH_NOTE = ("deprecated by PR #20834 (b10108) for -lm/--load-mode none|mmap|mlock|mmap+mlock|dio; gone "
                     "from the parser since PR #28334")
REMOVED_FLAGS: dict[str, dict[str, RemovedFlag]] = {
    "ik_llama.cpp": {
        name: RemovedFlag("2025-10-25", 0, 0, "fused MoE is on by default since PR #863; -no-fmoe turns it off")
        for name in ("-fmoe", "--fused-moe")
    },
    "llama.cpp": {
        name: RemovedFlag("2026-09-09", 11312, 0, _LOAD_SWITCH_NOTE)
        for name in ("--mmap", "--no-mmap", "--mlock", "-dio", "--direct-io", "-ndio", "--no-direct-io")
    },
}


def _before(engine: Engine, removed: RemovedFlag) -> bool:
    """Whether `engine`'s declared version predates the removal."""
    if engine.name == "llama.cpp":
        return engine.build is not None and engine.build < removed.build
    v = (engine.version or "").strip().lstrip("v")
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        return v < removed.date  # the date as written: Engine.date is clamped to the code read
    return engine.version is not None and (engine.date or "9999") < removed.date


def removed_values(engine: Engine, name: str) -> int | None:
    """How many values a flag the newest code no longer has takes at `engine`'s declared version,
    or None where that version no longer has it (or never had it)."""
    removed = REMOVED_FLAGS.get(engine.name, {}).get(name)
    return removed.values if removed is not None and _before(engine, removed) else None


def known_flags(engine: Engine) -> dict[str, int]:
    """Every flag `engine`'s argument parser knows -> how many values it takes (from the
    engines' sources: engines/flags.py flag_table)."""
    return flag_table(engine)


def normalize_flag(name: str) -> str:
    """As both engines read a word: `--a_b` is `--a-b` (underscores only in long flags)."""
    return name.replace("_", "-") if name.startswith("--") else name


def closest_flag(engine: Engine, name: str) -> str | None:
    """The known flag `name` was most likely meant to be (`--n-cpu-mo` -> `--n-cpu-moe`)."""
    table = known_flags(engine)
    base = name.partition("=")[0]
    if base != name and normalize_flag(base) in table:
        return normalize_flag(base)
    return _closest_in(normalize_flag(base), table)


def _closest_in(name: str, table: Iterable[str]) -> str | None:
    """The flag of `table` closest to `name` (difflib, 0.75 alike), if any: the common table's
    (closest_flag) and llama-bench's (_read_bench)."""
    import difflib

    close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.75)
    return close[0] if close else None


def unknown_flag_message(engine: Engine, name: str, closest: str | None) -> str:
    """What the engine does with an unknown flag, and what was probably meant."""
    removed = REMOVED_FLAGS.get(engine.name, {}).get(normalize_flag(name))
    if removed is not None:
        return (f"{engine.label} has no {name} any more (removed {removed.date}: {removed.note}); builds since "
                "stop with an unknown-argument error")
    if "=" in name and closest is not None and closest == normalize_flag(name.partition("=")[0]):
        value = name.partition("=")[2]
        return (f"{engine.label} does not split {name!r} at '=': it stops with an unknown-argument error "
                f"(write {closest} {value})")
    meant = f" (did you mean {closest}?)" if closest else ""
    return f"unknown argument {name!r}{meant}: {engine.label} stops with an invalid-argument error"


# --- the one argv reader ---------------------------------------------------------------------

Kind = Literal["known", "removed", "unknown", "word"]


@dataclass(frozen=True)
class GivenOption:
    """One option of a command line as the engine's parser steps over it: the flag word as
    written, its name as the parser looks it up (`--a_b` is `--a-b`; `--name=value` cut at `=`),
    where it stands, and the values it takes.

    `kind`: "known" (the flag table has it), "removed" (gone from the newest code, still in the
    declared version: engines/cmdline.REMOVED_FLAGS), "unknown" (a flag the engine does not know:
    it stops; the words after it are taken as the flag probably meant would take them: the same
    flag of the other engine, else the closest of this one), or "word" (not a flag: a positional
    word or a number)."""

    word: Arg  # as written
    flag: Arg  # its name (`word` cut at `=`, `_` read as `-`), where the word starts
    name: str
    index: int  # of the flag word among the words read
    values: tuple[Arg, ...] = ()
    kind: Kind = "known"
    inline: bool = False  # the value is written after `=` (neither engine splits it: it stops)
    wanted: int = 0  # how many values the flag takes (the values may be fewer where the line ends)
    closest: str | None = None  # an unknown flag: the known flag probably meant

    @property
    def value(self) -> Arg | None:
        """The first value (None for a switch, or a value the line does not give)."""
        return self.values[0] if self.values else None

    @property
    def missing(self) -> bool:
        """The flag takes a value and the line ends before it."""
        return self.wanted > 0 and not self.values

    @property
    def row(self) -> EngineOption | None:
        """The option table's row (engines/options.py), None for an option it does not have."""
        return row_of(self.name)

    @property
    def canonical(self) -> str:
        """The option's first spelling in the option table, else its name."""
        r = self.row
        return r.flag if r is not None else self.name


@dataclass(frozen=True)
class ArgvReading:
    """A command line read once: the binary (when the first word is one) and every option in order."""

    words: tuple[Arg, ...]
    binary: Arg | None
    options: tuple[GivenOption, ...]

    def of(self, flag: str) -> list[GivenOption]:
        """Every occurrence of the option-table row whose first spelling is `flag`, in order."""
        names = spellings(flag)
        return [o for o in self.options if o.name in names]

    def last(self, flag: str) -> GivenOption | None:
        """The last occurrence of `flag`'s row (the one the engine keeps for a single value)."""
        found = self.of(flag)
        return found[-1] if found else None

    def named(self, *names: str) -> list[GivenOption]:
        """Every option whose name is one of `names` (spellings outside the option table)."""
        return [o for o in self.options if o.name in names]

    @property
    def flags(self) -> list[GivenOption]:
        """The options that are flags (known, removed or unknown), not positional words."""
        return [o for o in self.options if o.kind != "word"]


def _other_table(engine: Engine) -> dict[str, int]:
    """The other engine's newest flag table (an unknown flag that it knows takes its values)."""
    from moeconf.engines.flagtable import MAINLINE
    from moeconf.engines.flagtable_iknewest import IK_NEWEST

    return MAINLINE if engine.name == "ik_llama.cpp" else IK_NEWEST


def _as_arg(w: Arg | str) -> Arg:
    return w if isinstance(w, Arg) else Arg(w)


def read_argv(words: Sequence[Arg | str], engine: Engine, *, binary: bool | None = None,
              bare_fa: bool = False, bench: bool = False) -> ArgvReading:
    """Read a command line once as `engine`'s parser steps over it: which words are flags, which
    values each takes (its flag table, engines/flagtable.py; `-fa` by version), `--name=value`
    read as meant (the engines refuse it: `inline`), unknown flags kept as such. `binary`: whether
    the first word is the program (None: when it does not start with `-`). `bare_fa`: a `-fa`
    followed by another flag (or nothing) is read as the switch that was meant, not as taking
    that flag as its value (fit; the engine itself takes the next word, whatever it is).

    Every reader of an engine command line goes through here: the invocation reader
    (parse_invocation), the memory settings, fit's flags, `[flags] extra`, the env form, the
    llama.cpp config files' overrides, the targets and the lint rules.

    `bench`: the line is llama-bench's, read with llama-bench's own option table
    (engines/benchtable.py; engines/benchline.py reads it, and hands the rest of moeconf each of
    its tests written as the common parser's line)."""
    if all(isinstance(w, str) for w in words):
        # plain words (the memory readers each read the same line): read once, shared
        return _read_texts(tuple(str(w) for w in words), engine, binary, bare_fa, bench)
    return _read([_as_arg(w) for w in words], engine, binary, bare_fa, bench)


@lru_cache(maxsize=16)
def _read_texts(words: tuple[str, ...], engine: Engine, binary: bool | None, bare_fa: bool,
                bench: bool) -> ArgvReading:
    return _read([Arg(w) for w in words], engine, binary, bare_fa, bench)


def _read(args: list[Arg], engine: Engine, binary: bool | None, bare_fa: bool, bench: bool) -> ArgvReading:
    if bench:
        return _read_bench(args, engine, binary)
    table = known_flags(engine)

    def count(name: str) -> tuple[Kind, int, str | None]:
        n = table.get(name)
        if n is not None:
            return "known", n, None
        n = removed_values(engine, name)
        if n is not None:
            return "removed", n, None
        if name.startswith("-") and not is_number(name):
            closest = closest_flag(engine, name)
            other = _other_table(engine)
            return "unknown", other[name] if name in other else table.get(closest, 0) if closest else 0, closest
        return "word", 0, None

    return _walk(args, binary, count, engine.fa_takes_value, bare_fa)


def _read_bench(args: list[Arg], engine: Engine, binary: bool | None) -> ArgvReading:
    """llama-bench's line: its own table (every option takes 0 or 1 words; it splits no `=`). A
    flag it does not know stops it; the words after it are taken as the common parser's flag of
    that name (or the closest bench option) would take them."""
    from moeconf.engines.benchtable import IK_FLAGS, MAINLINE_FLAGS

    table = IK_FLAGS if engine.name == "ik_llama.cpp" else MAINLINE_FLAGS
    server = known_flags(engine)

    def count(name: str) -> tuple[Kind, int, str | None]:
        n = table.get(name)
        if n is not None:
            return "known", n, None
        if name.startswith("-") and not is_number(name):
            closest = _closest_in(name, table)
            return "unknown", server.get(name, table.get(closest, 0) if closest else 0), closest
        return "word", 0, None

    first: Arg | None = None
    i = 0
    if args and (binary if binary is not None else not args[0].text.startswith("-")):
        first, i = args[0], 1
    out: list[GivenOption] = []
    while i < len(args):
        w = args[i]
        name = normalize_flag(w.text)
        kind, n, closest = count(name)
        values = tuple(args[i + 1:i + 1 + n])
        out.append(GivenOption(w, Arg(name, w.path, w.line, w.column), name, i, values, kind, False, n, closest))
        i += 1 + len(values)
    return ArgvReading(tuple(args), first, tuple(out))


def _walk(args: list[Arg], binary: bool | None, count: Callable[[str], tuple[Kind, int, str | None]],
          fa_takes_value: bool | None, bare_fa: bool) -> ArgvReading:
    first: Arg | None = None
    i = 0
    if args and (binary if binary is not None else not args[0].text.startswith("-")):
        first, i = args[0], 1
    fa = spellings("-fa")
    out: list[GivenOption] = []
    while i < len(args):
        w = args[i]
        name, inline = normalize_flag(w.text), None
        if w.text.startswith("--") and "=" in w.text:
            base, _, rest = w.text.partition("=")
            name = normalize_flag(base)
            inline = Arg(rest, w.path, w.line, w.column + len(base) + 1 if w.column else 0)
        kind, n, closest = count(name)
        if name in fa and kind != "word" and fa_takes_value is not None:
            n = 1 if fa_takes_value else 0
        flag = Arg(name, w.path, w.line, w.column)
        if inline is not None:
            out.append(GivenOption(w, flag, name, i, (inline,), kind, True, n, closest))
            i += 1
            continue
        if name in fa and n and bare_fa and _bare(args[i + 1].text if i + 1 < len(args) else None):
            n = 0  # what was meant: the switch (the engine would take the next flag as its value)
        values = tuple(args[i + 1:i + 1 + n])
        out.append(GivenOption(w, flag, name, i, values, kind, False, n, closest))
        i += 1 + len(values)
    return ArgvReading(tuple(args), first, tuple(out))


def _bare(after: str | None) -> bool:
    """Whether a `-fa` followed by `after` (None: the line ends) was meant as the switch: the word
    after it is another flag (`-1`, auto, is a value)."""
    return after is None or (after.startswith("-") and after != "-1")


def read_valued(words: Sequence[Arg | str], valued: Container[str]) -> ArgvReading:
    """A command line read without an engine: a name in `valued` takes the next word, any other
    none (memory/iksplit.py's reader, which is given no engine)."""
    return _walk([_as_arg(w) for w in words], None,
                 lambda name: ("known" if name.startswith("-") else "word", 1 if name in valued else 0, None),
                 None, False)


def either_engine_values(words: Sequence[str], k: int) -> int | None:
    """How many of the words after `words[k]` are its values when it is a flag of either engine's
    parser (the most either takes; None: a flag of neither), for splitting moeconf's own command
    line from the engine's before the engine is known (cli.py). A `-fa` followed by another flag
    (or nothing) is the switch that was meant, as fit reads it (read_argv's `bare_fa`)."""
    from moeconf.engines.flagtable import IK, MAINLINE

    w = words[k]
    if w not in MAINLINE and w not in IK:
        return None
    n = max(MAINLINE.get(w, 0), IK.get(w, 0))
    return 0 if w in spellings("-fa") and _bare(words[k + 1] if k + 1 < len(words) else None) else n


def option_values(words: Sequence[str], engine: Engine) -> Iterator[tuple[str, str | None]]:
    """Each option of a plain argv (binary first or not) as `engine`'s parser reads it
    (read_argv): its name and its first value (None for a switch, or a value missing at the end).
    For readers of one setting family (engines/speculative.py, extrafiles.py, kvoverride.py)."""
    for o in read_argv(words, engine).options:
        yield o.name, o.value.text if o.value is not None else None


def named_options(words: Sequence[str], valued: Container[str]) -> Iterator[tuple[str, str | None]]:
    """Each option of a plain argv (binary first or not) read without an engine (read_valued):
    its name and its value, which is the text after `=` of a long option, else the next word for
    a name in `valued` (None when the line ends), else None. For memory/iksplit.py."""
    for o in read_valued(words, valued).options:
        yield o.name, o.value.text if o.value is not None else None


def scan_extra(words: list[str], engine: Engine) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Read `[flags] extra` as the engine would (engines/argvread.py read_argv): (index, option)
    pairs a plan key owns, and (index, word) pairs the engine does not know (it would refuse to
    start). The values of an option are skipped, as the engine skips them (an unknown option's as
    the option probably meant takes them); so is a word after an unknown option that takes none."""
    owned: list[tuple[int, str]] = []
    unknown: list[tuple[int, str]] = []
    after_unknown = False
    for given in read_argv(words, engine, binary=False).options:
        if given.name in PLAN_KEYS:
            owned.append((given.index, given.name))
        elif given.kind == "word" and after_unknown:
            pass  # the value of the unknown option before it, as far as anyone can tell
        elif given.kind in ("unknown", "word"):
            unknown.append((given.index, given.word.text))
        after_unknown = given.kind == "unknown" and not given.values
    return owned, unknown


BENCH_BINARY = "llama-bench"  # the program's name (argv[0] without its folder and .exe)


def is_bench(words: Sequence[Arg | str]) -> bool:
    """Whether the line's first word is the llama-bench program (read by engines/benchline.py with its
    own option table; cheap to ask, so callers import benchline only for such a line)."""
    if not words:
        return False
    w = words[0].text if isinstance(words[0], Arg) else words[0]
    return not w.startswith("-") and w.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".exe") == BENCH_BINARY
