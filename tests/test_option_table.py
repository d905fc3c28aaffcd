"""The one option table (moeconf/engines/options.py): it covers every plan field an engine
option sets and every memory setting read from a command line, its spellings and variables are
the engines' own, and no other module writes a flag/field/setting mapping of its own."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from moeconf.engines.configtable import OPTIONS as CONFIG
from moeconf.engines.flags import PLAN_KEYS
from moeconf.engines.flagtable import IK, IK_VALUES, MAINLINE, MAINLINE_VALUES
from moeconf.engines.options import IK_NO_FA, options, row, setting_row
from moeconf.engines.settings import MemorySettings
from moeconf.iksplit import IkSplitSettings
from moeconf.plan.model import Flags, ModelSection, Targets

ROOT = Path(__file__).resolve().parents[1]
# the table and the generated engine tables it reads
TABLE_FILES = {"moeconf/engines/options.py", "moeconf/engines/configtable.py", "moeconf/engines/flagtable.py",
               # llama-bench's own fields (generated): its names, not moeconf's settings
               "moeconf/engines/benchtable.py",
               "moeconf/engines/flagtable_iknewest.py"}
# modules that still name a row's variable themselves, each with why (report them; shrink this)
STILL_LITERAL = {
    # owned by the lint work of issue 25 (another branch): findings quote the variables they advise
    "moeconf/linting/rules/env_unsupported.py",
}
# MemorySettings fields no option sets directly (derived, or read by their own modules)
DERIVED = {"reserve", "problems", "host_cpu", "binary", "auto_slots", "speculation", "extra_files", "kv_overrides",
           "n_outputs"}


def test_every_plan_field_an_option_sets_has_one_row() -> None:
    fields = {(o.section, o.field) for o in options() if o.field is not None}
    want = {("flags", f) for f in Flags.model_fields if f != "extra"}
    want |= {("targets", "host"), ("targets", "port"), ("model", "serve_path")}
    assert fields == want
    # each row names a real key of its section
    sections = {"flags": Flags, "targets": Targets, "model": ModelSection}
    for o in options():
        if o.field is not None:
            assert o.field in sections[o.section].model_fields, o


def test_every_memory_setting_read_from_argv_has_a_row() -> None:
    settings = {o.setting for o in options() if o.setting is not None}
    for f in dataclasses.fields(MemorySettings):
        assert f.name in settings or f.name in DERIVED, f"MemorySettings.{f.name} has no row in engines/options.py"
    for f in dataclasses.fields(IkSplitSettings):
        assert f.name in settings, f"IkSplitSettings.{f.name} has no row in engines/options.py"


def test_each_setting_and_field_has_one_row() -> None:
    for key in ("field", "setting"):
        values = [getattr(o, key) for o in options() if getattr(o, key) is not None and getattr(o, key) != "embedding"]
        assert len(values) == len(set(values)), key


@pytest.mark.parametrize("o", options(), ids=lambda o: o.flag)
def test_spellings_and_variables_are_the_engines(o: object) -> None:
    from moeconf.engines.argvread import REMOVED_FLAGS
    from moeconf.engines.options import EngineOption

    assert isinstance(o, EngineOption)
    removed = {n for r in REMOVED_FLAGS.values() for n in r}
    from moeconf.engines.flagtable_iknewest import IK_NEWEST

    for name in o.spellings:  # (ik_llama.cpp: its package's parser, or the newest ik code read)
        assert name in MAINLINE or name in IK or name in IK_NEWEST or name in removed, name
    config = [r for r in CONFIG if o.flag in r[0]]
    if config:  # llama.cpp's parser has it: spellings and variable exactly its row's
        assert (o.names, o.negs, o.env) == (config[0][0], config[0][1], config[0][2])
    else:
        assert o.env == ""
    kind = MAINLINE_VALUES.get(o.flag) or IK_VALUES.get(o.flag)
    if kind is not None:
        assert o.value == kind.split("|")[0]
    assert set(IK_NO_FA) <= set(IK)


def test_table_bounds_are_moeconfs() -> None:
    from moeconf.engines import engine
    from moeconf.engines.settings import read_settings

    eng = engine("llama.cpp")
    assert row("-ub").minimum == 1 and row("-c").minimum == 0 and row("-np").minimum is None
    for o in options():
        if o.setting is None or o.value != "int" or o.minimum is None or o.setting not in {
                f.name for f in dataclasses.fields(MemorySettings)}:
            continue
        s = read_settings([o.flag, str(o.minimum - 1)], eng)
        assert any("out of range" in p for p in s.problems), o.flag
        assert not read_settings([o.flag, str(o.minimum)], eng).problems, o.flag
    assert setting_row("n_ctx").flag == "-c"


def test_plan_keys_come_from_the_table() -> None:
    for o in options():
        if o.field is not None and o.field != "fit" and o.flag != "-ngl":
            for n in o.names:
                assert PLAN_KEYS[n] == f"[{o.section}] {o.field}"


def test_no_mapping_written_outside_the_table() -> None:
    """No module but the table names a row's `LLAMA_ARG_*` variable as a string, or pairs a
    row's spelling with its plan field or memory setting (`"-c": "n_ctx"`, `("-c", "ctx_size")`)."""
    envs = {o.env for o in options() if o.env}
    pairs = [(n, v) for o in options() for n in o.spellings for v in (o.field, o.setting) if v]
    found: list[str] = []
    for path in sorted((ROOT / "moeconf").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in TABLE_FILES:
            continue
        text = path.read_text()
        for var in sorted(set(re.findall(r"[\"'](LLAMA_ARG_[A-Z0-9_]+)[\"']", text)) & envs):
            if rel not in STILL_LITERAL:
                found.append(f"{rel}: {var!r}")
        for name, value in pairs:
            if re.search(rf"[\"']{re.escape(name)}[\"']\s*[:,]\s*[\"']{re.escape(value)}[\"']", text) or re.search(
                    rf"[\"']{re.escape(value)}[\"']\s*[:,]\s*[\"']{re.escape(name)}[\"']", text):
                found.append(f"{rel}: {name} <-> {value}")
    assert not found, "write these through moeconf/engines/options.py:\n" + "\n".join(found)
