"""ik_llama.cpp's compute: llama.cpp's graph of the same placement plus a margin measured on ik
(moeconf/memory/ikarchs.py), held to the compute buffers ik_llama.cpp 0.1.5 logged on real loads
of cut layouts (tests/data/ik_compute_figures.json, measured by tests/engine/test_ik_compute.py;
the engine suite measures them again).

What is held: every recorded line's placement (each device's KV cache, the RPC devices' weights),
each architecture's margin is the worst difference its lines measured (rounded up to the MiB) and
counts them, the label `explain` and `fit` print and write, and the refusals naming the next step."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from moeconf.cli import main
from moeconf.engines import engine, mainline
from moeconf.explanation import explain
from moeconf.fixtures.writer import write_layout
from moeconf.memory import estimate, read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.memory.ikarchs import COMPUTE_DIFFERS, COMPUTE_MARGINS, MLA_MODELLED, compute_label, next_step
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.model.nametable import SOURCES
from moeconf.sizing import estimate_explained
from tests.engine import ik_compute_cases as cases

DATA = Path(__file__).parent / "data" / "ik_compute_figures.json"
FIGURES: dict[str, Any] = json.loads(DATA.read_text())
ROWS: list[dict[str, Any]] = FIGURES["rows"]
MEASURED = [r for r in ROWS if not r.get("refused")]
MiB = 1024 * 1024
EPS = ["127.0.0.1:50052", "127.0.0.1:50053"]
IK = engine("ik_llama.cpp", "0.1.5")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("ikcompute")
    out = {}
    for name in cases.CUTS:
        path = cases.cut_path(folder, name)
        write_layout(cases.cut_layout(name), path)  # the real vocabulary: the logits are sized by it
        out[name] = load_inventory(path)
    return out


def _device(key: str) -> str:
    """A recorded device (CPU, GPUi) as moeconf names it for the user's line."""
    return key if key == "CPU" else f"RPC0[{EPS[int(key[3:])]}]"


def _estimate(inv: Inventory, row: dict[str, Any]) -> MemoryEstimate:
    args = cases.user_args(row["line"], EPS)
    return estimate_explained(explain(inv, IK, args, gpus=[], layer_devices=row.get("layer_devices")),
                              read_settings(args, IK))


def differences(row: dict[str, Any], est: MemoryEstimate, arch: str) -> dict[str, float]:
    """Per device of a recorded line: how far ik's compute buffer was above moeconf's figure less
    the margin it added (memory/ikarchs.py, as the estimate was made)."""
    added = COMPUTE_MARGINS[arch][0]
    return {key: mib - (est.devices[_device(key)].compute / MiB - added) for key, mib in row["ik"]["compute"].items()}


def margin_check(rows: list[dict[str, Any]], estimates: list[MemoryEstimate],
                 margins: dict[str, tuple[int, int]], arch_of: dict[str, str]) -> list[str]:
    """What is wrong with the margins against the recorded figures (empty: each architecture's
    margin is its worst difference rounded up, over as many figures as it says)."""
    worst: dict[str, float] = {}
    count: dict[str, int] = {}
    for row, est in zip(rows, estimates, strict=True):
        arch = arch_of[row["model"]]
        if arch in MLA_MODELLED or arch in COMPUTE_DIFFERS:  # MLA: ikmla's margin (tests/test_memory_ik_mla.py)
            continue
        for diff in differences(row, est, arch).values():
            worst[arch] = max(worst.get(arch, 0.0), diff)
            count[arch] = count.get(arch, 0) + 1
    out = []
    for arch in sorted(set(worst) | set(margins)):
        want = (max(0, math.ceil(worst.get(arch, 0.0) - 0.005)), count.get(arch, 0))
        if margins.get(arch) != want:
            out.append(f"{arch}: margin {margins.get(arch)}, measured {want} (worst {worst.get(arch, 0.0):.2f} MiB)")
    return out


@pytest.fixture(scope="module")
def estimates(models: dict[str, Inventory]) -> list[MemoryEstimate]:
    return [_estimate(models[r["model"]], r) for r in MEASURED]


