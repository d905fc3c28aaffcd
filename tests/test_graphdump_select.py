"""`python -m tests.engine.graphdump --arch NAME`: the command line, which recorded files belong to an
architecture, and the partial record (only those files replaced, the index updated for them alone, every
other file untouched, refused before anything is written where the rest could not stand beside them).
Without the engine: the dumps are the recorded ones (tests/data/graphs), some changed."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from moeconf.fixtures.graphmodels import ARCHS, REAL
from tests.engine import graphdump
from tests.engine.graphdump import (
    DATA,
    arch_files,
    file_name,
    index,
    main,
    merged_index,
    parse_args,
    stale,
    write_archs,
)

INDEX = json.loads((DATA / "index.json").read_text())
Docs = dict[tuple[str, str, str], dict[str, Any]]


def recorded(*archs: str) -> Docs:
    return {(g["arch"], g["dims"], g["line"]): json.loads(gzip.decompress((DATA / g["file"]).read_bytes()))
            for g in INDEX["graphs"] if g["arch"] in archs}


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def make_folder(folder: Path, docs: Docs, with_index: bool = True) -> Path:
    folder.mkdir()
    for key, doc in docs.items():
        (folder / file_name(*key)).write_bytes(gzip.compress(json.dumps(doc).encode(), 9, mtime=0))
    if with_index:
        (folder / "index.json").write_text(json.dumps(index(docs), indent=1) + "\n")
    return folder


def test_arch_names_repeat_and_default_to_every_one() -> None:
    ns = parse_args([])
    assert ns.arch == [] and ns.out == DATA
    ns = parse_args(["--arch", "olmoe", "--arch", "dbrx", "--arch", "olmoe", "--out", "/x"])
    assert ns.arch == ["dbrx", "olmoe"] and ns.out == Path("/x")


def test_an_unknown_arch_is_an_error_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--arch", "dbrx", "--arch", "qwen9moe"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown architecture 'qwen9moe'" in err and "Traceback" not in err
    assert f"the known ones: {', '.join(ARCHS)}" in err


def test_every_recorded_file_belongs_to_one_architecture() -> None:
    # names are matched whole: glm-dsa's files are not glm4moe's, nemotron_h's not nemotron_h_moe's
    owners: dict[str, list[str]] = {}
    for arch in ARCHS:
        files = arch_files(DATA, arch)
        assert [p.name for p in files] == sorted(g["file"] for g in INDEX["graphs"] if g["arch"] == arch), arch
        for p in files:
            owners.setdefault(p.name, []).append(arch)
    assert sorted(owners) == sorted(p.name for p in DATA.glob("*.json.gz"))
    assert all(len(v) == 1 for v in owners.values()), {k: v for k, v in owners.items() if len(v) > 1}


def test_one_architecture_replaced_and_nothing_else(tmp_path: Path) -> None:
    old = recorded("dbrx", "olmoe")
    # dbrx's folder also holds a dump no longer made (an old dimension set "c", listed in the index)
    old["dbrx", "c", "rpc"] = old["dbrx", "a", "rpc"]
    folder = make_folder(tmp_path / "graphs", old)
    before = snapshot(folder)
    now = {k: copy.deepcopy(v) for k, v in old.items() if k[0] == "dbrx" and k[1] != "c"}
    now["dbrx", "b", "ngl2"]["nodes"][7]["op"] = "ADD"
    done = write_archs(now, ["dbrx"], folder)
    assert done == ["removed dbrx-c-rpc.json.gz (no longer dumped)", "wrote 12 dumps of dbrx",
                    "index.json: updated for those architectures"]
    after = snapshot(folder)
    assert "dbrx-c-rpc.json.gz" not in after
    olmoe = {k: v for k, v in old.items() if k[0] == "olmoe"}
    for name in (file_name(*k) for k in olmoe):
        assert after[name] == before[name], name  # same bytes, never rewritten
    assert stale(folder, {**olmoe, **now}) == []
    assert json.loads((folder / "index.json").read_text()) == index({**olmoe, **now})


def test_without_an_index_none_is_written(tmp_path: Path) -> None:
    old = recorded("dbrx")
    folder = make_folder(tmp_path / "graphs", old, with_index=False)
    # a file named as one of dbrx's dumps would be, not dumped now: removed by its name alone
    stray = folder / file_name("dbrx", "a", "expscpu32k")
    stray.write_bytes(b"")
    (folder / "notes.txt").write_text("kept")
    done = write_archs(old, ["dbrx"], folder)
    assert done[0] == f"removed {stray.name} (no longer dumped)" and done[-1].endswith("no index.json: none written")
    assert not stray.exists() and not (folder / "index.json").exists()
    assert (folder / "notes.txt").read_text() == "kept"


@pytest.mark.parametrize("wrong", ["engine", "lines", "dims", "real", "stray"])
def test_a_folder_the_new_dumps_cannot_join_is_refused_untouched(wrong: str, tmp_path: Path) -> None:
    old = recorded("dbrx", "olmoe")
    folder = make_folder(tmp_path / "graphs", old)
    idx = json.loads((folder / "index.json").read_text())
    archs = ["dbrx"]
    now = {k: v for k, v in old.items() if k[0] == "dbrx"}
    if wrong == "engine":
        idx["engine"]["commit"] = "1234567"
    elif wrong == "lines":
        idx["lines"]["rpc"] = "-c 1024 -ub 64 -ngl 99"
    elif wrong == "dims":
        idx["dims"]["a"]["hidden"] = 128
    elif wrong == "real":
        idx["real"]["olmoe"] = "some-other-layout"
    else:
        now["olmoe", "a", "rpc"] = old["olmoe", "a", "rpc"]
    (folder / "index.json").write_text(json.dumps(idx))
    before = snapshot(folder)
    with pytest.raises(RuntimeError) as e:
        write_archs(now, archs, folder)
    msg = str(e.value)
    if wrong == "real":
        assert msg.startswith("the real layout of olmoe changed") and "add them to --arch" in msg
    elif wrong == "stray":
        assert msg == "dumps of olmoe given, which are not being recorded"
    else:
        assert "record every architecture (python -m tests.engine.graphdump, no --arch)" in msg
    assert snapshot(folder) == before


def test_a_real_layout_changed_for_a_recorded_one_is_taken() -> None:
    old = recorded("dbrx", "olmoe")
    idx = index(old)
    idx["real"] = {**idx["real"], "dbrx": "an-older-layout"}
    now = {k: v for k, v in old.items() if k[0] == "dbrx"}
    assert merged_index(idx, now, ["dbrx"])["real"] == REAL


def test_main_records_the_named_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    # the engine's part (record_all) stood in for by the recorded dumps; asked for only the named ones
    asked: list[object] = []

    def fake_record(tool: Path, out: Path, archs: list[str] | None = None) -> Docs:
        asked.append(archs)
        return recorded(*(archs or ()))

    monkeypatch.setattr(graphdump, "record_all", fake_record)
    folder = tmp_path / "graphs"
    for g in INDEX["graphs"]:
        if g["arch"] in ("dbrx", "olmoe"):
            folder.mkdir(exist_ok=True)
            shutil.copy(DATA / g["file"], folder / g["file"])
    (folder / "index.json").write_text(json.dumps(index(recorded("dbrx", "olmoe")), indent=1) + "\n")
    before = snapshot(folder)
    assert main(["--arch", "olmoe", "--out", str(folder)], tool=Path("/nonexistent/graphdump")) == 0
    assert asked == [["olmoe"]]
    assert "wrote 12 dumps of olmoe" in capsys.readouterr().out
    assert {k: v[0] for k, v in snapshot(folder).items()} == {k: v[0] for k, v in before.items()}
    untouched = [n for n in before if not n.startswith("olmoe-") and n != "index.json"]
    assert all(snapshot(folder)[n] == before[n] for n in untouched)
    # a refusal: a message, exit 1, nothing written
    idx = json.loads((folder / "index.json").read_text())
    idx["engine"]["build"] = 1
    (folder / "index.json").write_text(json.dumps(idx))
    before = snapshot(folder)
    assert main(["--arch", "olmoe", "--out", str(folder)], tool=Path("/nonexistent/graphdump")) == 1
    err = capsys.readouterr().err
    assert err.startswith("graphdump: the folder was recorded by") and err.rstrip().endswith("nothing written")
    assert snapshot(folder) == before
