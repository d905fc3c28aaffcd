r"""What C++ `std::regex` (ECMAScript grammar) accepts, how it matches, and in bounded time.

The engines compile each `-ot` pattern with `std::regex` (ECMAScript) and test tensor names with
`std::regex_search`. Matching is simulated with the `regress` engine (ECMAScript). Where
`regress` (ES2018+) and `std::regex` differ, this module follows `std::regex` as libstdc++
(the C++ library of Linux builds) reads it, checked against a real libstdc++ 12 build:

- refused by std::regex, accepted by regress: a back-reference to a group that does not exist
  (`\1` with no group), a `{` that does not start an `{n}` / `{n,m}` interval (`a{`, `{,3}`),
  `\x` without two hex digits, `\u` without four, a class escape as a range end (`[\d-z]`),
  and PCRE/Python syntax: lookbehind, named groups, inline flags `(?i)`, atomic groups.
- read differently: a back-reference to a group that took no part in the match fails in
  std::regex and matches empty in ECMAScript (`(a)|\1`); `\cX` is not a control character in
  libstdc++ (it matched the letter X; the simulation does the same).
- accepted by std::regex, refused by regress: stacked quantifiers (`a*+`, `a++`, `a{2}*`):
  libstdc++ applies them in turn (`a*+` is `(?:a*)+`, not a possessive `a*`). The simulation
  rewrites them that way.
- read as something else than PCRE/Python users mean: `\A`, `\Z`, `\z` are the letters A, Z, z
  (identity escapes, no anchors); `*+` `++` `?+` are not possessive (see above).

Python `re` disagrees with ECMAScript on more: it rejects identity escapes (`\q`, `\k`), reads
`[]a]` as a class of `]` and `a` where ECMAScript reads `[]` (matches nothing) then `a]`, and
`[^]` as an error where ECMAScript reads any character. `python_disagreement` says so, pattern by
pattern.

Time: a backtracking matcher (std::regex and regress alike) takes exponential time on nested or
overlapping quantifiers (`(.|.)*Q`, `(a+)+$`) and polynomial time of high degree on many
unbounded quantifiers (`.*.*.*.*Q`): libstdc++ 12 did not finish `(.|.)*Q` on a 24-character
tensor name in 20 s. Patterns a static screen cannot prove cheap are matched in a forked worker
with a time limit; one that does not finish is reported, never run forever.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

# (pattern, what it is) for PCRE/Python syntax std::regex's ECMAScript grammar refuses
_UNSUPPORTED = [
    (re.compile(r"\(\?<[=!]"), "lookbehind (?<= / (?<!"),
    (re.compile(r"\(\?P?<[A-Za-z_]"), "a named group (?<name> / (?P<name>"),
    (re.compile(r"\(\?P[=>]"), "a Python named-group reference"),
    (re.compile(r"\(\?[aiLmsux-]+[):]"), "inline flags like (?i)"),
    (re.compile(r"\(\?>"), "an atomic group (?>"),
]

# How long one pattern may take over all tensor names of a model before it is reported as
# catastrophic. The names of the largest models (~2,600 tensors) take ~1 ms with a sane pattern.
MATCH_TIME_LIMIT = 1.0


@dataclass(frozen=True)
class RegexProblem:
    offset: int
    message: str
    # "unsupported": PCRE/Python syntax std::regex refuses; "invalid": std::regex refuses it;
    # "misread": std::regex accepts it but reads it otherwise than PCRE/Python (not a refusal);
    # "slow": matching takes too long (the engine would hang at load)
    kind: str

    @property
    def refused(self) -> bool:
        """Whether the engine would not start (or never finish loading) with this pattern."""
        return self.kind != "misread"


@dataclass
class _Parse:
    problems: list[RegexProblem] = field(default_factory=list)
    misreads: list[RegexProblem] = field(default_factory=list)
    groups: int = 0
    suspect: str | None = None  # why matching time may explode, or None when provably cheap
    rewritten: str = ""  # the pattern for regress (stacked quantifiers wrapped)
    python_notes: list[str] = field(default_factory=list)


_HEX = set("0123456789abcdefABCDEF")
_CLASS_ESCAPES = set("dDwWsS")
_ASSERTION_ESCAPES = set("bB")
# escapes Python's re reads the way ECMAScript does (or near enough for tensor names)
_PYTHON_SAME = set("bBdDsSwWfnrtvxu0123456789")
_PYTHON_OTHER = {
    "A": "an anchor at the start", "Z": "an anchor at the end", "a": "the bell character",
    "U": "a \\UXXXXXXXX escape", "N": "a \\N{name} escape",
}


@dataclass
class _Group:
    start: int  # index into the rewritten pieces
    head: str  # "(", "(?:", "(?=", "(?!"
    number: int  # capture group number, 0 for non-capturing
    inner: bool = False  # holds a repetition or an alternation


def _escape(p: str, i: int, out: _Parse, closed: set[int], in_class: bool) -> tuple[int, str]:
    """Read the escape at p[i] == '\\'; return (end, kind) with kind 'class', 'assert' or 'char'."""
    if i + 1 >= len(p):
        out.problems.append(RegexProblem(i, "a trailing '\\' escapes nothing", "invalid"))
        return len(p), "char"
    c = p[i + 1]
    if c in _CLASS_ESCAPES:
        return i + 2, "class"
    if c in _ASSERTION_ESCAPES and not in_class:
        return i + 2, "assert"
    if c == "x":
        if not (len(p) >= i + 4 and p[i + 2] in _HEX and p[i + 3] in _HEX):
            out.problems.append(RegexProblem(i, "'\\x' needs two hex digits (\\x41)", "invalid"))
        return min(i + 4, len(p)), "char"
    if c == "u":
        if not (len(p) >= i + 6 and all(ch in _HEX for ch in p[i + 2: i + 6])):
            out.problems.append(RegexProblem(i, "'\\u' needs four hex digits (\\u0041)", "invalid"))
        return min(i + 6, len(p)), "char"
    if c == "c":
        if i + 2 >= len(p):
            out.problems.append(RegexProblem(i, "'\\c' needs a control letter (\\cJ)", "invalid"))
            return len(p), "char"
        out.misreads.append(RegexProblem(i, f"'\\c{p[i + 2]}' is not a control character in libstdc++'s "
                                         "std::regex (it matched the plain character); avoid \\c", "misread"))
        out.python_notes.append(f"'\\c' at {i}: ECMAScript reads a control character; Python's re refuses it")
        return i + 3, "cchar"
    if c.isdigit() and c != "0" and not in_class:
        j = i + 1
        while j < len(p) and p[j].isdigit():
            j += 1
        n = int(p[i + 1: j])
        if n not in closed:
            still_open = n <= out.groups
            out.problems.append(RegexProblem(
                i, f"back-reference \\{n} to a group that "
                + ("is still open" if still_open else "does not exist")
                + " (std::regex refuses it)", "invalid"))
        out.suspect = out.suspect or "a back-reference"
        return j, "char"
    if c in "AZz" and not in_class:
        out.misreads.append(RegexProblem(
            i, f"std::regex has no \\{c} anchor: it reads \\{c} as the letter {c!r} (write "
            + ("^" if c == "A" else "$") + ")", "misread"))
    if c in _PYTHON_OTHER:
        out.python_notes.append(f"'\\{c}' at {i}: ECMAScript reads it as the letter {c!r}; Python's re reads "
                                f"{_PYTHON_OTHER[c]}")
    elif (c.isascii() and c.isalpha()) and c not in _PYTHON_SAME:
        out.python_notes.append(f"'\\{c}' at {i}: ECMAScript reads it as the letter {c!r}; Python's re refuses it")
    return i + 2, "char"


def _class(p: str, i: int, out: _Parse, closed: set[int]) -> int:
    """Read the class at p[i] == '['; return the index after its ']'."""
    start = i
    i += 1
    negated = i < len(p) and p[i] == "^"
    if negated:
        i += 1
    if i < len(p) and p[i] == "]":
        what = "any character" if negated else "a class that matches nothing"
        out.python_notes.append(f"'{p[start:i + 1]}' at {start}: ECMAScript reads {what}; Python's re reads ']' "
                                "as a member of a longer class")
        return i + 1
    prev_kind: str | None = None  # kind of the previous member, for ranges
    prev_char = ""
    while i < len(p) and p[i] != "]":
        if p[i] == "-" and prev_kind is not None and i + 1 < len(p) and p[i + 1] != "]":
            j = i + 1
            if p[j] == "\\":
                end, kind = _escape(p, j, out, closed, in_class=True)
                hi = p[j + 1] if kind == "char" and end == j + 2 else ""
            else:
                end, kind, hi = j + 1, "char", p[j]
            if prev_kind == "class":
                out.problems.append(RegexProblem(i, "a class escape like \\d cannot start a range", "invalid"))
            elif kind == "class":
                out.problems.append(RegexProblem(j, "a class escape like \\d cannot end a range", "invalid"))
            elif prev_char and hi and prev_char > hi:
                out.problems.append(RegexProblem(i - 1, f"range {prev_char}-{hi} is out of order", "invalid"))
            prev_kind, prev_char = None, ""
            i = end
            continue
        if p[i] == "\\":
            end, kind = _escape(p, i, out, closed, in_class=True)
            plain = kind == "char" and end == i + 2 and p[i + 1] not in "bfnrtv0"
            prev_kind, prev_char = kind, (p[i + 1] if plain else "")
            i = end
            continue
        prev_kind, prev_char = "char", p[i]
        i += 1
    if i >= len(p):
        out.problems.append(RegexProblem(start, "'[' is never closed", "invalid"))
        return len(p)
    return i + 1


_INTERVAL = re.compile(r"\{(\d+)(,(\d*))?\}")


def _parse(p: str) -> _Parse:
    """One pass over the pattern as libstdc++'s ECMAScript scanner reads it: refusals, misreads,
    notes on Python's reading, whether matching time may explode, and the text for regress."""
    out = _Parse()
    for rx, what in _UNSUPPORTED:
        m = rx.search(p)
        if m:
            out.problems.append(RegexProblem(m.start(), f"{what} is not in std::regex's ECMAScript grammar",
                                             "unsupported"))
            out.rewritten = p
            return out
    stack = [_Group(0, "", 0)]
    closed: set[int] = set()
    pieces: list[str] = []
    atom: int | None = None  # index into pieces where the last repeatable atom starts
    quantified = False  # that atom already carries a quantifier (a stacked quantifier follows)
    complex_atom = False  # that atom is a group holding a repetition or an alternation
    unbounded = 0
    i = 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            end, kind = _escape(p, i, out, closed, in_class=False)
            # libstdc++ matched the character itself for \cX
            pieces.append(re.escape(p[i + 2:end]) if kind == "cchar" else p[i:end])
            atom = None if kind == "assert" else len(pieces) - 1
            quantified = complex_atom = False
            i = end
        elif c == "[":
            end = _class(p, i, out, closed)
            pieces.append(p[i:end])
            atom, quantified, complex_atom = len(pieces) - 1, False, False
            i = end
        elif c == "(":
            head = p[i:i + 3] if p.startswith(("(?:", "(?=", "(?!"), i) else "("
            if head == "(" and p.startswith("(?", i):
                out.problems.append(RegexProblem(i, "'(?' must be followed by ':', '=' or '!'", "invalid"))
                head = "(?"
            number = 0
            if head == "(":
                out.groups += 1
                number = out.groups
            stack.append(_Group(len(pieces), head, number))
            pieces.append(head if head != "(?" else "(?:")
            atom = None
            i += len(head)
        elif c == ")":
            if len(stack) == 1:
                out.problems.append(RegexProblem(i, "')' without a matching '('", "invalid"))
                pieces.append("\\)")
                i += 1
                continue
            g = stack.pop()
            closed.add(g.number)
            pieces.append(")")
            atom = None if g.head in ("(?=", "(?!") else g.start
            complex_atom, quantified = g.inner, False
            stack[-1].inner = stack[-1].inner or g.inner
            i += 1
        elif c == "|":
            stack[-1].inner = True
            pieces.append("|")
            atom = None
            i += 1
        elif c in "*+?{":
            if c == "{":
                m = _INTERVAL.match(p, i)
                if not m or (m.group(3) and int(m.group(3)) < int(m.group(1))):
                    out.problems.append(RegexProblem(i, "'{' must start an interval {n}, {n,} or {n,m} (write "
                                                     "\\{ for the character)", "invalid"))
                    pieces.append("\\{")
                    atom, quantified, complex_atom = len(pieces) - 1, False, False
                    i += 1
                    continue
                quant = m.group(0)
                repeats = m.group(2) is not None or int(m.group(1)) > 1
                unbounded += m.group(2) is not None and not m.group(3)
            else:
                quant, repeats = c, c != "?"
                unbounded += c != "?"
            if atom is None:
                out.problems.append(RegexProblem(i, f"'{quant}' has nothing to repeat", "invalid"))
                i += len(quant)
                continue
            if p.startswith("?", i + len(quant)):
                quant += "?"  # lazy
            if quantified:
                # std::regex applies stacked quantifiers in turn: a*+ is (?:a*)+
                pieces[atom] = "(?:" + pieces[atom]
                pieces.append(")")
            if repeats and (complex_atom or quantified):
                out.suspect = out.suspect or f"a repetition of a repetition or alternation at {i}"
            pieces.append(quant)
            stack[-1].inner = True
            quantified = True
            i += len(quant)
        else:
            pieces.append(c)
            if c in "^$":
                atom = None
            else:
                atom, quantified, complex_atom = len(pieces) - 1, False, False
            i += 1
    if len(stack) > 1:
        out.problems.append(RegexProblem(p.find(stack[-1].head or "("), "'(' is never closed", "invalid"))
    if unbounded > 2 and out.suspect is None:
        out.suspect = f"{unbounded} unbounded repetitions"
    m = re.search(r"(?<!\\)(?:\\\\)*[*+?}]\+", p)
    if m:
        out.misreads.append(RegexProblem(m.end() - 2, f"'{m.group(0)[-2:]}' is not a possessive quantifier in "
                                         "std::regex: it repeats the repetition", "misread"))
        out.python_notes.append(f"'{m.group(0)[-2:]}' at {m.end() - 2}: Python's re reads a possessive quantifier; "
                                "std::regex repeats the repetition")
    out.rewritten = "".join(pieces)
    return out