def test_every_architecture_and_line_was_measured_on_the_pinned_ik() -> None:
    assert FIGURES["engine"] == SOURCES["ik_llama.cpp"]  # the vendored commit the figures were read with
    assert {(r["model"], r["line"]) for r in ROWS} == set(cases.cases())
    # every architecture measured: a margin, or ik's MLA attention modelled
    assert set(COMPUTE_MARGINS) | set(MLA_MODELLED) | set(COMPUTE_DIFFERS) == {cases.cut_layout(m).arch
                                                                               for m in cases.CUTS}
    assert not set(COMPUTE_MARGINS) & set(MLA_MODELLED) and not set(COMPUTE_DIFFERS) & (set(COMPUTE_MARGINS)
                                                                                          | set(MLA_MODELLED))


def test_each_line_placed_weights_and_kv_as_moeconf_does(models: dict[str, Inventory],
                                                          estimates: list[MemoryEstimate]) -> None:
    for row, est in zip(MEASURED, estimates, strict=True):
        ik = row["ik"]
        if cases.cut_layout(row["model"]).arch in COMPUTE_DIFFERS:  # compute refused, weights and KV modelled
            assert not est.complete and est.kv_known, (row["model"], est.notes)
        else:
            assert est.complete, (row["model"], row["line"], est.notes)
        for key, mib in ik["kv"].items():
            assert abs(est.devices[_device(key)].kv / MiB - mib) <= 0.01, (row, est.devices)
        total = sum(m.weights for m in est.devices.values()) / MiB
        assert abs(total - sum(ik["weights"].values()) - ik["computed"]) <= 1.0, (row, total)
        if not ik["computed"]:
            for key, mib in ik["weights"].items():
                if key != "CPU":
                    assert abs(est.devices[_device(key)].weights / MiB - mib) <= 1.0, (row, est.devices)


def test_each_margin_is_the_worst_difference_measured(models: dict[str, Inventory],
                                                      estimates: list[MemoryEstimate]) -> None:
    arch_of = {m: inv.arch for m, inv in models.items()}
    assert margin_check(MEASURED, estimates, COMPUTE_MARGINS, arch_of) == []
    # so no recorded compute buffer is above moeconf's figure for it
    for row, est in zip(MEASURED, estimates, strict=True):
        if not est.complete:
            continue
        for key, mib in row["ik"]["compute"].items():
            assert mib <= est.devices[_device(key)].compute / MiB + 0.005, (row, est.devices)


def test_the_margin_check_refuses_a_wrong_figure_or_margin(models: dict[str, Inventory],
                                                           estimates: list[MemoryEstimate]) -> None:
    arch_of = {m: inv.arch for m, inv in models.items()}
    i, row = next((i, r) for i, r in enumerate(MEASURED) if r["model"] == "qwen3-30b-a3b")
    arch = arch_of[row["model"]]
    margin = COMPUTE_MARGINS[arch][0]
    # an ik figure 2 MiB above what the margin covers
    key = next(iter(row["ik"]["compute"]))
    est = estimates[i]
    high = est.devices[_device(key)].compute / MiB + 2
    bad = {**row, "ik": {**row["ik"], "compute": {**row["ik"]["compute"], key: high}}}
    rows = [bad if j == i else r for j, r in enumerate(MEASURED)]
    assert any(m.startswith(f"{arch}: margin") for m in margin_check(rows, estimates, COMPUTE_MARGINS, arch_of))
    # a margin smaller than measured, or one that counts a line too few
    for wrong in ((margin - 1, COMPUTE_MARGINS[arch][1]), (margin, COMPUTE_MARGINS[arch][1] - 1)):
        assert margin_check(MEASURED, estimates, {**COMPUTE_MARGINS, arch: wrong}, arch_of)


def differs_check(rows: list[dict[str, Any]], arch_of: dict[str, str],
                  margins: dict[str, tuple[int, int]]) -> list[str]:
    """What is wrong with COMPUTE_DIFFERS against the recorded figures (empty: each architecture
    in it had a buffer over 64 MiB above llama.cpp's graph, and every margin is 64 MiB or less)."""
    worst: dict[str, float] = {}
    for row in rows:
        arch = arch_of[row["model"]]
        if arch in COMPUTE_DIFFERS:
            worst[arch] = max(worst.get(arch, -1e9), *row["ik_above"].values())
    return ([f"{arch}: worst {w:.2f} MiB above llama.cpp's graph" for arch, w in sorted(worst.items()) if w <= 64]
            + [f"{arch}: margin {m} MiB" for arch, (m, _n) in sorted(margins.items()) if m > 64])


