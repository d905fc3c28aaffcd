"""Errors a user can hit. Each carries where it happened (file and byte offset, or line and
column, or a tensor name) so the CLI can print one clear line instead of a traceback."""

from __future__ import annotations

import os

from moeconf.textsafe import safe


class MoeconfError(Exception):
    """An input problem the user can fix: bad file, bad plan, bad arguments."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        line: int | None = None,
        column: int | None = None,
        hint: str | None = None,
        context: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.offset = offset
        self.line = line
        self.column = column
        self.hint = hint
        self.context = context

    def location(self) -> str:
        if self.path is None:
            return ""
        loc = safe(self.path)
        if self.line is not None:
            loc += f":{self.line}"
            if self.column is not None:
                loc += f":{self.column}"
        elif self.offset is not None:
            loc += f" (byte offset {self.offset})"
        return loc

    def __str__(self) -> str:
        """One line (plus context and hint lines); characters from files that could act on a
        terminal are shown escaped (moeconf.textsafe)."""
        loc = self.location()
        message = safe(self.message)
        text = f"{loc}: {message}" if loc else message
        if self.context:
            text += "\n" + safe(self.context, keep="\n\t")
        if self.hint:
            text += "\n  hint: " + safe(self.hint)
        return text


class GGUFError(MoeconfError):
    """A GGUF file that cannot be read: not a GGUF, truncated, corrupt, unsupported."""


class ManifestError(MoeconfError):
    """A manifest JSON that does not describe an inventory."""


class PlanError(MoeconfError):
    """A plan file that cannot be used: TOML syntax, unknown keys, bad rules, bad devices."""


def read_text(path: str | os.PathLike[str], error: type[MoeconfError], what: str) -> str:
    """A UTF-8 text file's content, or `error` naming the file and why it cannot be read."""
    spath = os.fspath(path)
    try:
        with open(spath, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise error("no such file", path=spath) from None
    except IsADirectoryError:
        raise error(f"is a directory, not {what}", path=spath) from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read: {e}", path=spath) from None
