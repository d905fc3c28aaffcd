"""The engine suite's result files when pytest-xdist runs it over several workers (`.ci/run`):
each worker writes its own shard (`PATH.gw0`, `PATH.gw1`, ...) beside the path the environment
names, and the table scripts read the path and its shards together. Standard library only: the
table scripts import it."""

from __future__ import annotations

import json
import os
from pathlib import Path

RESULT_VARS = ("MOECONF_ENGINE_RESULTS", "MOECONF_MEMORY_RESULTS", "MOECONF_FIT_RESULTS")


def shard_path(target: str | Path) -> Path:
    """Where this process writes the rows meant for `target`: the path itself in a plain run, a
    shard of it in an xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return Path(f"{target}.{worker}") if worker else Path(target)


def _shards(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.gw*"))


def clear(target: str | Path) -> None:
    """A run's results start from nothing an earlier run left: its shards (the file itself, which a plain
    run overwrites, is left: it may be one the user keeps)."""
    for p in _shards(Path(target)):
        p.unlink(missing_ok=True)


def load_rows(target: str | Path) -> list[object]:
    """Every row written for `target`, by a plain run or by the workers of a parallel one."""
    path = Path(target)
    files = [p for p in [path, *_shards(path)] if p.is_file()]
    if not files:
        raise FileNotFoundError(f"{path}: no results (nor shards {path.name}.gw*): run the engine suite first")
    rows: list[object] = []
    for p in files:
        rows.extend(json.loads(p.read_text()))
    return rows
