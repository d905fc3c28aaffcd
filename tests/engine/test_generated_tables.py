"""The committed engine tables are what the pinned engines' sources give now: each generator
(tests/generated.py GENERATED) is re-run into a temporary folder on the sources
scripts/build-engines.sh unpacks, and its output compared with the committed module byte for
byte. A stale table fails with the command that regenerates it.

The two tables read from ik_llama.cpp's own history (flagtable_iknewest.py, ikbuilds.py: the
newest ik code moeconf models, which no package vendors) need a clone: MOECONF_IK_REPO=DIR; without
one they are skipped (their headers are still held to moeconf.engines.IK_NEWEST_COMMIT by
tests/test_generated_headers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.engine.harness import CACHE
from tests.generated import GENERATED, REPO, Generated, regenerate, source_dirs, stale_message

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("g", GENERATED, ids=[Path(g.module).name for g in GENERATED])
def test_generated_table_is_what_the_pinned_sources_give(g: Generated, tmp_path: Path) -> None:
    dirs = source_dirs(CACHE)
    sources = {k: str(v) for k, v in dirs.items()}
    for key, d in dirs.items():
        if f"{{{key}}}" in g.args and not (d / "common").is_dir():
            pytest.fail(f"the pinned sources are not unpacked: run scripts/build-engines.sh (looked for {d})")
    if g.needs_ik_repo:
        repo = os.environ.get("MOECONF_IK_REPO")
        if not repo:
            pytest.skip("MOECONF_IK_REPO (an ik_llama.cpp clone) not set: this table is read from ik's history")
        sources["ik_repo"] = repo
    fresh, command = regenerate(g, sources, tmp_path)
    msg = stale_message(g.module, (REPO / g.module).read_text(), fresh, command)
    assert msg is None, msg
