"""A small POSIX-shell word splitter that remembers where every character came from.

Enough of the shell for launch scripts: quotes, backslash escapes, line continuations, comments,
heredocs, `$VAR` / `${VAR}` from earlier assignments, and command separators. Each word knows the
file position of each of its characters (as runs, so a 50 MB word costs no more than its text),
so a finding can point into the middle of an `-ot` value. A word whose value the file does not
fix (a command substitution, a variable set elsewhere, an expansion over budget) says so in
`depends`, and a file the shell itself would refuse (an unterminated quote) yields a `Problem`.
Work is linear in the text, and variable expansion is bounded by a `Budget`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from moeconf.engines.argvread import Arg

Pos = tuple[int, int]
Run = tuple[int, int, int, int]  # (offset into the word, file line, file column, column step 0 or 1)

_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "ash", "busybox"}
_PLAIN = re.compile(r"[^ \t\r\n'\"\\$`;&|<]+")
_DQ_PLAIN = re.compile(r'[^"\\$`]+')
_BLANK = re.compile(r"[ \t\r]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL = re.compile(r"[0-9@*#?$!-]")
_PAREN_STOP = re.compile(r"[()'\"\\`]")
_MATTERS = re.compile(r"""['"\\$`;&|<=]|\\$""")
# the rest of a command too long to keep: quoted strings, escapes and substitutions, up to a separator
_REST = re.compile(r"""(?:[^'"\\;&|\n`$]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.|\$\([^)]*\)|`[^`]*`|\$)*""", re.S)
_HEREDOC_WORD = re.compile(r"""[ \t]*(?:'([^'\n]*)'|"([^"\n]*)"|\\?([^\s;&|<>()'"]+))""")

MAX_WORDS = 20_000  # words kept per command (a launch has dozens); a longer command is cut, and says so
MAX_EXPANSION = 1 << 20  # characters one variable value or one word may reach by expansion
TOTAL_EXPANSION = 16 << 20  # characters all expansions of one file may produce


class Budget:
    """How many more characters variable expansion may produce (per file, shared by its pieces)."""

    def __init__(self, total: int = TOTAL_EXPANSION) -> None:
        self.remaining = total

    def take(self, n: int) -> bool:
        if n > self.remaining or n > MAX_EXPANSION:
            return False
        self.remaining -= n
        return True


class PosMap:
    """Maps (line, column) of the text being split (1-based) to file positions, as runs."""

    def runs(self, line: int, col: int, n: int) -> list[tuple[int, int, int, int]]:
        """(file line, file column, step, count) covering n characters from (line, col)."""
        return [(line, col, 1, n)]


class Fixed(PosMap):
    """Text cut from one file line, starting after column `col0`."""

    def __init__(self, line: int, col0: int) -> None:
        self.line, self.col0 = line, col0

    def runs(self, line: int, col: int, n: int) -> list[tuple[int, int, int, int]]:
        return [(self.line, self.col0 + col, 1, n)]


class Segmented(PosMap):
    """Text built from one file line by substitution: segments (text start, file column, step,
    length), 0-based text offsets; substituted text keeps the column of what it replaced."""

    def __init__(self, line: int, col0: int, segments: list[tuple[int, int, int, int]]) -> None:
        self.line, self.col0, self.segments = line, col0, segments
        self.starts = [s[0] for s in segments]

    def runs(self, line: int, col: int, n: int) -> list[tuple[int, int, int, int]]:
        out = []
        off = col - 1
        end = off + n
        k = max(0, bisect.bisect_right(self.starts, off) - 1)
        while off < end:
            if k >= len(self.segments):
                out.append((self.line, self.col0 + off + 1, 1, end - off))
                break
            start, fcol, step, length = self.segments[k]
            take = min(end, start + length) - off
            if take <= 0:
                k += 1
                continue
            out.append((self.line, self.col0 + fcol + 1 + step * (off - start), step, take))
            off += take
            k += 1
        return out


@dataclass
class Word:
    parts: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    length: int = 0
    quoted: bool = False
    depends: str = ""  # why the value is not fixed by the file ("" if it is)

    @property
    def text(self) -> str:
        if len(self.parts) != 1:
            self.parts = ["".join(self.parts)]
        return self.parts[0]

    def add(self, s: str, runs: list[tuple[int, int, int, int]]) -> None:
        """Append `s`, whose characters sit at `runs` ((line, col, step, count) covering len(s))."""
        if not s:
            return
        self.parts.append(s)
        off = self.length
        for line, col, step, count in runs:
            if self.runs:
                o, ln, c, st = self.runs[-1]
                if ln == line and st == step and c + st * (off - o) == col:
                    off += count
                    continue
                if ln == line and off - o == 1 and col == c + step:  # a one-character run takes any step
                    self.runs[-1] = (o, ln, c, step)
                    off += count
                    continue
            self.runs.append((off, line, col, step))
            off += count
        self.length += len(s)

    def at(self, offset: int) -> Pos:
        if not self.runs:
            return 0, 0
        k = max(0, bisect.bisect_right(self.runs, (offset, 1 << 62)) - 1)
        o, line, col, step = self.runs[k]
        return line, col + step * (offset - o)

    @property
    def start(self) -> Pos:
        return self.at(0)

    def tail(self, k: int) -> Word:
        """The word from character k on (the value of `NAME=value`)."""
        text = self.text[k:]
        w = Word(quoted=self.quoted, depends=self.depends)
        if not text:
            return w
        i = max(0, bisect.bisect_right(self.runs, (k, 1 << 62)) - 1)
        runs = [(0, *self.at(k), self.runs[i][3])]
        runs += [(o - k, ln, c, st) for o, ln, c, st in self.runs[i + 1:]]
        w.parts, w.runs, w.length = [text], runs, len(text)
        return w

    def lstrip(self, chars: str) -> None:
        text = self.text
        k = len(text) - len(text.lstrip(chars))
        if k:
            t = self.tail(k)
            self.parts, self.runs, self.length = t.parts, t.runs, t.length


@dataclass(frozen=True)
class PosArg(Arg):
    """An `Arg` that knows the file position of each character (`runs`, as in `Word`) and
    whether its value depends on something the file does not fix (`depends`)."""

    runs: tuple[Run, ...] = ()
    depends: str = ""

    def at(self, offset: int) -> tuple[int, int]:
        if self.runs:
            k = max(0, bisect.bisect_right(self.runs, (offset, 1 << 62)) - 1)
            o, line, col, step = self.runs[k]
            return line, col + step * (offset - o)
        return super().at(offset)


def to_arg(word: Word, path: str) -> Arg:
    line, col = word.start if word.runs else (0, 0)
    return PosArg(word.text, path, line, col, tuple(word.runs), word.depends)


@dataclass
class Command:
    words: list[Word]
    line: int
    cut: int = 0  # words left out after MAX_WORDS


@dataclass(frozen=True)
class Problem:
    """Something in the text the shell itself would refuse."""

    line: int
    column: int
    message: str


class ShellText:
    """One pass over shell text: `commands()` yields commands; `variables` and `problems` fill up
    along the way."""

    def __init__(self, text: str, variables: Mapping[str, str] | None = None, position: PosMap | None = None,
                 assign: bool = True, budget: Budget | None = None) -> None:
        self.text = text
        self.var: dict[str, str] = dict(variables or {})
        self.dynamic: dict[str, str] = {}  # variable -> why its value is not known
        self.pos = position or PosMap()
        self.assign = assign
        self.budget = budget or Budget()
        self.problems: list[Problem] = []
        self._close_brace = -2  # cache for the next "}" (keeps `${` scans linear)
        self.skip_rest: int | None = None  # set by the reader: stop at the next command
        self.stopped_at: int | None = None  # where the scan stopped for skip_rest
        # whether a line's text may hold a command that matters to the reader (default: any)
        self.interesting: Callable[[str], bool] = lambda line: True

    # positions ---------------------------------------------------------------------------

    def _line_col(self, i: int) -> Pos:
        return self._line, i - self._line_start + 1

    def _move(self, i: int, j: int) -> None:
        """The scan moved from i to j: keep line bookkeeping."""
        nl = self.text.count("\n", i, j)
        if nl:
            self._line += nl
            self._line_start = self.text.rfind("\n", i, j) + 1

    def _add(self, w: Word, i: int, j: int) -> None:
        """Add text[i:j] (file characters) to w, with positions."""
        text = self.text
        while i < j:
            nl = text.find("\n", i, j)
            end = j if nl == -1 else nl + 1
            line, col = self._line_col(i)
            w.add(text[i:end], self.pos.runs(line, col, end - i))
            self._move(i, end)
            i = end

    def _add_value(self, w: Word, value: str, at: Pos) -> None:
        line, col = at
        first = self.pos.runs(line, col, 1)[0]
        w.add(value, [(first[0], first[1], 0, len(value))])

    # the scan ----------------------------------------------------------------------------

    def commands(self) -> Iterator[Command]:
        text = self.text
        n = len(text)
        self._line, self._line_start = 1, 0
        words: list[Word] = []
        cur: Word | None = None
        heredocs: list[tuple[str, bool]] = []  # (delimiter, strip tabs) pending at the end of this line
        cmd_line = 1
        i = 0

        cut = 0

        def keep(w: Word) -> None:
            nonlocal cut
            if not (w.length or w.quoted):
                return  # an unquoted expansion to nothing is no word
            if len(words) >= MAX_WORDS:
                cut += 1
                return
            words.append(w)

        def finish() -> Command | None:
            nonlocal words, cut
            cmd = None
            if words:
                if self.assign and not cut:
                    self._apply_assignments(words)
                cmd = Command(words, cmd_line, cut)
            words = []
            cut = 0
            return cmd

        while i < n:
            if cut and cur is None:
                # past MAX_WORDS: skip to the end of the command without building words
                m = _REST.match(text, i)
                if m is not None and m.end() > i:
                    self._move(i, m.end())
                    i = m.end()
                    cut += 1
                    if i >= n:
                        break
            ch = text[i]
            if ch == "\\" and i + 1 < n and text[i + 1] == "\n":
                self._move(i, i + 2)
                i += 2
                continue
            if ch in " \t\r":
                if cur is not None:
                    keep(cur)
                    cur = None
                m = _BLANK.match(text, i)
                assert m is not None
                i = m.end()
                continue
            if ch in ";&|\n":
                if cur is not None:
                    keep(cur)
                    cur = None
                feeds_shell = bool(words) and _is_shell(words)
                cmd = finish()
                if cmd is not None:
                    yield cmd
                j = i + 1
                if ch == "\n":
                    self._move(i, j)
                    if heredocs:
                        j = self._heredoc_bodies(j, heredocs, feeds_shell)
                        heredocs = []
                while j < n and text[j] in "&|":
                    j += 1
                i = j
                cmd_line = self._line
                continue
            if cur is None and not words and self.skip_rest is not None:
                self.stopped_at = i
                return
            if cur is None and not words and ch not in "#" and i == self._line_start:
                # a whole line that cannot matter (no quoting, expansion, separator or assignment,
                # and no word that could name an engine): skip it without building words
                nl = text.find("\n", i)
                end = n if nl == -1 else nl
                if end - i < 4096 and not _MATTERS.search(text, i, end) and not self.interesting(text[i:end]):
                    i = end
                    continue
            if cur is None:
                if ch == "#":
                    nl = text.find("\n", i)
                    i = n if nl == -1 else nl
                    continue
                if not words:
                    cmd_line = self._line
                cur = Word()
            if ch == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
                k = i + 2
                strip = k < n and text[k] == "-"
                m = _HEREDOC_WORD.match(text, k + strip)
                if m:
                    heredocs.append((m.group(1) or m.group(2) or m.group(3) or "", strip))
                    keep(cur)
                    cur = None
                    self._move(i, m.end())
                    i = m.end()
                    continue
            if ch == "'":
                cur.quoted = True
                end = text.find("'", i + 1)
                if end == -1:
                    self._unterminated("single quote", i)
                    return
                self._move(i, i + 1)
                self._add(cur, i + 1, end)
                i = end + 1
                continue
            if ch == '"':
                cur.quoted = True
                at = self._line_col(i)
                j = self._double_quoted(cur, i)
                if j < 0:
                    if j == -1:
                        self._unterminated("double quote", i, at)
                    return
                i = j
                continue
            if ch == "\\":
                if i + 1 < n:
                    self._move(i, i + 1)
                    self._add(cur, i + 1, i + 2)
                i += 2
                continue
            if ch in "$`":
                j, cur = self._expansion(cur, keep, i, quoted=False)
                if j < 0:
                    return
                i = j
                continue
            m = _PLAIN.match(text, i)
            j = m.end() if m else i + 1
            self._add(cur, i, j)
            i = j
        if cur is not None:
            keep(cur)
        cmd = finish()
        if cmd is not None:
            yield cmd

    def _unterminated(self, what: str, i: int, at: Pos | None = None) -> None:
        line, col = at or self._line_col(i)
        fl, fc, _, _ = self.pos.runs(line, col, 1)[0]
        closing = {"single quote": "'", "double quote": '"', "$(": ")", "`": "`"}[what]
        self.problems.append(Problem(fl, fc, f"unterminated {what}: the shell refuses this file "
                                             f"(unexpected end of file looking for the matching {closing}); "
                                             f"close it"))

    def _double_quoted(self, cur: Word, i: int) -> int:
        """Read "..." starting at i; return the index after it, or -1 if unterminated."""
        text = self.text
        n = len(text)
        self._move(i, i + 1)
        i += 1
        while i < n:
            ch = text[i]
            if ch == '"':
                return i + 1
            if ch == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                if text[i + 1] == "\n":
                    self._move(i, i + 2)
                    i += 2
                    continue
                self._move(i, i + 1)
                self._add(cur, i + 1, i + 2)
                i += 2
                continue
            if ch in "$`":
                j, _ = self._expansion(cur, _no_split, i, quoted=True)
                if j < 0:
                    return -2
                i = j
                continue
            m = _DQ_PLAIN.match(text, i)
            j = m.end() if m else i + 1
            self._add(cur, i, j)
            i = j
        return -1

    def _skip_to(self, cur: Word, i: int, j: int, why: str) -> int:
        """Keep text[i:j] literally in the word and mark the word as not fixed by the file."""
        self._add(cur, i, j)
        cur.depends = cur.depends or why
        return j

    def _expansion(self, cur: Word, emit: Callable[[Word], None], i: int, quoted: bool) -> tuple[int, Word]:
        """At `$` or a backtick: substitute what the file fixes, mark the rest. Returns the index
        after it (-1: unterminated, reported) and the current word (unquoted expansions split)."""
        text = self.text
        n = len(text)
        if text[i] == "`":
            j = i + 1
            while True:
                j = text.find("`", j)
                if j == -1:
                    self._unterminated("`", i)
                    return -1, cur
                if text[j - 1] != "\\":
                    break
                j += 1
            return self._skip_to(cur, i, j + 1, "a command substitution"), cur
        j = i + 1
        if j < n and text[j] == "(":
            end = self._matching_paren(j)
            if end < 0:
                self._unterminated("$(", i)
                return -1, cur
            return self._skip_to(cur, i, end, "a command substitution"), cur
        at = self._line_col(i)
        if j < n and text[j] == "{":
            if self._close_brace != -1 and (self._close_brace < j):
                self._close_brace = text.find("}", j)
            k = self._close_brace
            if k == -1:
                self._add(cur, i, i + 1)
                return i + 1, cur
            inner = text[j + 1:k]
            end = k + 1
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=])(.*))?", inner, re.S)
            if m is None:
                return self._skip_to(cur, i, end, f"the expansion ${{{inner[:40]}}}"), cur
            name, default = m.group(1), m.group(3)
            colon = bool(m.group(2) and m.group(2).startswith(":"))
        else:
            m = _NAME.match(text, j) or _SPECIAL.match(text, j)
            if m is None:
                self._add(cur, i, i + 1)
                return i + 1, cur
            name, default, colon, end = m.group(0), None, False, m.end()
        if name in self.var and not (colon and default is not None and self.var[name] == ""):
            value, why = self.var[name], self.dynamic.get(name, "")
        elif default is not None and "$" not in default and "`" not in default:
            value, why = default, ""
        else:
            return self._skip_to(cur, i, end, f"the variable ${name}, which this file does not set"), cur
        if why or not self.budget.take(len(value)):
            return self._skip_to(cur, i, end, why or "an expansion too large to check"), cur
        self._move(i, end)
        if quoted:
            self._add_value(cur, value, at)
            return end, cur
        # an unquoted expansion is split into words, as the shell does
        pieces = re.split(r"[ \t\n]+", value)
        for k, piece in enumerate(pieces):
            if k > 0:
                emit(cur)
                cur = Word()
            self._add_value(cur, piece, at)
        return end, cur

    def _matching_paren(self, j: int) -> int:
        """Index after the `)` closing the `(` at j (quotes and nesting respected), or -1."""
        text = self.text
        depth = 0
        k = j
        while True:
            m = _PAREN_STOP.search(text, k)
            if m is None:
                return -1
            c = m.group(0)
            k = m.end()
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    return k
            elif c == "\\":
                k += 1
            elif c == "`":
                e = text.find("`", k)
                if e == -1:
                    return -1
                k = e + 1
            else:
                e = text.find(c, k)
                if e == -1:
                    return -1
                k = e + 1

    def _heredoc_bodies(self, i: int, pending: list[tuple[str, bool]], feeds_shell: bool) -> int:
        """Heredoc bodies start at i. They are data, not commands: skip them, unless the command
        reading them is a shell (`bash <<EOF`), whose body is a script (then go on reading it)."""
        if feeds_shell:
            return i
        text = self.text
        for delim, strip in pending:
            while i < len(text):
                nl = text.find("\n", i)
                end = len(text) if nl == -1 else nl + 1
                line = text[i:end].rstrip("\n")
                if (line.lstrip("\t") if strip else line) == delim:
                    self._move(i, end)
                    i = end
                    break
                self._move(i, end)
                i = end
        return i

    def _apply_assignments(self, words: list[Word]) -> None:
        ws = words
        if ws and ws[0].text in ("export", "readonly", "declare", "local"):
            ws = [w for w in ws[1:] if not w.text.startswith("-")]
        if ws and all(is_assignment(w.text) for w in ws):
            for w in ws:
                k, _, v = w.text.partition("=")
                self.var[k] = v
                if w.depends:
                    self.dynamic[k] = w.depends
                else:
                    self.dynamic.pop(k, None)


