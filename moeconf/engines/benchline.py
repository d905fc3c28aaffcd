"""A llama-bench command line, read as llama-bench's own parser reads it (engines/benchtable.py,
generated from the pinned llama-bench.cpp sources; read_argv with `bench=True`), and each test it
runs written as the common parser's line (`BenchTest.words`), which every other reader of moeconf
(parse_invocation, the memory settings, the lint rules) then reads as it reads a server's.

What llama-bench does differently from llama-server, from its sources:
- most options take a `,`-separated list, and a repeated option adds to the list: llama-bench runs
  one test per combination of the lists (`-ub 512,1024` runs two);
- llama.cpp: `-ot` takes `,`-separated sets of `;`-separated overrides, one test per set (an empty
  set runs without overrides); ik_llama.cpp: `-ot` items are `,`-separated and every `-ot` (and
  each `--n-cpu-moe`, which adds its own per-block rules in line order) adds to one list;
- booleans are values (`-nopo 1`, `-fa 0`), lists of 0/1 on llama.cpp;
- no `-c`: each test's context is its prompt plus its generated tokens (llama.cpp: plus `-d`);
  `-p 512 -n 128` runs two tests, pp512 (context 512) and tg128 (context 128);
- no `--fit` on llama.cpp (its -fitt/-fitc fit only when given); no environment variables, no
  config files; its defaults differ from the server's (benchtable *_DEFAULTS: llama.cpp -ngl -1,
  -fa auto; ik_llama.cpp -ngl 999, -fa 1, -mla 3).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from moeconf.engines import Engine
from moeconf.engines.argvread import BENCH_BINARY, Arg, ArgvReading, GivenOption, read_argv
from moeconf.engines.flags import c_int as _c_int
from moeconf.engines.flags import flag_table

# the settings that decide each test's context (the rest of a test is one value of each list)
_CONTEXT = ("n_prompt", "n_gen", "n_pg", "n_gp", "n_depth")
# the settings that change neither where tensors go nor what a test allocates: how llama-bench
# times and prints (a list of them still multiplies the tests)
_TIMING = frozenset({
    "reps", "prio", "delay", "output_format", "output_format_stderr", "verbose", "progress", "no_warmup",
    "warmup", "numa", "cpu_mask", "cpu_strict", "poll", "hf_token", "print_overrides", "use_thp", "sas",
    "rcache", "reuse",
})
# settings moeconf does not model for llama-bench: explain refuses a line that gives them
_UNMODELLED = {
    "fit_params_target": "llama-bench fits the model at load time with -fitt/-fitc (llama_params_fit)",
    "fit_params_min_ctx": "llama-bench fits the model at load time with -fitt/-fitc (llama_params_fit)",
    "fit": "ik_llama.cpp's llama-bench fits the model at load time with --fit",
    "n_gp": "ik_llama.cpp's -gp test (generation after a prompt of its own size)",
}
MAX_VALUES = 4096  # the values moeconf reads from one range list
MAX_TESTS = 16  # the placements lint simulates per line (each -ot set, -ngl, -ncmoe, ... combination)


def _tables(engine: Engine) -> tuple[dict[str, int], frozenset[str], dict[str, str], dict[str, str],
                                     frozenset[str], frozenset[str], tuple[str, str] | None]:
    from moeconf.engines import benchtable as t

    if engine.name == "ik_llama.cpp":
        return t.IK_FLAGS, t.IK_LISTS, t.IK_FIELDS, t.IK_DEFAULTS, t.IK_RANGES, t.IK_BOOLS, t.IK_NCMOE_PATTERN
    return (t.MAINLINE_FLAGS, t.MAINLINE_LISTS, t.MAINLINE_FIELDS, t.MAINLINE_DEFAULTS, t.MAINLINE_RANGES,
            t.MAINLINE_BOOLS, t.MAINLINE_NCMOE_PATTERN)


_ENUMS = {
    "LLAMA_FLASH_ATTN_TYPE_AUTO": "auto", "LLAMA_FLASH_ATTN_TYPE_ENABLED": "on",
    "LLAMA_FLASH_ATTN_TYPE_DISABLED": "off", "GGML_TYPE_F16": "f16", "LLAMA_SPLIT_MODE_LAYER": "layer",
    "true": "1", "false": "0",
}


def default(engine: Engine, setting: str) -> str | None:
    """llama-bench's default for `setting` as a value of its own option (benchtable *_DEFAULTS:
    `{ -1 }` is "-1", `{ LLAMA_FLASH_ATTN_TYPE_AUTO }` "auto", `{true}` "1"); None where the
    default is not one plain value (a call, an empty list)."""
    raw = _tables(engine)[3].get(setting)
    if raw is None:
        return None
    inner = raw.strip()
    while inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1].strip()
    inner = _ENUMS.get(inner, inner)
    return inner if re.fullmatch(r"-?\d+|[a-z0-9]+", inner) else None


@dataclass(frozen=True)
class Piece:
    """One value of a list as llama-bench reads it: `arg` where it is written (a piece of the
    option's word, placed by its column), `text` the value (a range's member: `128-512*2` gives 128,
    256, 512, each with the range's place)."""

    arg: Arg
    text: str


@dataclass(frozen=True)
class SliceArg(Arg):
    """A piece of a word: its text starts `offset` characters into `base`, whose own placing (a
    quoted shell word maps each character to its file position) places it; what the word's value
    depends on (`depends`, a shell variable the file does not set) is the piece's too."""

    base: Arg | None = None
    offset: int = 0

    def at(self, offset: int) -> tuple[int, int]:
        return self.base.at(self.offset + offset) if self.base is not None else super().at(offset)

    @property
    def depends(self) -> str:
        return str(getattr(self.base, "depends", "") or "")


def _piece(arg: Arg, pos: int, text: str) -> Arg:
    """`text`, the piece of `arg` at `pos`, placed through `arg`."""
    base = arg.base if isinstance(arg, SliceArg) and arg.base is not None else arg
    start = (arg.offset if isinstance(arg, SliceArg) else 0) + pos
    line, column = base.at(start) if base.line else (0, 0)
    return SliceArg(text, arg.path, line, column, base, start)


def _split(arg: Arg, sep: str) -> list[Arg]:
    """`arg` cut at every `sep` (getline: no piece after a trailing separator), each piece placed."""
    out, pos = [], 0
    parts = arg.text.split(sep)
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    for part in parts:
        out.append(_piece(arg, pos, part))
        pos += len(part) + 1
    return out


_RANGE = re.compile(r"(-?\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


def int_range(text: str, negative: bool = False) -> list[int] | None:
    """llama.cpp llama-bench's int list (parse_int_range): `,`-separated `first[-last[+|*step]]`
    items; None where it stops ("invalid range"). ValueError past MAX_VALUES values (llama-bench
    would run them all: moeconf reads no more)."""
    out: list[int] = []
    for item in text.split(","):
        m = _RANGE.fullmatch(item)
        if m is None or (not negative and item.startswith("-")):
            return None
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        op, step = m.group(3) or "+", int(m.group(4)) if m.group(4) else 1
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                return None
            i = nxt
            if len(out) > MAX_VALUES:
                raise ValueError(f"more than {MAX_VALUES:,} values")
    return out


@dataclass
class BenchLine:
    """A llama-bench line: the values each setting is given (in order, as llama-bench appends
    them), what it refuses (each with the word and why), and the tests it runs."""

    engine: Engine
    reading: ArgvReading
    given: dict[str, list[Piece]] = field(default_factory=dict)  # setting -> its values, in order
    options: dict[str, list[GivenOption]] = field(default_factory=dict)  # setting -> the options giving it
    problems: list[tuple[Arg, str]] = field(default_factory=list)
    unknown: list[tuple[Arg, str]] = field(default_factory=list)  # (flag, message)

    @property
    def binary(self) -> Arg | None:
        return self.reading.binary

    def values(self, setting: str) -> list[Piece]:
        """The values a setting takes in the tests: those given, else llama-bench's default."""
        if setting in self.given:
            return self.given[setting]
        d = default(self.engine, setting)
        return [Piece(Arg(d), d)] if d is not None else []

    def spelled(self, setting: str) -> str:
        """The setting as the line writes it (`-ub 512,1024`)."""
        opts = self.options.get(setting, [])
        return " ".join(f"{o.word.text} {o.value.text if o.value else ''}".strip() for o in opts)

    def contexts(self) -> list[tuple[str, int]]:
        """Each test's (name, context) for one combination of the other lists: llama-bench's pp
        tests (one per -p > 0), tg tests (-n > 0) and -pg pairs, at each depth (-d; llama.cpp)."""
        def nums(setting: str) -> list[int]:
            return [int(p.text) for p in self.values(setting) if re.fullmatch(r"-?\d+", p.text)]

        depths = nums("n_depth") or [0]
        out = []
        for d in depths:
            at = f" @ d{d}" if d else ""
            out += [(f"pp{p}{at}", p + d) for p in nums("n_prompt") if p > 0]
            out += [(f"tg{n}{at}", n + d) for n in nums("n_gen") if n > 0]
            for piece in self.given.get("n_pg", []):
                a, _, b = piece.text.partition(",")
                if a.strip().lstrip("-").isdigit() and b.strip().lstrip("-").isdigit() and (int(a) or int(b)):
                    out.append((f"pp{int(a)}+tg{int(b)}{at}", int(a) + int(b) + d))
        return out

    def lists(self) -> dict[str, list[Piece]]:
        """Every setting of a test but the context ones, with the values it takes (one test each)."""
        lists_ = _tables(self.engine)[1]
        fields = _tables(self.engine)[2]
        out: dict[str, list[Piece]] = {}
        for flag in sorted(lists_):
            s = fields.get(flag)
            if s is not None and s not in _CONTEXT and s not in out:
                vals = self.values(s)
                if vals:
                    out[s] = vals
        return out

    def test_count(self) -> int:
        n = len(self.contexts())
        for vals in self.lists().values():
            n *= len(vals)
        return n

    def placements(self) -> int:
        """How many tests place or allocate differently (the combinations `tests(placement_only=True)`
        walks before its limit)."""
        n = 1
        for s, vals in self.lists().items():
            if s not in _TIMING:
                n *= len(vals)
        return n

    def varying(self) -> list[str]:
        """The settings given more than one value outside the context (each multiplies the tests)."""
        return [s for s, v in self.lists().items() if len(v) > 1]

    def unmodelled(self) -> list[str]:
        """Why moeconf cannot explain this line's tests (settings it does not model), if any."""
        out = []
        for s, why in _UNMODELLED.items():
            vals = self.given.get(s, [])
            if any(p.text not in ("0", "") for p in vals):
                out.append(f"{why} ({self.spelled(s)}): moeconf does not model it; drop it to explain the "
                           "placement it fits from")
        return out

    def tests(self, *, placement_only: bool = False, limit: int = MAX_TESTS) -> list[BenchTest]:
        """The tests, at most `limit`, each at the largest context of the line (the test that needs
        the most memory: every context test of one combination loads the same model).
        `placement_only`: one test per combination of what decides placement or memory (the timing
        settings take their first value)."""
        lists_ = self.lists()
        keys = [s for s in lists_ if not (placement_only and s in _TIMING)]
        # the settings given one value (not a list): the last given, as llama-bench keeps it
        single = {s: v[-1] for s, v in self.given.items() if s not in lists_ and s not in _CONTEXT}
        fixed = {**single, **{s: v[0] for s, v in lists_.items() if s not in keys}}
        contexts = self.contexts()
        name, ctx = max(contexts, key=lambda c: c[1]) if contexts else ("", 0)
        # the combinations that change fewest lists from their first value first: past the limit, each
        # value of each list is still seen once where the limit allows (every -ot set before its mixes)
        ranges = [range(len(lists_[s])) for s in keys]
        total = 1
        for r in ranges:
            total *= len(r)
        combos = itertools.product(*ranges)
        ordered = (sorted(combos, key=lambda idx: (sum(1 for i in idx if i), idx)) if total <= 20_000
                   else itertools.islice(combos, limit))
        out = []
        for idx in ordered:
            out.append(BenchTest(self, {**fixed, **{s: lists_[s][i] for s, i in zip(keys, idx, strict=True)}},
                                 name, ctx))
            if len(out) >= limit:
                break
        return out

    def explain_refusal(self) -> str | None:
        """Why `explain` cannot take this line as one test, naming the list to cut (None: it can)."""
        if self.unknown:
            return self.unknown[0][1]
        if self.problems:
            return self.problems[0][1]
        if not self.contexts():
            return (f"llama-bench runs no test ({self.spelled('n_prompt')} {self.spelled('n_gen')}: every -p and -n "
                    "is 0, and no -pg): give -p or -n to explain one").replace("( ", "(").replace(" :", ":")
        vary = self.varying()
        if vary:
            shown = ", ".join(self.spelled(s) for s in vary[:3])
            return (f"llama-bench runs {self.test_count()} tests ({shown}): give one value to explain it "
                    "(moeconf explains one test; each context test of it, -p/-n/-pg/-d, is shown at the largest)")
        why = self.unmodelled()
        if why:
            return why[0]
        tests = self.tests(limit=1)
        left = tests[0].untranslated() if tests else []
        if left:
            return (f"moeconf does not model llama-bench's {left[0]} (no server option sets it): drop it to "
                    "explain the test")
        return None


@dataclass(frozen=True)
class BenchTest:
    """One test of a llama-bench line: one value of each list, at the context `context` (the test
    `name`, pp512 or tg128, with the largest context of the line)."""

    line: BenchLine
    chosen: dict[str, Piece]
    name: str
    context: int

    def words(self) -> list[Arg]:
        """The test as the common parser's line: the same program word first (the memory readers
        take it as a program that runs one sequence), each setting as the server's option of the
        same spelling (llama-bench took its spellings from the server's: a 0/1 value becomes the
        server's switch or its negation), values keeping their place on the line, then `-c` (the
        test's context) and fit off on llama.cpp (llama-bench has no --fit)."""
        return self._written()[0]

    def untranslated(self) -> list[str]:
        """The settings of the test that no server option sets (moeconf does not model them)."""
        return self._written()[1]

    def _written(self) -> tuple[list[Arg], list[str]]:
        eng = self.line.engine
        server = flag_table(eng)
        fields = _tables(eng)[2]
        out: list[Arg] = [self.line.binary] if self.line.binary is not None else [Arg(BENCH_BINARY)]
        missing: list[str] = []
        overrides = "buft_overrides" if eng.name == "ik_llama.cpp" else "tensor_buft_overrides"
        if eng.name == "ik_llama.cpp":
            out.extend(self._ik_overrides())
        elif (p := self.chosen.get(overrides)) is not None and p.text:
            # the set's `;`-separated overrides as the server's `,`-separated items (same places)
            out.extend([Arg("-ot"), replace(p.arg, text=p.text.replace(";", ","))])
        for setting, p in self.chosen.items():
            if setting in _TIMING or setting in _CONTEXT or setting in _UNMODELLED or setting == overrides:
                continue
            # the setting's spellings: the ones the server knows first, the one the line writes first
            # among those, then the shortest
            written = {o.name for o in self.line.options.get(setting, [])}
            names = sorted((f for f, s in fields.items() if s == setting),
                           key=lambda f: (f not in server, f not in written, len(f), f))
            value = p.text.strip()
            at = p.arg if p.arg.text == p.text else Arg(p.text)
            valued = [f for f in names if server.get(f) == 1]
            switches = [f for f in names if server.get(f) == 0]
            if setting == "flash_attn" and eng.name == "ik_llama.cpp":
                # ik's llama-bench reads 0/1; its server on|off (or, before 2025-11-13, a bare switch)
                on = value not in ("0", "")
                out.extend([Arg(valued[0]), Arg("on" if on else "off")] if eng.fa_takes_value and valued
                           else [Arg(valued[0] if valued else names[0])] if on else [])
            elif valued and (setting not in self._bools() or not switches):
                if setting in self._separators():
                    old, new = self._separators()[setting]
                    at = replace(at, text=p.text.replace(old, new))
                out.extend([Arg(valued[0]), at])
            elif value not in ("0", ""):
                if switches:
                    out.append(Arg(switches[0], p.arg.path, p.arg.line, p.arg.column))
                elif value != default(eng, setting):
                    missing.append(self.line.spelled(setting) or setting)
            else:
                neg = self._negation(names, server)
                if neg is not None:
                    out.append(Arg(neg, p.arg.path, p.arg.line, p.arg.column))
                elif value != (default(eng, setting) or "0"):
                    missing.append(self.line.spelled(setting) or setting)
        out.extend([Arg("-c"), Arg(str(self.context))])
        if eng.has_fit and eng.fit_flag == "-fit":
            out.extend([Arg("-fit"), Arg("off")])
        return out, missing

    def _bools(self) -> frozenset[str]:
        fields = _tables(self.line.engine)[2]
        return frozenset(fields[f] for f in _tables(self.line.engine)[5] if f in fields)

    @staticmethod
    def _separators() -> dict[str, tuple[str, str]]:
        """How a test's value is written for the server where llama-bench separates its parts
        otherwise: -ts `;` (the server's `,` or `/`), -dev `/` (the server's `,`)."""
        return {"tensor_split": (";", "/"), "devices": ("/", ",")}

    @staticmethod
    def _negation(names: list[str], server: dict[str, int]) -> str | None:
        """The server's switch that turns a setting off, for a llama-bench 0: the option table's
        other side of the row (`--repack` -> `--no-repack`, `-nkvo` -> `-kvo`), else the engines'
        `no-` form (ik `-fmoe` -> `-no-fmoe`, `--mmap` -> `--no-mmap`) where the server knows it."""
        from moeconf.engines.options import row_of

        for f in names:
            r = row_of(f)
            if r is not None:
                other = r.negs if f in r.names else r.names
                for o in other:
                    if server.get(o) == 0:
                        return o
        for f in names:
            neg = f"--no-{f[2:]}" if f.startswith("--") else f"-no-{f[1:]}"
            if server.get(neg) == 0:
                return neg
        return None

    def _ik_overrides(self) -> list[Arg]:
        """ik_llama.cpp: every -ot item and each --n-cpu-moe's rules, in line order, as -ot values (its
        llama-bench keeps one list, and its --n-cpu-moe takes blocks 0..N-1 whatever the server's does;
        the server would put --n-cpu-moe's rules last)."""
        before, after = _tables(self.line.engine)[6] or ("", "")
        out: list[Arg] = []
        for o in self.line.options.get("buft_overrides", []):
            v = o.value
            if v is None:
                continue
            if o.name in ("-ot", "--override-tensor"):
                out.extend([Arg("-ot"), v])
            else:
                n = _c_int(v.text) or 0
                if n > 0:
                    # its per-block rules (blocks 0..N-1, whether the model has them or not) all send to
                    # the CPU: one rule naming the blocks matches the same tensors, first-match alike
                    blocks = "|".join(str(il) for il in range(n))
                    out.extend([Arg("-ot"), Arg(f"{before}({blocks}){after}=CPU")])
        return out


def read_bench(words: Sequence[Arg | str], engine: Engine) -> BenchLine:
    """A llama-bench line as its own parser reads it: each option's values (a list split on `,`,
    ranges expanded), and what it refuses (an unknown option, a missing value, a value it cannot
    read: it prints its usage and stops)."""
    args = [w if isinstance(w, Arg) else Arg(w) for w in words]
    reading = read_argv(args, engine, bench=True)
    _flags, lists, fields, _defaults, ranges, bools, _ncmoe = _tables(engine)
    line = BenchLine(engine, reading)
    label = f"llama-bench ({engine.label})"
    for o in reading.options:
        if o.kind == "unknown":
            meant = f" (did you mean {o.closest}?)" if o.closest else ""
            line.unknown.append((o.flag, f"{label} has no option {o.name!r}{meant}: it prints its usage and "
                                         "stops (\"invalid parameter for argument\"); llama-bench has its own "
                                         "options, not the server's"))
            continue
        if o.kind == "word":
            line.problems.append((o.word, f"{label} takes no positional word {o.word.text!r}: it stops "
                                          "(\"invalid parameter for argument\")"))
            continue
        setting = fields.get(o.name)
        if o.missing:
            line.problems.append((o.flag, f"{o.name} needs a value"))
            continue
        if setting is None or o.value is None:
            continue
        line.options.setdefault(setting, []).append(o)
        v = o.value
        if setting in ("n_pg", "n_gp"):
            a_, sep, b_ = v.text.partition(",")
            if not sep or "," in b_ or _c_int(a_) is None or _c_int(b_) is None:
                line.problems.append((v, f"{o.name} {v.text!r}: {label} takes a pair `PROMPT,GENERATED` there "
                                         "and stops"))
                continue
            line.given.setdefault(setting, []).append(Piece(v, v.text))  # each -pg adds a test
            continue
        if setting == "buft_overrides" and o.name not in ("-ot", "--override-tensor"):
            n = _c_int(v.text)
            if n is None or n < 0:  # ik's --n-cpu-moe: std::stoi, and it refuses a negative count
                line.problems.append((v, f"{o.name} {v.text!r}: {label} takes a number of blocks >= 0 there "
                                         "and stops"))
                continue
        if o.name not in lists:
            line.given[setting] = [Piece(v, v.text)]  # one value (ik's -ot and --n-cpu-moe: read from options)
            continue
        if setting == "tensor_buft_overrides":
            # llama.cpp's sets: every `,` starts one, a trailing or doubled `,` an empty one (no overrides)
            pieces, pos = [], 0
            for part in v.text.split(","):
                pieces.append(_piece(v, pos, part))
                pos += len(part) + 1
        else:
            pieces = _split(v, ",") if v.text else [v]
        got: list[Piece] = []
        if o.name in ranges:
            for a in pieces:
                try:
                    nums = int_range(a.text, negative=setting == "n_gpu_layers")
                except ValueError as e:
                    line.problems.append((a, f"{o.name} {a.text!r} gives {e}: moeconf does not read so many "
                                             "tests; give fewer"))
                    break
                if nums is None:
                    line.problems.append((a, f"{o.name} {v.text!r}: {label} reads a list of numbers or ranges "
                                             f"(first[-last[+|*step]]) there, not {a.text!r}, and stops"))
                    break
                got += [Piece(a, str(n)) for n in nums]
            else:
                line.given.setdefault(setting, []).extend(got)
            continue
        if o.name in bools:
            bad = [a for a in pieces if a.text.strip() not in ("0", "1")]
            if bad:
                line.problems.append((bad[0], f"{o.name} {v.text!r}: {label} reads 0 or 1 there (a list of them), "
                                              f"not {bad[0].text!r}, and stops"))
                continue
            got = [Piece(a, a.text.strip()) for a in pieces]
        elif setting == "ser":  # ik: pairs of values
            got = [Piece(_piece(a, 0, f"{a.text},{b.text}"), f"{a.text},{b.text}")
                   for a, b in zip(pieces[::2], pieces[1::2], strict=False)]
        else:
            got = [Piece(a, a.text) for a in pieces]
        line.given.setdefault(setting, []).extend(got)
    return line
