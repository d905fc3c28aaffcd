"""Atomic file writes: a file moeconf writes is either the old one or the whole new one, never
half of it, even on an error or Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(target):
            with contextlib.suppress(OSError):
                os.chmod(tmp, os.stat(target).st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
