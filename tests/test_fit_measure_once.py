"""Issue 25 item 1: `fit` compiles its plan once, simulates the command line it prints once, and
measures each placement once: the chosen fill's last measure is the command line's memory
(`Compiled.memory`, `fill.FillMeasure`) wherever the command line reads back to that placement,
those settings and that pipeline parallelism, and is measured again wherever it does not."""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import moeconf.compile as compile_mod
import moeconf.emitting.readback as readback
import moeconf.explanation as explanation
import moeconf.fill as fill_mod
import moeconf.fit as fit_mod
import moeconf.sizing as sizing
from moeconf.cli import main
from moeconf.fit import Budget, fit

estimate_mod = importlib.import_module("moeconf.memory.estimate")  # the package's `estimate` is the function

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
GiB = 1024**3


class Calls:
    """Every compile, read-back simulation of a command line and memory estimate, counted."""

    def __init__(self) -> None:
        self.compiles = 0
        self.simulated: list[tuple[str, ...]] = []
        self.estimates: Counter[tuple[object, ...]] = Counter()
        self.exact: Counter[tuple[tuple[str, str | None], ...]] = Counter()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    c = Calls()
    compile_plan, explain_invocation, estimate = (compile_mod.compile_plan, explanation.explain_invocation,
                                                  estimate_mod.estimate)

    def counted_compile(*a: Any, **k: Any) -> Any:
        c.compiles += 1
        return compile_plan(*a, **k)

    def counted_explain(inv: Any, invocation: Any, *a: Any, **k: Any) -> Any:
        c.simulated.append(tuple(x.text for x in invocation.args))
        return explain_invocation(inv, invocation, *a, **k)

    def counted_estimate(placement: Any, settings: Any, **k: Any) -> Any:
        devices = tuple(placement.devices.items())
        c.estimates[(devices, tuple(placement.defaults.items()), placement.engine.name, settings,
                     k.get("pipeline", False))] += 1
        c.exact[devices] += 1
        return estimate(placement, settings, **k)

    for mod in (fit_mod, compile_mod):
        if hasattr(mod, "compile_plan"):
            monkeypatch.setattr(mod, "compile_plan", counted_compile)
    monkeypatch.setattr(explanation, "explain_invocation", counted_explain)
    monkeypatch.setattr(readback, "explain_invocation", counted_explain)
    for mod in (estimate_mod, fill_mod, sizing):
        monkeypatch.setattr(mod, "estimate", counted_estimate)
    return c


def _once(c: Calls, placement: dict[str, str | None]) -> None:
    assert c.compiles == 1
    assert len(c.simulated) == 1, c.simulated  # the printed command line, read back by the compiler alone
    repeated = [k for k, n in c.estimates.items() if n > 1]
    assert not repeated, f"{len(repeated)} placement(s) estimated more than once with the same settings"
    assert c.exact[tuple(placement.items())] == 1


@pytest.mark.parametrize("model,budgets,argv", [
    ("qwen3-30b-a3b", {"CUDA0": 12 * GiB}, ["-c", "32768"]),
    ("qwen3-30b-a3b", {"CUDA0": 8 * GiB, "CUDA1": 6 * GiB}, ["-c", "16384"]),
    ("glm-4.5-air", {"CUDA0": 20 * GiB}, ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"]),
    ("deepseek-v3.2", {"CUDA0": 24 * GiB, "CUDA1": 16 * GiB}, ["-c", "8192"]),  # DSA's slow graph
])
def test_fit_compiles_simulates_and_measures_its_result_once(calls: Calls, tmp_path: Path, model: str,
                                                              budgets: dict[str, int], argv: list[str]) -> None:
    r = fit(str(MODELS / f"{model}.manifest.json"), "llama.cpp", [Budget(d, b) for d, b in budgets.items()], argv,
            plan_dir=str(tmp_path))
    _once(calls, r.compiled.placement.devices)
    assert r.compiled.memory is r.memory  # the table printed is the compiled command line's one measure
    assert calls.simulated[0] == r.argv


def test_the_cli_with_a_target_and_a_plan_file_compiles_once(calls: Calls, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "m.toml"
    assert main(["fit", str(MODELS / "qwen3-30b-a3b.manifest.json"), "--gpu", "12GiB", "-o", str(plan),
                 "-T", "compose", "--docker-volume", "/srv/m:/models", "--", "-c", "8192"]) == 0
    assert "/srv/m:/models" in capsys.readouterr().out and "/srv/m:/models" in plan.read_text()
    # the compiled command line read back once by the compiler, and the compose file once by its target's
    # own read-back (the command as the container receives it)
    assert calls.compiles == 1 and len(calls.simulated) == 2 and calls.simulated[0][0] == "llama-server"
    assert calls.simulated[1][:len(calls.simulated[0]) - 1] == calls.simulated[0][1:]  # (+ --host, --port)
    assert not [k for k, n in calls.estimates.items() if n > 1]


def test_a_host_cpu_the_fill_did_not_measure_for_is_measured_again(calls: Calls, tmp_path: Path) -> None:
    """--host-cpu amx changes the host's weights, which the fill's plan does not carry: the command
    line's memory is measured again with it (the settings differ, so no estimate repeats)."""
    r = fit(str(MODELS / "qwen3-30b-a3b.manifest.json"), "llama.cpp", [Budget("CUDA0", 12 * GiB)], ["-c", "8192"],
            plan_dir=str(tmp_path), host_cpu="amx")
    assert calls.exact[tuple(r.compiled.placement.devices.items())] == 2
    assert r.memory.settings.host_cpu == "amx" and r.compiled.memory.settings.host_cpu != "amx"
    assert not [k for k, n in calls.estimates.items() if n > 1]


def test_the_fill_measure_is_taken_only_for_the_placement_settings_and_pipeline_it_measured(tmp_path: Path) -> None:
    """`Compiled.measured_memory` refuses a fill measure of another placement, other settings or
    another pipeline flag: the compiled command line is then measured itself."""
    r = fit(str(MODELS / "qwen3-30b-a3b.manifest.json"), "llama.cpp", [Budget("CUDA0", 12 * GiB)], ["-c", "8192"],
            plan_dir=str(tmp_path))
    c = r.compiled
    m = c.measured
    assert m is not None
    ex = c.explained()
    settings = fill_mod.plan_settings(c.plan, c.engine)
    assert c.measured_memory(ex, settings) is m.mem
    name = next(n for n, d in m.placement.devices.items() if d == "CUDA0")
    moved = dataclasses.replace(m, placement=dataclasses.replace(m.placement,
                                                                 devices={**m.placement.devices, name: "CPU"}))
    other = [moved, dataclasses.replace(m, settings=dataclasses.replace(m.settings, n_ubatch=256)),
             dataclasses.replace(m, pipeline=not m.pipeline),
             dataclasses.replace(m, placement=dataclasses.replace(m.placement, defaults={
                 **m.placement.defaults, name: "CPU"}))]
    for wrong in other:
        assert dataclasses.replace(c, measured=wrong).measured_memory(ex, settings) is None
    assert c.measured_memory(ex, dataclasses.replace(settings, n_ubatch=256)) is None
    # where none is taken, the compiled command line's own measure: the same figures for the right one
    fresh = dataclasses.replace(c, measured=None)
    assert fresh.memory.json() == c.memory.json()