def _no_split(w: Word) -> None:
    raise AssertionError("a quoted expansion is never split")


def _is_shell(words: list[Word]) -> bool:
    _, i = leading_assignments(words)
    return i < len(words) and words[i].text.rsplit("/", 1)[-1] in _SHELLS


def split_commands(
    text: str,
    variables: Mapping[str, str] | None = None,
    position: PosMap | None = None,
    assign: bool = True,
    budget: Budget | None = None,
) -> tuple[list[Command], dict[str, str], list[Problem]]:
    """Split shell text into commands of words. `position` maps (line, col) of `text` to file
    positions (for text cut out of a YAML block). Returns the commands, the variables assigned
    along the way (if `assign`) and problems the shell would refuse."""
    st = ShellText(text, variables, position, assign, budget)
    commands = list(st.commands())
    return commands, st.var, st.problems


def is_assignment(w: str) -> bool:
    name, eq, _ = w.partition("=")
    return bool(eq) and bool(name) and (name[0].isalpha() or name[0] == "_") and all(
        c.isalnum() or c == "_" for c in name)


def leading_assignments(words: list[Word]) -> tuple[dict[str, Word], int]:
    """`A=1 B=2 cmd ...`: the prefix assignments (value words) and the index of the command."""
    env: dict[str, Word] = {}
    i = 0
    while i < len(words) and is_assignment(words[i].text):
        w = words[i]
        k = w.text.split("=", 1)[0]
        env[k] = w.tail(len(k) + 1)
        i += 1
    return env, i
