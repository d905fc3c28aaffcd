"""tests/data/speed_runs.json, the measured runs the speed predictor is validated against (issue 26
item 5; docs/benchmarks.md "Measured runs"): every row has the table's schema, names a model moeconf
can load (a shipped manifest, or a fixture layout with its quant types changed), cites where its
figures come from, and the rows kept aside are the ones the stated rule picks."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from moeconf.model import ggml
from tests.conftest import REPO
from tests.speed_runs import layout_of

DATA = REPO / "tests" / "data" / "speed_runs.json"
KEYS = {"id", "source", "aside", "engine", "engine_version", "model", "quant_note", "command", "prompt_tokens",
        "depth", "machine", "measured", "notes", "routing"}
OPTIONAL = {"engine_build"}
GPU_KEYS = {"name", "memory_bandwidth_gbs", "pcie", "matrix_tflops"}
HOST_KEYS = {"memory_bandwidth_gbs", "ram", "cores", "threads", "cpu"}
HOST_OPTIONAL = {"memory_bandwidth_fitted_gbs", "memory_bandwidth_fitted_on"}
SOURCES = ("https://", "benchmarks/cpu_speed_runs.py", "shared/memory-facts.md")
_RAM = re.compile(r"DDR\d-\d+x\d+")
_PCIE = re.compile(r"GEN\dx\d+")


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def problems(run: dict[str, Any]) -> list[str]:
    """What is wrong with one row (empty when nothing is)."""
    out: list[str] = []
    rid = run.get("id", "?")
    if not KEYS <= set(run) <= KEYS | OPTIONAL:
        return [f"{rid}: keys {sorted((set(run) ^ KEYS) - OPTIONAL)} differ from the schema"]
    if run["routing"] not in ("uniform", "same-experts"):
        out.append(f"{rid}: routing {run['routing']!r}")
    if not isinstance(run["aside"], bool):
        out.append(f"{rid}: aside is not a bool")
    if not str(run["source"]).startswith(SOURCES):
        out.append(f"{rid}: source {run['source']!r} is neither a URL, the bench script nor the team's measurements")
    if run["engine"] not in ("llama.cpp", "ik_llama.cpp"):
        out.append(f"{rid}: engine {run['engine']!r}")
    model = run["model"]
    if set(model) == {"manifest"}:
        if not (REPO / model["manifest"]).is_file():
            out.append(f"{rid}: no manifest {model['manifest']}")
    elif set(model) == {"layout"}:
        try:
            layout_of(model["layout"])
        except (KeyError, ValueError) as err:
            out.append(f"{rid}: layout {model['layout']!r}: {err}")
    else:
        out.append(f"{rid}: model names neither a manifest nor a layout")
    for text in ("quant_note", "command", "notes"):
        if not isinstance(run[text], str) or not run[text].strip():
            out.append(f"{rid}: {text} is empty")
    if not isinstance(run["prompt_tokens"], int) or run["prompt_tokens"] < 0:
        out.append(f"{rid}: prompt_tokens {run['prompt_tokens']!r}")
    if run["depth"] is not None and (not isinstance(run["depth"], int) or run["depth"] < 0):
        out.append(f"{rid}: depth {run['depth']!r}")
    measured = run["measured"]
    if set(measured) != {"pp_tps", "tg_tps"}:
        out.append(f"{rid}: measured keys {sorted(measured)}")
    else:
        figures = [v for v in measured.values() if v is not None]
        if not figures or not all(_positive(v) for v in figures):
            out.append(f"{rid}: measured {measured} has no positive figure")
        if measured["pp_tps"] is not None and run["prompt_tokens"] <= 0:
            out.append(f"{rid}: a prompt speed without a prompt length")
    machine = run["machine"]
    if set(machine) != {"gpus", "host"} or not HOST_KEYS <= set(machine["host"]) <= HOST_KEYS | HOST_OPTIONAL:
        return [*out, f"{rid}: machine keys"]
    for g in machine["gpus"]:
        if set(g) != GPU_KEYS or not _positive(g["memory_bandwidth_gbs"]) or not g["name"]:
            out.append(f"{rid}: gpu {g}")
        elif g["pcie"] is not None and not _PCIE.fullmatch(g["pcie"]):
            out.append(f"{rid}: pcie {g['pcie']!r} is not GENxLANES")
    host = machine["host"]
    if host["ram"] is not None and not _RAM.fullmatch(host["ram"]):
        out.append(f"{rid}: ram {host['ram']!r} is not DDRn-SPEEDxCHANNELS")
    for k in ("memory_bandwidth_gbs", "cores", "threads"):
        if host[k] is not None and not _positive(host[k]):
            out.append(f"{rid}: host {k} {host[k]!r}")
    if not machine["gpus"] and host["memory_bandwidth_gbs"] is None:
        out.append(f"{rid}: a CPU-only run without the host's memory bandwidth")
    return out


def aside_problems(runs: list[dict[str, Any]], prefix: str, first: int = 2) -> list[str]:
    """The rule chosen before any prediction: within the rows whose id starts with `prefix`, sorted
    by id, every third from the (first + 1)-th (default the 3rd, 6th, ...) is aside and no other."""
    group = sorted((r for r in runs if str(r["id"]).startswith(prefix)), key=lambda r: str(r["id"]))
    return [f"{r['id']}: aside should be {i % 3 == first}" for i, r in enumerate(group)
            if r["aside"] != (i % 3 == first)]


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    data = json.loads(DATA.read_text())
    assert set(data) == {"about", "runs"}
    return data["runs"]  # type: ignore[no-any-return]


def test_every_row_has_the_schema(runs: list[dict[str, Any]]) -> None:
    assert [p for r in runs for p in problems(r)] == []
    ids = [r["id"] for r in runs]
    assert len(ids) == len(set(ids)), "duplicate ids"


def test_aside_rows_follow_the_rule(runs: list[dict[str, Any]]) -> None:
    for prefix in ("pub-", "cpu-"):  # the h200 rows were set aside by their own earlier choice (3 of 9)
        group = [r for r in runs if str(r["id"]).startswith(prefix)]
        assert group, f"no {prefix} rows"
        assert aside_problems(runs, prefix) == []
    # the real-routing hybrid prompt rows (docs/speed.md "Limits"): the 2nd, 5th, ... so that at least a
    # third of five is aside (every third from the 3rd would keep one of five)
    hyb = [r for r in runs if str(r["id"]).startswith("hyb-")]
    assert len(hyb) >= 5 and aside_problems(runs, "hyb-", first=1) == []
    assert 3 * sum(r["aside"] for r in hyb) >= len(hyb)


def test_published_rows_cite_a_web_page_and_cpu_rows_the_script(runs: list[dict[str, Any]]) -> None:
    for r in runs:
        if r["id"].startswith(("pub-", "hyb-")):
            assert r["source"].startswith("https://"), r["id"]
        if r["id"].startswith("cpu-"):
            assert r["source"].startswith("benchmarks/cpu_speed_runs.py"), r["id"]
            assert r["machine"]["gpus"] == [] and r["machine"]["host"]["memory_bandwidth_gbs"], r["id"]


def test_checks_refuse_broken_rows(runs: list[dict[str, Any]]) -> None:
    good = next(r for r in runs if "layout" in r["model"])
    assert problems(good) == []
    key = good["model"]["layout"].split(":")[0]
    breakages = {
        "ram": lambda r: r["machine"]["host"].__setitem__("ram", "DDR5 6000 dual"),
        "layout": lambda r: r["model"].__setitem__("layout", "no-such-model"),
        "quant": lambda r: r["model"].__setitem__("layout", key + ":expert_type=Q9_9"),
        "field": lambda r: r["model"].__setitem__("layout", key + ":blocks=3"),
        "source": lambda r: r.__setitem__("source", "somewhere on reddit"),
        "measured": lambda r: r.__setitem__("measured", {"pp_tps": None, "tg_tps": None}),
        "schema": lambda r: r.pop("notes"),
        "routing": lambda r: r.__setitem__("routing", "random"),
        "pcie": lambda r: r["machine"].__setitem__("gpus", [{"name": "x", "memory_bandwidth_gbs": 1.0,
                                                             "pcie": "4.0 x16", "matrix_tflops": None}]),
    }
    for what, breakage in breakages.items():
        bad = copy.deepcopy(good)
        breakage(bad)
        assert problems(bad), f"a row with a broken {what} passed"
    wrong = copy.deepcopy(runs)
    first = sorted((r for r in wrong if r["id"].startswith("pub-")), key=lambda r: r["id"])[0]
    first["aside"] = not first["aside"]
    assert aside_problems(wrong, "pub-")
    hyb = sorted((r for r in wrong if r["id"].startswith("hyb-")), key=lambda r: r["id"])[-1]
    hyb["aside"] = not hyb["aside"]
    assert aside_problems(wrong, "hyb-", first=1)


def test_layouts_with_changed_quants_keep_the_model_and_change_the_bytes() -> None:
    from moeconf.fixtures.layouts import tensors

    base = layout_of("deepseek-v3.2")
    q8 = layout_of("deepseek-v3.2:file_type=Q8_0,expert_type=Q8_0,expert_down_type=Q8_0,attn_type=Q8_0")
    ids = ggml.type_ids()

    def gib(lay: Any) -> float:
        return sum(ggml.nbytes(ids[t], s) or 0 for _, t, s in tensors(lay)) / 2**30

    assert [n for n, _, _ in tensors(base)] == [n for n, _, _ in tensors(q8)]
    # DeepSeek-V3.2 Q8_0 as llama-bench printed it in the cited run: 678.56 GiB
    assert abs(gib(q8) - 678.56) / 678.56 < 0.01
    assert gib(base) < gib(q8)