def test_compute_is_refused_where_ik_s_graph_differs(models: dict[str, Inventory], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    arch_of = {m: inv.arch for m, inv in models.items()}
    assert differs_check(MEASURED, arch_of, COMPUTE_MARGINS) == []
    # figures that would make gemma4's excess a margin, or a margin too large for one, are caught
    low = [{**r, "ik_above": {k: min(v, 10.0) for k, v in r["ik_above"].items()}} if arch_of[r["model"]] == "gemma4"
           else r for r in MEASURED]
    assert differs_check(low, arch_of, COMPUTE_MARGINS) == ["gemma4: worst 10.00 MiB above llama.cpp's graph"]
    assert differs_check(MEASURED, arch_of, {**COMPUTE_MARGINS, "qwen3moe": (100, 11)}) == ["qwen3moe: margin 100 MiB"]
    # explain says why, and fit refuses
    path = str(tmp_path / "gemma4.gguf")
    write_layout(cases.cut_layout("gemma-4-26b-a4b"), Path(path), vocab=256)
    assert main(["fit", path, "--engine", "ik_llama.cpp", "--gpu", "24GiB", "-c", "8192"]) != 0
    assert "build_gemma4" in capsys.readouterr().err


def test_the_estimate_is_llama_cpp_s_graph_plus_the_margin(models: dict[str, Inventory]) -> None:
    inv = models["glm-4.5-air"]
    args = cases.user_args("-c 32768", EPS)
    ex = explain(inv, IK, args, gpus=[])
    est = estimate_explained(ex, read_settings(args, IK))
    from dataclasses import replace

    from moeconf.memory.estimate import ik_twin_settings

    twin = estimate(replace(ex.placement, engine=mainline()), ik_twin_settings(read_settings(args, IK)))
    margin = COMPUTE_MARGINS["glm4moe"][0] * MiB
    for d, m in est.devices.items():
        if m.compute:
            assert m.compute == twin.devices[d].compute + margin
            assert compute_label("glm4moe", 512) in m.estimated


@pytest.mark.parametrize("model", ["qwen3.5-397b-a17b", "minimax-m2", "grok-1", "qwen3-30b-a3b", "ling-mini-2.0"])
def test_explain_and_fit_on_ik_answer_with_the_label(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / f"{model}.manifest.json")
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768"]
    assert main(["explain", path, "--engine", "ik_llama.cpp", "--json", "--", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    arch = load_inventory(path).arch
    label = compute_label(arch)
    assert label is not None and data["memory_complete"] is True
    assert data["memory"]["CUDA0"]["compute"] > COMPUTE_MARGINS[arch][0] * MiB
    assert label in data["memory_estimated"]["CUDA0"] and label in data["memory_estimated"]["CPU"]

    assert main(["explain", path, "--engine", "ik_llama.cpp", "--", *argv]) == 0
    out = capsys.readouterr().out
    assert f"* CUDA0: {label}\n" in out and "?" not in out.split("note:")[0].split("memory (MiB)")[1]

    # two GPUs where ik's -ts split is predicted (moeconf/iksplit.py)
    two = [["--gpu", "32GiB", "--gpu", "32GiB"]] if model in ("qwen3-30b-a3b", "minimax-m2") else []
    for gpus in (["--gpu", "48GiB"], *two):
        assert main(["fit", path, "--engine", "ik_llama.cpp", *gpus, "-c", "32768", "-ctk", "q8_0", "-ctv",
                     "q8_0" if arch != "grok" else "f16"]) == 0, capsys.readouterr().err
        got = capsys.readouterr()
        assert got.out.startswith("llama-server -m ") and label in got.err  # the command, and the label on its table
    assert main(["fit", path, "--engine", "ik_llama.cpp", "--gpu", "48GiB", "-c", "32768", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert label in fitted["memory_estimated"]["CUDA0"]


@pytest.mark.parametrize(("model", "fragment"), [
    ("kimi-linear-48b-a3b", "ik_llama.cpp 0.1.5 does not load the 'kimi-linear' architecture: run it on llama.cpp "
                            "(--engine llama.cpp)"),
    ("nemotron-3-nano-30b-a3b", "does not load the 'nemotron_h_moe' architecture"),
    ("deepseek-v3.2", "does not load the 'deepseek32' architecture"),
])
def test_fit_on_an_architecture_ik_does_not_load_names_the_engine_that_does(
        model: str, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / f"{model}.manifest.json")
    assert main(["fit", path, "--engine", "ik_llama.cpp", "--gpu", "24GiB", "-c", "32768"]) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize(("model", "flags", "fragment"), [
    ("qwen3-30b-a3b", ["-ctk", "q6_0", "-ctv", "q6_0"],
     "which has no q6_0 cache (-ctk q6_0): give a cache type both engines have"),
    ("qwen3-30b-a3b", ["-fa", "off"], "with flash attention off is not modelled for 'qwen3moe' (ik keeps a second copy "
                                      "of the KQ matrix, measured on grok only): drop -fa off"),
    # (deepseek2 and glm-dsa: ik's MLA attention modelled, tests/test_memory_ik_mla.py)
])
def test_compute_llama_cpp_s_graph_does_not_stand_for_is_refused_with_the_next_step(
        model: str, flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / f"{model}.manifest.json")
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768", *flags]
    assert main(["explain", path, "--engine", "ik_llama.cpp", "--json", "--", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_complete"] is False and data["memory_kv_complete"] is True
    assert data["memory"]["CUDA0"]["compute"] is None and data["memory"]["CUDA0"]["kv"] > 0
    notes = " ".join(data["memory_notes"])
    step = ("next step: write the placement as explicit rules (`moeconf compile`)" if not flags
            else "next step: size it with llama.cpp's graph (--engine llama.cpp")
    assert fragment in notes and step in notes
    assert main(["fit", path, "--engine", "ik_llama.cpp", "--gpu", "48GiB", "-c", "32768", *flags]) == 2
    err = capsys.readouterr().err
    assert fragment in err and step in err


def test_an_mla_mode_other_than_the_measured_one_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # an MLA architecture sized by llama.cpp's graph plus a margin (not by ik's MLA attention model,
    # memory/ikmla.py): -mla 1 is refused, the margin being measured at -mla 3 only
    import moeconf.memory.ikarchs as ikarchs

    monkeypatch.setattr(ikarchs, "COMPUTE_MARGINS", {**COMPUTE_MARGINS, "deepseek2": (0, 1)})
    monkeypatch.setattr(ikarchs, "MLA_MODELLED", {})
    path = str(EXAMPLES / "deepseek-v3.manifest.json")
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768"]
    assert main(["explain", path, "--engine", "ik_llama.cpp", "--json", "--", *argv]) == 0
    assert json.loads(capsys.readouterr().out)["memory_complete"] is True
    assert main(["explain", path, "--engine", "ik_llama.cpp", "--json", "--", *argv, "-mla", "1", "-fa", "off"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_complete"] is False
    assert any("-mla 1 is not modelled (its margin over llama.cpp's graph was measured at the default -mla 3): drop "
               "-mla to size it" in n for n in data["memory_notes"])


def test_flash_attention_off_adds_ik_s_second_kq_matrix(models: dict[str, Inventory]) -> None:
    inv = models["grok-1"]
    args = cases.user_args("-c 32768", EPS)
    ex = explain(inv, IK, args, gpus=[])
    est = estimate_explained(ex, read_settings(args, IK))
    from dataclasses import replace

    from moeconf.memory.estimate import ik_twin_settings

    twin = estimate(replace(ex.placement, engine=mainline()), ik_twin_settings(read_settings(args, IK)))
    gpu = f"RPC0[{EPS[0]}]"
    kq = 4 * 48 * 32768 * 512  # Grok-1: 48 heads, every cell, the ubatch
    assert est.devices[gpu].compute == twin.devices[gpu].compute + kq + COMPUTE_MARGINS["grok"][0] * MiB
    assert est.devices["CPU"].compute == twin.devices["CPU"].compute + COMPUTE_MARGINS["grok"][0] * MiB


def test_an_architecture_not_measured_on_ik_is_refused(models: dict[str, Inventory],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import moeconf.memory.ikarchs as ikarchs

    monkeypatch.setattr(ikarchs, "COMPUTE_MARGINS", {k: v for k, v in COMPUTE_MARGINS.items() if k != "qwen3moe"})
    est = _estimate(models["qwen3-30b-a3b"], {"line": "-c 32768"})
    assert not est.complete and est.kv_known
    assert any("were not measured against llama.cpp's graph" in n for n in est.notes)
    assert any(n.startswith("next step:") for n in est.notes)


def test_next_step_names_what_the_user_can_do(models: dict[str, Inventory]) -> None:
    inv = models["qwen3-30b-a3b"]
    assert "--engine llama.cpp" in next_step(inv, True) and "`moeconf compile`" in next_step(inv, True)
    neither = next_step(inv, False)
    assert "`moeconf compile`" in neither and "`moeconf explain`" in neither and "--engine llama.cpp" not in neither


def test_the_margin_grows_with_the_ubatch_above_the_measured_one(models: dict[str, Inventory]) -> None:
    import moeconf.memory.ikarchs as ikarchs

    m = COMPUTE_MARGINS["qwen3moe"][0]
    assert ikarchs.margin_mib("qwen3moe", 512) == ikarchs.margin_mib("qwen3moe", 2048) == m
    assert ikarchs.margin_mib("qwen3moe", 4096) == 2 * m
    inv = models["qwen3-30b-a3b"]
    args = cases.user_args("-c 32768 -b 4096 -ub 4096", EPS)
    est = estimate_explained(explain(inv, IK, args, gpus=[]), read_settings(args, IK))
    assert f"margin {2 * m} MiB" in " ".join(est.devices["CPU"].estimated)


def _docs_table() -> dict[str, list[str]]:
    """docs/memory.md's ik compute table: architecture -> its row's cells."""
    lines = (Path(__file__).resolve().parent.parent / "docs" / "memory.md").read_text().splitlines()
    start = lines.index("| architecture (cut layout) | command lines (engine refused) | compute figures | ik above "
                        "llama.cpp's graph: largest, MiB (line) | ik below it: largest, MiB | margin (MiB) |")
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].split(" (")[0]] = cells
    return rows


def test_docs_table_has_a_row_per_measured_architecture() -> None:
    """docs/memory.md's table: a row for every architecture measured (lacking mistral4, mimo2 and step35, and
    the six before them, it had 15 of 24), the lines and figures counted from the recorded figures, and the
    margin memory/ikarchs.py adds (or what stands for it); the label it quotes for GLM-4.5-Air is today's."""
    table = _docs_table()
    arch_of = {m: cases.cut_layout(m).arch for m in cases.CUTS}
    assert set(table) == set(arch_of.values())
    for model, arch in arch_of.items():
        rows = [r for r in ROWS if r["model"] == model]
        measured = [r for r in rows if not r.get("refused")]
        cells = table[arch]
        assert cells[0] == f"{arch} ({model})", cells
        assert cells[1] == f"{len(rows)} ({len(rows) - len(measured)})", cells
        assert cells[2] == str(sum(len(r["ik"]["compute"]) for r in measured)), cells
        margin = (str(COMPUTE_MARGINS[arch][0]) if arch in COMPUTE_MARGINS else "MLA model (below)"
                  if arch in MLA_MODELLED else "compute refused (graph differs, above)")
        assert cells[5] == margin, cells
        assert arch not in COMPUTE_MARGINS or COMPUTE_MARGINS[arch][1] == int(cells[2]), cells
    root = Path(__file__).resolve().parent.parent / "docs"
    glm = compute_label("glm4moe", 512)
    assert f"  * CUDA0: {glm}" in (root / "memory.md").read_text().splitlines()
    assert f"`{glm}` (GLM-4.5-Air)" in " ".join((root / "fit.md").read_text().split())
