"""Each launch line's context is resolved once per lint run: its engine, its words, its simulation
(`explain_invocation`), its memory settings (`read_settings` of the whole line) and its memory
estimate, however many rules read them. Counters patched onto each step catch a rule that
resolves the line again (as the memory rules once read the line's settings four times)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import moeconf.explanation
import moeconf.memory
import moeconf.sizing
from moeconf.linting import linter
from moeconf.linting.linter import lint
from moeconf.linting.model import Context
from tests.conftest import EXAMPLES

LINES = [
    # over a 16 GiB GPU: memory-over-device and fit-conflict both read the settings and the estimate
    "llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ctk q8_0 -ctv q8_0",
    "llama-server -m m.gguf -ngl 999 -c 8192 -ot exps=CPU",
    "llama-server -m m.gguf -ngl 999 -c 16384 -ctk q4_0",
]


class Counted:
    """Counters on every step that resolves a line, keyed to the lines the linter built contexts for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.contexts: list[Context] = []
        self.line_settings: collections.Counter[int] = collections.Counter()  # context index -> whole-line reads
        self.line_estimates: collections.Counter[int] = collections.Counter()
        self.line_simulations: collections.Counter[int] = collections.Counter()  # invocation index -> explains
        self.invocations: list[Any] = []
        self._patch(monkeypatch, linter, "_engine_for")
        self._patch(monkeypatch, linter, "parse_invocation")
        parse, simulate = linter.parse_invocation, moeconf.explanation.explain_invocation

        def parse_invocation(*a: Any, **k: Any) -> Any:
            self.invocations.append(parse(*a, **k))
            return self.invocations[-1]

        def explain_invocation(inv: Any, invocation: Any, *a: Any, **k: Any) -> Any:
            # fit's advice simulates command lines of its own: only the linted lines' are counted
            for i, known in enumerate(self.invocations):
                if invocation is known:
                    self.line_simulations[i] += 1
            return simulate(inv, invocation, *a, **k)

        monkeypatch.setattr(linter, "parse_invocation", parse_invocation)
        monkeypatch.setattr(moeconf.explanation, "explain_invocation", explain_invocation)

        def record(*a: Any, **k: Any) -> Context:
            ctx = Context(*a, **k)
            self.contexts.append(ctx)
            return ctx

        monkeypatch.setattr(linter, "Context", record)
        read, est = moeconf.memory.read_settings, moeconf.sizing.estimate_explained

        def read_settings(argv: Any, *a: Any, **k: Any) -> Any:
            for i, ctx in enumerate(self.contexts):
                if list(argv) == [w.text for w in ctx.invocation.args]:
                    self.line_settings[i] += 1
            return read(argv, *a, **k)

        def estimate_explained(ex: Any, settings: Any) -> Any:
            for i, ctx in enumerate(self.contexts):
                if ex is ctx.explanation:
                    self.line_estimates[i] += 1
            return est(ex, settings)

        monkeypatch.setattr(moeconf.memory, "read_settings", read_settings)
        monkeypatch.setattr(moeconf.sizing, "estimate_explained", estimate_explained)

    def _patch(self, monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
        orig: Callable[..., Any] = getattr(module, name)

        def counted(*a: Any, **k: Any) -> Any:
            self.calls[name] += 1
            return orig(*a, **k)

        monkeypatch.setattr(module, name, counted)


def _lint(tmp_path: Path, lines: list[str]) -> tuple[set[str], int]:
    model = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"
    (tmp_path / ".moeconf.toml").write_text(
        f'engine = "llama.cpp"\ngpu_memory = {{"CUDA0" = "16GiB"}}\n[models]\n"m.gguf" = "{model}"\n')
    (tmp_path / "launch.sh").write_text("\n".join(lines) + "\n")
    result = lint([str(tmp_path / "launch.sh")])
    return {f.name for f in result.findings}, result.launches


def test_each_launch_is_resolved_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(monkeypatch)
    names, launches = _lint(tmp_path, LINES)
    n = len(LINES)
    assert launches == n and len(counted.contexts) == n
    # the rules that read the settings and the estimate did run (else the counts below prove nothing)
    assert {"memory-over-device", "fit-conflict"} <= names, names
    assert counted.calls == {"_engine_for": n, "parse_invocation": n}, counted.calls
    assert counted.line_simulations == {i: 1 for i in range(n)}, counted.line_simulations
    assert counted.line_settings == {i: 1 for i in range(n)}, counted.line_settings
    assert counted.line_estimates == {i: 1 for i in range(n)}, counted.line_estimates


def test_the_counters_see_a_line_resolved_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrong answer: a rule that reads the line's settings itself, past the shared cache."""
    from moeconf.linting.rules import cache_type_refused

    counted = Counted(monkeypatch)
    check = cache_type_refused.check

    def rereads(ctx: Context) -> Any:
        ctx.cache.pop("settings", None)
        return check(ctx)

    monkeypatch.setattr(cache_type_refused, "check", rereads)
    _lint(tmp_path, LINES[:1])
    assert counted.line_settings[0] == 2, counted.line_settings
