"""Writes of the files moeconf produces. A file is either the old one or the whole new one, never
half of it, even on an error or Ctrl-C, and nothing but a regular file is ever replaced:

- a new path, or an existing regular file: written to a temporary file in the same folder, then
  renamed over it; an existing file keeps its permission bits (and, where the OS allows it, its
  owner and group); a read-only file is refused as `open()` would refuse it;
- a symbolic link: followed to its final target, which is replaced as above (the link stays a link);
- a directory, a device, a FIFO or a socket: refused with a `MoeconfError` naming the path;
- `write_output` only: `-`, `/dev/stdout`, `/dev/stderr` and `/dev/fd/N` are written straight
  through (never renamed over), and `/dev/null` discards the text.
No temporary file is left behind on any error, on Ctrl-C, or on SIGTERM (a CI timeout, a killed
hook): while the temporary file exists, SIGTERM exits with status 143 after removing it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from types import FrameType

from moeconf.errors import MoeconfError

_STREAMS = {"-": "stdout", "/dev/stdout": "stdout", "/dev/fd/1": "stdout", "/proc/self/fd/1": "stdout",
            "/dev/stderr": "stderr", "/dev/fd/2": "stderr", "/proc/self/fd/2": "stderr"}


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"  # pragma: no cover - every other mode is one of the above


def _fd_path(target: str) -> bool:
    """`/dev/fd/N` or `/proc/self/fd/N`: a descriptor the caller's shell opened (`>(cmd)`, `3>f`)."""
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        if target.startswith(prefix) and target[len(prefix):].isdigit():
            return True
    return False


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """Turn SIGTERM into SystemExit(143) for the duration, so `finally`/`except` clean-up runs
    (only where Python allows it and nobody else handles SIGTERM)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_output(path: str | os.PathLike[str], text: str) -> None:
    """Write a command's output to `path` as a user expects: standard streams and `/dev/fd/N`
    straight through, `/dev/null` discarded, anything else with `write_text_atomic`."""
    target = os.fspath(path)
    stream = _STREAMS.get(target)
    if stream is not None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        out.write(text)
        out.flush()
        return
    if target == os.devnull:
        try:
            is_null = stat.S_ISCHR(os.stat(target).st_mode)
        except OSError:
            is_null = False
        if is_null:
            return
    if _fd_path(target):
        try:
            with open(target, "a", encoding="utf-8", newline="\n") as f:
                f.write(text)
        except OSError as e:
            raise MoeconfError(f"cannot write: {e.strerror or e}", path=target) from None
        return
    write_text_atomic(target, text)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to the regular file (or new path) `path` through a temporary file in the
    same folder and a rename; see the module docstring for links and special files."""
    target = os.fspath(path)
    if target.endswith(("/", os.sep)):
        raise MoeconfError("names a directory, not a file", path=target)
    real = os.path.realpath(target)  # every link followed; a dangling link gives the path it names
    try:
        st: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise MoeconfError(f"cannot write: {e.strerror or e}", path=target) from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            where = "" if real == os.path.abspath(target) else f" (the link's target {real})"
            raise MoeconfError(
                f"is {_kind(st.st_mode)}{where}, not a regular file: moeconf only replaces regular files",
                path=target, hint="name a regular file, or '-' / /dev/stdout for standard output",
            )
        if not os.access(real, os.W_OK):
            raise MoeconfError("cannot write: permission denied (the file is read-only)", path=target)
    folder = os.path.dirname(real)
    with _terminate_cleanly():
        _replace(target, real, folder, st, text)
    with contextlib.suppress(OSError):
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _replace(target: str, real: str, folder: str, st: os.stat_result | None, text: str) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".tmp", dir=folder)
    except OSError as e:
        why = e.strerror or str(e)
        raise MoeconfError(f"cannot write: {why} (creating a temporary file in {folder})", path=target) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            if st is not None:
                if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                    with contextlib.suppress(OSError):
                        os.fchown(f.fileno(), st.st_uid, st.st_gid)
                os.fchmod(f.fileno(), st.st_mode & 0o7777)
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(f.fileno(), 0o666 & ~umask)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, real)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise MoeconfError(f"cannot write: {e.strerror or e}", path=target) from None
        raise
