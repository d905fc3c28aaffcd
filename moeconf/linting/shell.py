"""A small POSIX-shell word splitter that remembers where every character came from.

Enough of the shell for launch scripts: quotes, backslash escapes, line continuations, comments,
`$VAR` / `${VAR}` from earlier assignments, and command separators. Each word carries the file
position of each of its characters, so a finding can point into the middle of an `-ot` value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from moeconf.engines.cmdline import Arg

Pos = tuple[int, int]
_SEPARATORS = {";", "&", "|", "\n"}


@dataclass
class Word:
    chars: list[str] = field(default_factory=list)
    pos: list[Pos] = field(default_factory=list)
    quoted: bool = False

    @property
    def text(self) -> str:
        return "".join(self.chars)

    def add(self, ch: str, p: Pos) -> None:
        self.chars.append(ch)
        self.pos.append(p)


@dataclass(frozen=True)
class PosArg(Arg):
    """An `Arg` that knows the file position of each character."""

    spans: tuple[Pos, ...] = ()

    def at(self, offset: int) -> tuple[int, int]:
        if self.spans:
            if offset < len(self.spans):
                return self.spans[offset]
            last = self.spans[-1]
            return last[0], last[1] + 1 + (offset - len(self.spans))
        return super().at(offset)


def to_arg(word: Word, path: str) -> Arg:
    line, col = word.pos[0] if word.pos else (0, 0)
    return PosArg(word.text, path, line, col, tuple(word.pos))


@dataclass
class Command:
    words: list[Word]
    line: int


def split_commands(
    text: str,
    variables: Mapping[str, str] | None = None,
    position: Callable[[int, int], Pos] | None = None,
    assign: bool = True,
) -> tuple[list[Command], dict[str, str]]:
    """Split shell text into commands of words. `position` maps (line, col) of `text` (1-based)
    to file positions (for text cut out of a YAML block). Returns the commands and the
    variables assigned along the way (if `assign`)."""
    var = dict(variables or {})
    pos_of = position or (lambda ln, c: (ln, c))
    commands: list[Command] = []
    words: list[Word] = []
    cur: Word | None = None
    i, line, col = 0, 1, 1
    n = len(text)
    cmd_line = 1

    def here() -> Pos:
        return pos_of(line, col)

    def end_word() -> None:
        nonlocal cur
        if cur is not None:
            words.append(cur)
            cur = None

    def end_command() -> None:
        nonlocal words, cmd_line
        end_word()
        if words:
            if assign:
                _apply_assignments(words, var)
            commands.append(Command(words, cmd_line))
        words = []

    def advance(k: int = 1) -> None:
        nonlocal i, line, col
        for _ in range(k):
            if i < n and text[i] == "\n":
                line += 1
                col = 1
            else:
                col += 1
            i += 1

    def expand(start_pos: Pos, quoted: bool) -> None:
        # at '$': read a name, substitute known variables, keep unknown ones literally
        nonlocal cur
        assert cur is not None
        j = i + 1
        if j < n and text[j] == "{":
            k = text.find("}", j)
            if k == -1:
                cur.add("$", start_pos)
                advance()
                return
            name = text[j + 1 : k]
            raw = text[i : k + 1]
            length = k + 1 - i
        else:
            k = j
            while k < n and (text[k].isalnum() or text[k] == "_"):
                k += 1
            name = text[j:k]
            raw = text[i:k]
            length = k - i
        if not name:
            cur.add("$", start_pos)
            advance()
            return
        base = name.split(":-", 1)[0] if ":-" in name else name
        if base in var:
            value = var[base]
        elif ":-" in name:
            value = name.split(":-", 1)[1]
        else:
            value = raw
        for ch in value:
            if not quoted and ch in " \t\n":
                # an unquoted expansion is split into words, as the shell does
                if cur is not None and (cur.chars or cur.quoted):
                    words.append(cur)
                cur = None
                continue
            if cur is None:
                cur = Word()
            cur.add(ch, start_pos)
        if cur is None:
            cur = Word()
        advance(length)

    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] == "\n":
            advance(2)  # line continuation
            continue
        if cur is None:
            if ch in " \t\r":
                advance()
                continue
            if ch == "#":
                while i < n and text[i] != "\n":
                    advance()
                continue
            if ch in _SEPARATORS:
                end_command()
                advance()
                while i < n and text[i] in "&|":
                    advance()
                cmd_line = line
                continue
            if not words:
                cmd_line = line
            cur = Word()
        # inside (or starting) a word
        if ch in " \t\r":
            end_word()
            advance()
            continue
        if ch in _SEPARATORS:
            end_word()
            continue
        if ch == "'":
            cur.quoted = True
            advance()
            while i < n and text[i] != "'":
                cur.add(text[i], here())
                advance()
            advance()
            continue
        if ch == '"':
            cur.quoted = True
            advance()
            while i < n and text[i] != '"':
                c = text[i]
                if c == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    if text[i + 1] == "\n":
                        advance(2)
                        continue
                    advance()
                    cur.add(text[i], here())
                    advance()
                    continue
                if c == "$":
                    expand(here(), True)
                    continue
                cur.add(c, here())
                advance()
            advance()
            continue
        if ch == "\\" and i + 1 < n:
            advance()
            cur.add(text[i], here())
            advance()
            continue
        if ch == "$":
            expand(here(), False)
            continue
        cur.add(ch, here())
        advance()
    end_command()
    return commands, var


def _is_assignment(w: str) -> bool:
    name, eq, _ = w.partition("=")
    return bool(eq) and bool(name) and (name[0].isalpha() or name[0] == "_") and all(
        c.isalnum() or c == "_" for c in name)


def _apply_assignments(words: list[Word], var: dict[str, str]) -> None:
    ws = [w.text for w in words]
    if ws and ws[0] in ("export", "readonly", "declare", "local"):
        ws = [w for w in ws[1:] if not w.startswith("-")]
    if ws and all(_is_assignment(w) for w in ws):
        for w in ws:
            k, _, v = w.partition("=")
            var[k] = v


def leading_assignments(words: list[Word]) -> tuple[dict[str, Word], int]:
    """`A=1 B=2 cmd ...`: the prefix assignments (value words) and the index of the command."""
    env: dict[str, Word] = {}
    i = 0
    while i < len(words) and _is_assignment(words[i].text):
        w = words[i]
        k = w.text.split("=", 1)[0]
        value = Word(w.chars[len(k) + 1:], w.pos[len(k) + 1:], w.quoted)
        env[k] = value
        i += 1
    return env, i
