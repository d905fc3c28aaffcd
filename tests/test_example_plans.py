"""The shipped plans keep their promise: each names the GPUs it is written for in a [budget] (the size its
first comment line claims), and compiles within it by moeconf's memory table. deepseek-v3.toml promised
"one 24 GB GPU" and needed 50,558 MiB; with a [budget] compile refuses a plan that stops fitting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moeconf.compile import compile_plan
from moeconf.plan import load_plan

PLANS = sorted((Path(__file__).parent.parent / "examples" / "plans").glob("*.toml"))
MiB = 1024 * 1024


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_every_shipped_plan_fits_the_gpus_it_names(path: Path) -> None:
    plan = load_plan(str(path))
    budget = plan.config.budget
    assert budget is not None, f"{path.name}: no [budget] for the GPUs its comment names"
    claimed = [int(n) for n in re.findall(r"(\d+) GiB", path.read_text().splitlines()[1])]
    assert claimed, f"{path.name}: its first comment line names no GPU size in GiB"
    compiled = compile_plan(plan)
    mem = compiled.memory
    gpus = sorted(d for d in mem.devices if d != "CPU")
    assert len(gpus) == len(claimed), f"{path.name}: {gpus} for the GPUs of {claimed} GiB"
    assert mem.complete, mem.notes
    for dev, gib in zip(gpus, claimed, strict=True):
        assert mem.devices[dev].total <= gib * 1024 * MiB, (f"{path.name}: {dev} needs "
                                                            f"{mem.devices[dev].total / MiB:,.0f} MiB of {gib} GiB")
