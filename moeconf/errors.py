"""Errors a user can hit. Each carries where it happened (file and byte offset, or line and
column, or a tensor name) so the CLI can print one clear line instead of a traceback."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

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


_KINDS = (
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: str | os.PathLike[str], error: type[MoeconfError], what: str) -> BinaryIO:
    """Open a regular file for reading in binary mode, or raise `error` saying why not.

    Devices, FIFOs and sockets (and symbolic links to them) are refused before they are
    opened: reading `/dev/zero` would never end and opening a FIFO would block. The file is
    opened with O_NONBLOCK and checked again, so a file swapped for a FIFO between the two
    checks cannot hang the open either."""
    spath = os.fspath(path)
    try:
        st = os.stat(spath)
    except FileNotFoundError:
        if os.path.islink(spath):
            raise error(f"is a broken symbolic link (to {os.readlink(spath)!r})", path=spath) from None
        raise error("no such file", path=spath) from None
    except OSError as e:
        raise error(f"cannot read: {e.strerror or e}", path=spath) from None
    _refuse_special(st, spath, error, what)
    try:
        fd = os.open(spath, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise error(f"is a directory, not {what}", path=spath) from None
    except OSError as e:
        raise error(f"cannot read: {e.strerror or e}", path=spath) from None
    try:
        _refuse_special(os.fstat(fd), spath, error, what)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _refuse_special(st: os.stat_result, path: str, error: type[MoeconfError], what: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise error(f"is a directory, not {what}", path=path)
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise error(f"is {kind}, not {what}: moeconf reads only regular files", path=path)


def read_text(
    path: str | os.PathLike[str], error: type[MoeconfError], what: str, *, max_bytes: int | None = None
) -> str:
    """A UTF-8 text file's content, or `error` naming the file and why it cannot be read.
    Only regular files are read (see `open_regular`); a file over `max_bytes` is refused
    before it is read."""
    spath = os.fspath(path)
    with open_regular(spath, error, what) as f:
        if max_bytes is not None:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise error(f"is {size} bytes; {what} is at most {max_bytes} bytes", path=spath)
        try:
            raw = f.read() if max_bytes is None else f.read(max_bytes + 1)
        except OSError as e:
            raise error(f"cannot read: {e.strerror or e}", path=spath) from None
    if max_bytes is not None and len(raw) > max_bytes:
        raise error(f"{what} is at most {max_bytes} bytes", path=spath)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(f"not valid UTF-8 (byte 0x{raw[e.start]:02x})", path=spath, line=line, column=column) from None
    # newlines as text-mode open() reads them
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
