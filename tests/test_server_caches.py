"""llama-server's host caches (moeconf/memory/servercache.py): the checkpoint sizes against the
engine's own `llama_state_seq_get_size_ext` (recorded in tests/data/server_checkpoints.json, measured
again by tests/engine/test_server_caches.py), the defaults by build, the flags, and what `explain`
and `fit --ram` do with them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.engines.settings import MemorySettings, read_settings
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory.geometry import geometry
from moeconf.memory.servercache import checkpoint, default_checkpoints, server_caches
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.conftest import REPO

DATA = json.loads((REPO / "tests" / "data" / "server_checkpoints.json").read_text())
MiB = 1024 * 1024
QWEN35 = str(REPO / "examples" / "models" / "qwen3.5-397b-a17b.manifest.json")
AIR = str(REPO / "examples" / "models" / "glm-4.5-air.manifest.json")


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("cut")
    out = {}
    for row in DATA["rows"]:
        key = row["layout"]
        if key not in out:
            path = folder / f"{key}.gguf"
            write_layout(dataclasses.replace(LAYOUTS[key], **row["cut"]), path)
            out[key] = load_inventory(path)
    return out


@pytest.mark.parametrize("row", DATA["rows"], ids=lambda r: f"{r['layout']}-{r['type']}-np{r['n_seq']}")
def test_a_checkpoint_is_the_size_the_engine_gives(cut: dict[str, Inventory], row: dict[str, object]) -> None:
    inv = cut[str(row["layout"])]
    n_seq = int(str(row["n_seq"]))
    s = MemorySettings(n_ctx=min(int(str(row["n_ctx"])), int(str(row["tokens"]))), n_parallel=n_seq, kv_unified=True,
                       cache_type_k=str(row["type"]), cache_type_v=str(row["type"]))
    size, what = checkpoint(inv, geometry(inv), s, 10000)
    assert size == row["partial"], what


def test_the_recorded_rows_cover_recurrent_sliding_window_and_chunked_models() -> None:
    archs = {LAYOUTS[str(r["layout"])].arch for r in DATA["rows"]}
    assert {"qwen35moe", "gpt-oss", "llama4"} <= archs


def test_full_attention_models_make_no_checkpoints() -> None:
    inv = load_inventory(AIR)
    assert checkpoint(inv, geometry(inv), MemorySettings(n_ctx=32768), 10000) == (0, "")


def test_swa_full_makes_no_checkpoints(cut: dict[str, Inventory]) -> None:
    inv = cut["gpt-oss-20b"]
    assert checkpoint(inv, geometry(inv), MemorySettings(n_ctx=4096, swa_full=True), 10000) == (0, "")
    assert checkpoint(inv, geometry(inv), MemorySettings(n_ctx=4096), 10000)[0] > 0


@pytest.mark.parametrize(("build", "count"), [(6000, 0), (6173, 3), (6685, 3), (6723, 3), (6724, 8), (8231, 8),
                                              (8232, 32), (10573, 32)])
def test_default_checkpoint_count_by_build(build: int, count: int) -> None:
    assert default_checkpoints(build) == count


def test_recurrent_checkpoints_start_with_b6685() -> None:
    inv = load_inventory(QWEN35)
    geo = geometry(inv)
    assert checkpoint(inv, geo, MemorySettings(n_ctx=32768), 6684) == (0, "")
    assert checkpoint(inv, geo, MemorySettings(n_ctx=32768), 6685)[0] > 0


def _caches(argv: list[str], version: str | None = None):  # type: ignore[no-untyped-def]
    eng = engine("llama.cpp", version)
    inv = load_inventory(QWEN35)
    return server_caches(inv, geometry(inv), read_settings(argv, eng), eng)


def test_only_llama_server_keeps_them_and_only_from_the_builds_that_have_them() -> None:
    assert _caches(["llama-cli", "-c", "32768"]) is None
    assert _caches(["-c", "32768"]) is None
    assert _caches(["llama-server", "-c", "32768"], "b6100") is None
    old = _caches(["llama-server", "-c", "32768"], "b6700")
    assert old is not None and old.prompt_cache == 0 and old.checkpoints == 3
    new = _caches(["llama-server", "-c", "32768"])
    assert new is not None and new.prompt_cache == 8192 * MiB and new.checkpoints == 32 and new.slots == 4
    assert new.checkpoints_total == 4 * 32 * new.checkpoint_bytes


def test_the_flags_and_their_env_vars_are_read() -> None:
    sc = _caches(["llama-server", "-c", "32768", "--cache-ram", "1024", "-ctxcp", "4", "-np", "2"])
    assert sc is not None and sc.prompt_cache == 1024 * MiB and sc.prompt_cache_given
    assert sc.checkpoints == 4 and sc.checkpoints_given and sc.slots == 2
    assert _caches(["llama-server", "-cram", "-1"]).prompt_cache is None  # type: ignore[union-attr]
    assert _caches(["llama-server", "--cache-ram", "0"]).prompt_cache == 0  # type: ignore[union-attr]
    eng = engine("llama.cpp")
    s = read_settings(["llama-server"], eng, {"LLAMA_ARG_CACHE_RAM": "2048", "LLAMA_ARG_CTX_CHECKPOINTS": "2"})
    assert (s.cache_ram, s.ctx_checkpoints) == (2048, 2)
    assert read_settings(["llama-server", "-ctxcp", "-3"], eng).problems


def test_explain_prints_the_caps_under_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", QWEN35, "--", "llama-server", "-c", "32768", "-ngl", "99", "-ot", "exps=CPU"]) == 0
    out = capsys.readouterr().out
    assert "prompt cache up to 8,192 MiB (the default --cache-ram 8192)" in out
    assert ("context checkpoints: up to 4 slot(s) x 32 x 186.3 MiB (the recurrent state of 45 layers) = "
            "23,850 MiB") in out


def test_explain_warns_when_a_cpu_budget_leaves_too_little(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["explain", QWEN35, "--budget", "CPU=236GiB", "--", "llama-server", "-c", "32768", "-ngl", "99",
            "-ot", "exps=CPU"]
    main(argv)
    assert "may outgrow the" in capsys.readouterr().out


def test_explain_json_has_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", QWEN35, "--json", "--", "llama-server", "-c", "32768", "--cache-ram", "512"]) == 0
    sc = json.loads(capsys.readouterr().out)["server_caches"]
    assert sc["prompt_cache_bytes"] == 512 * MiB and sc["checkpoints_per_slot"] == 32
    assert sc["cap_bytes"] == 512 * MiB + sc["checkpoints_bytes"]


def _fit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object], str]:
    code = main(["fit", QWEN35, "--gpu", "24GiB", "-c", "32768", "--json", *args])
    cap = capsys.readouterr()
    return code, json.loads(cap.out) if code == 0 else {}, cap.err


def _ram_left(res: dict[str, object]) -> int:
    a = res["assumptions"]
    assert isinstance(a, dict)
    mem = res["memory"]
    assert isinstance(mem, dict)
    return int(a["ram"]["budget"]) - int(mem["CPU"]["total"])


def test_fit_keeps_the_defaults_when_they_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, res, _ = _fit(capsys, "--ram", "300GiB")
    assert code == 0
    argv = res["argv"]
    assert isinstance(argv, list) and "--cache-ram" not in argv and "--ctx-checkpoints" not in argv
    sc = res["server_caches"]
    assert isinstance(sc, dict) and sc["cap_bytes"] <= _ram_left(res)


@pytest.mark.parametrize("ram", ["256GiB", "240GiB", "236GiB"])
def test_fit_writes_the_flags_that_keep_them_in_the_ram_left(capsys: pytest.CaptureFixture[str], ram: str) -> None:
    code, res, err = _fit(capsys, "--ram", ram)
    assert code == 0, err
    argv = res["argv"]
    assert isinstance(argv, list) and "--cache-ram" in argv
    sc = res["server_caches"]
    assert isinstance(sc, dict)
    assert sc["cap_bytes"] <= _ram_left(res)  # what the printed command may take fits
    assert sc["prompt_cache_bytes"] == int(argv[argv.index("--cache-ram") + 1]) * MiB
    if "--ctx-checkpoints" in argv:
        assert sc["checkpoints_per_slot"] == int(argv[argv.index("--ctx-checkpoints") + 1]) < 32
        # the most checkpoints that fit, not fewer
        assert sc["checkpoints_bytes"] + sc["slots"] * sc["checkpoint_bytes"] > _ram_left(res)
    assert "added" in err


def test_fit_refuses_given_values_that_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _fit(capsys, "--ram", "240GiB", "--cache-ram", "8192", "-ctxcp", "8")
    assert code != 0 and "prompt cache" in err and "--cache-ram" in err
    code, _, err = _fit(capsys, "--ram", "240GiB", "--ctx-checkpoints", "32")
    assert code != 0 and "context checkpoints" in err
    code, _, err = _fit(capsys, "--ram", "240GiB", "--cache-ram", "-1", "-ctxcp", "1")
    assert code != 0 and "no byte limit" in err


def test_fit_without_ram_only_says_them(capsys: pytest.CaptureFixture[str]) -> None:
    code, res, _ = _fit(capsys)
    assert code == 0
    argv = res["argv"]
    assert isinstance(argv, list) and "--cache-ram" not in argv
    assert res["server_caches"] is not None


def test_the_engine_suite_measures_the_recorded_rows() -> None:
    src = (Path(__file__).parent / "engine" / "test_server_caches.py").read_text()
    assert "server_checkpoints.json" in src