@lru_cache(maxsize=4096)
def _parsed(pattern: str) -> _Parse:
    return _parse(pattern)


def check_regex(pattern: str) -> RegexProblem | None:
    """Why `std::regex(pattern, ECMAScript)` would not compile it, or None. Never raises."""
    parsed = _parsed(pattern)
    if parsed.problems:
        return min(parsed.problems, key=lambda p: p.offset)
    rx = _regress(parsed.rewritten)
    if isinstance(rx, str):
        return RegexProblem(0, f"not a valid ECMAScript regex: {rx}", "invalid")
    return None


def provably_cheap(pattern: str) -> bool:
    """Whether the static screen proves matching `pattern` cheap (no repetition of a repetition
    or alternation, at most two unbounded repetitions, no back-reference): only such patterns
    may be run on names one at a time without a time limit."""
    return _parsed(pattern).suspect is None


def misreadings(pattern: str) -> list[RegexProblem]:
    """Constructs std::regex accepts but reads otherwise than PCRE/Python (`\\A`, `*+`)."""
    return list(_parsed(pattern).misreads)


def python_disagreement(pattern: str) -> str | None:
    """Where Python's `re` reads `pattern` otherwise than ECMAScript (std::regex), or None:
    patterns are often tried in Python first."""
    parsed = _parsed(pattern)
    notes = list(parsed.python_notes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except re.error as e:
        if not notes:
            notes.append(f"Python's re refuses it ({e.msg} at {e.pos})")
    except (RecursionError, OverflowError, ValueError) as e:
        notes.append(f"Python's re refuses it ({e})")
    return "; ".join(notes) or None


@lru_cache(maxsize=4096)
def _regress(pattern: str) -> object:
    """The compiled regress regex, or the error message (a str)."""
    import regress

    try:
        return regress.Regex(pattern)
    except Exception as e:  # regress raises RegressError (a plain Exception subclass)
        return str(e).rstrip(".") or e.__class__.__name__


def ecmascript_compiled(pattern: str) -> Any:
    """The regress regex simulating std::regex for a pattern `check_regex` accepts."""
    rx = _regress(_parsed(pattern).rewritten)
    if isinstance(rx, str):
        raise ValueError(f"{pattern!r}: {rx}")
    return rx


def _search_inline(pattern: str, names: Sequence[str]) -> frozenset[str]:
    rx = _regress(_parsed(pattern).rewritten)
    assert not isinstance(rx, str), rx
    find = rx.find  # type: ignore[attr-defined]
    return frozenset(n for n in names if find(n) is not None)


def ecmascript_search(pattern: str, names: Sequence[str], time_limit: float | None = None
                      ) -> frozenset[str] | RegexProblem:
    """The names `std::regex_search` finds `pattern` in, or why it cannot be simulated (the
    pattern is invalid, or takes longer than `time_limit` seconds over `names`). Never raises
    and never runs longer than about `time_limit`. Results are cached per (pattern, names)."""
    problem = check_regex(pattern)
    if problem is not None:
        return problem
    key = (pattern, tuple(names))
    hit = _RESULTS.get(key)
    if hit is not None:
        return hit
    parsed = _parsed(pattern)
    if parsed.suspect is None or not hasattr(os, "fork"):
        result: frozenset[str] | RegexProblem = _search_inline(pattern, key[1])
    else:
        limit = MATCH_TIME_LIMIT if time_limit is None else time_limit
        result = _search_forked(pattern, key[1], limit, parsed.suspect)
    if len(_RESULTS) >= 256:
        _RESULTS.clear()
    _RESULTS[key] = result
    return result


_RESULTS: dict[tuple[str, tuple[str, ...]], frozenset[str] | RegexProblem] = {}


class TimeBudget:
    """A total time for the slow patterns of one command line: each gets at most
    MATCH_TIME_LIMIT, and none less than `floor` (a screened pattern that is in fact cheap
    takes ~15 ms), so many catastrophic items cannot add up to minutes."""

    def __init__(self, total: float = 3.0, floor: float = 0.1) -> None:
        self.end = time.monotonic() + total
        self.floor = floor

    def limit(self) -> float:
        return max(self.floor, min(MATCH_TIME_LIMIT, self.end - time.monotonic()))


def _search_forked(pattern: str, names: tuple[str, ...], limit: float, why: str) -> frozenset[str] | RegexProblem:
    """Match in a forked child, killed after `limit` seconds. The child writes one byte per name."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: match, report, exit without running any cleanup of the parent's
        try:
            os.close(r)
            rx = _regress(_parsed(pattern).rewritten)
            find = rx.find  # type: ignore[attr-defined]
            data = bytes(1 if find(n) is not None else 0 for n in names)
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(0)
    os.close(w)
    got = bytearray()
    deadline = time.monotonic() + limit
    finished = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                break
            chunk = os.read(r, 65536)
            if not chunk:
                finished = len(got) == len(names)
                break
            got += chunk
    finally:
        os.close(r)
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not finished:
        return RegexProblem(
            0, f"this pattern takes too long to match (over {limit:g} s for {len(names)} tensor names; {why} "
            "makes a backtracking matcher's time explode): the engine's std::regex backtracks the same way and "
            "would stall the model load", "slow")
    return frozenset(n for n, hit in zip(names, got, strict=True) if hit)
