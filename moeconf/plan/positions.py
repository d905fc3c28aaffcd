"""Where keys and array strings sit in a TOML file, so plan errors can say file:line:col.

`tomllib` keeps no positions. This scanner reads the same text line by line: table headers,
`key = value` lines, and the strings inside arrays (the plan's `rules`). It is used only to
point at things; the values themselves always come from `tomllib`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Path = tuple[str | int, ...]

_HEADER = re.compile(r"\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"\s*((?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'))*)\s*=")


@dataclass(frozen=True)
class Pos:
    line: int  # 1-based
    column: int  # 1-based; for strings, the column of the opening quote


def _split_key(text: str) -> list[str]:
    parts = re.findall(r"\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+", text)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def scan(text: str) -> dict[Path, Pos]:
    """Map key paths (and (path..., index) for array elements) to positions."""
    out: dict[Path, Pos] = {}
    table: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        h = _HEADER.match(line)
        if h and stripped.startswith("["):
            table = _split_key(h.group(1))
            out.setdefault(tuple(table), Pos(i + 1, line.index("[") + 1))
            i += 1
            continue
        k = _KEY.match(line)
        if not k:
            i += 1
            continue
        path = (*table, *_split_key(k.group(1)))
        out[path] = Pos(i + 1, len(line) - len(line.lstrip()) + 1)
        rest_col = k.end()
        after = line[rest_col:].lstrip()
        if after.startswith("["):
            i = _scan_array(lines, i, line.index("[", rest_col), path, out)
        i += 1
    return out


def _scan_array(lines: list[str], row: int, col: int, path: Path, out: dict[Path, Pos]) -> int:
    """Record the string elements of the array opening at (row, col); return its last row."""
    depth = 0
    index = 0
    r, c = row, col
    while r < len(lines):
        line = lines[r]
        while c < len(line):
            ch = line[c]
            if ch == "#":
                break
            if ch == "[":
                if depth == 1 and (*path, index) not in out:
                    out[(*path, index)] = Pos(r + 1, c + 1)  # a nested array
                depth += 1
            elif ch == "]":
                depth -= 1
                if depth == 0:
                    return r
            elif ch == "," and depth == 1:
                index += 1
            elif ch in "\"'":
                if depth == 1:
                    out[(*path, index)] = Pos(r + 1, c + 1)
                c = _skip_string(line, c)
                continue
            elif depth == 1 and not ch.isspace() and (*path, index) not in out:
                out[(*path, index)] = Pos(r + 1, c + 1)  # a number, a boolean, an inline table
            c += 1
        r += 1
        c = 0
    return r


def _skip_string(line: str, c: int) -> int:
    quote = line[c]
    j = c + 1
    while j < len(line):
        if quote == '"' and line[j] == "\\":
            j += 2
            continue
        if line[j] == quote:
            return j + 1
        j += 1
    return j


def locate(positions: dict[Path, Pos], path: Path) -> Pos | None:
    """The position of `path`, or of its nearest located ancestor."""
    p = tuple(path)
    while p:
        if p in positions:
            return positions[p]
        p = p[:-1]
    return None
