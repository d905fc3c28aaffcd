"""The lint rules' Simulation answers an edit (an item removed, moved before another, or its
pattern replaced) from each tensor's first and second matching item: checked against running the
engine's first-match rule over the edited item list, on a line with many overlapping items."""

from __future__ import annotations

import random

from moeconf.engines import engine
from moeconf.engines.cmdline import parse_invocation
from moeconf.explanation import explain_invocation
from moeconf.linting.linter import command_words
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Simulation, created, matches, simulation
from moeconf.model.load import load_inventory
from tests.conftest import EXAMPLES

KINDS = ("blk\\.{i}\\.ffn_up_exps=CPU", "blk\\.{i}\\.ffn_(up|down)_exps=CUDA0", "blk.{i}.ffn_down_exps=CPU",
         "blk\\.{i}\\.attn_.*=CPU", "blk\\.{i}\\.=CUDA0", "blk\\.{i}\\.ffn_.*=CPU", "exps=CPU", "shexp=CUDA0")


def _context(items: list[str]) -> Context:
    inv = load_inventory(str(EXAMPLES / "models" / "deepseek-v3.manifest.json"))
    eng = engine("llama.cpp", None)
    argv = ["llama-server", "-m", "m.gguf", "-ngl", "999", "-ot", ",".join(items)]
    invocation = parse_invocation(command_words(argv), eng)
    ex = explain_invocation(inv, invocation, ["CUDA0"])
    return Context("<test>", 1, 1, eng, invocation, inv, ex, ["CUDA0"])


def _first_match(sim: Simulation, order: list[int], patterns: dict[int, str]) -> dict[str, int | None]:
    """The engine's rule, run whole: each name's first item in `order` whose pattern matches it."""
    tests = {j: matches(patterns.get(j, it.pattern)) for j, it in enumerate(sim.items)}
    out: dict[str, int | None] = {}
    for n in sim.names:
        out[n] = next((j for j in order if (m := tests[j]) is not None and m(n)), None)
    return out


def _changed(sim: Simulation, whole: dict[str, int | None]) -> dict[str, int | None]:
    return {n: j for n, j in whole.items() if j != sim.first[n]}


def test_edits_match_the_whole_simulation() -> None:
    rnd = random.Random(25)
    items = [rnd.choice(KINDS).format(i=rnd.randrange(0, 64)) for _ in range(60)]
    ctx = _context(items)
    sim = simulation(ctx)
    assert sim is simulation(ctx)  # built once per invocation
    assert sim.names == [t.name for t in created(ctx)]
    n = len(sim.items)
    assert n == len(items)
    base = _first_match(sim, list(range(n)), {})
    assert base == sim.first
    assert sim.exact
    for k in range(n):
        assert sim.without(k) == _changed(sim, _first_match(sim, [j for j in range(n) if j != k], {}))
        for j0 in rnd.sample([j for j in range(n) if j != k], 5):
            order = [j for j in range(n) if j != k]
            order.insert(order.index(j0), k)
            assert sim.moved_before(k, j0) == _changed(sim, _first_match(sim, order, {})), (k, j0)
        for fix in ("ffn_.*_exps", sim.items[rnd.randrange(n)].pattern, "attn_norm"):
            assert sim.replaced(k, fix) == _changed(sim, _first_match(sim, list(range(n)), {k: fix})), (k, fix)
    # hits after an edit, from the changes only
    for k in range(n):
        changed = sim.without(k)
        whole = {**sim.first, **changed}
        for j, count in sim.hits_after(changed).items():
            assert count == sum(1 for v in whole.values() if v == j)
