"""A graph reused across placements (memory/graph/model.py `_reused`: only the weights' and
caches' devices set again) gives every compute buffer a fresh build gives, and leaves the graph as
it found it (the scheduler's edits undone)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.engines.simulate import default_devices
from moeconf.memory import read_settings
from moeconf.memory.graph import model
from moeconf.model.load import load_inventory
from moeconf.placement import Placement

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
GPUS = ["RPC0[10.0.0.1:50052]", "RPC0[10.0.0.2:50052]"]


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "deepseek-v3.2", "qwen3.5-35b-a3b", "kimi-linear-48b-a3b",
                                  "gpt-oss-20b", "nemotron-3-nano-30b-a3b"])
def test_a_reused_graph_gives_what_a_fresh_build_gives(name: str) -> None:
    inv = load_inventory(MODELS / f"{name}.manifest.json")
    eng = engine("llama.cpp")
    rnd = random.Random(name)
    n = inv.block_count
    for argv in (["-c", "8192", "-fa", "on"], ["-c", "4096", "-fa", "on", "-ub", "1024", "-np", "2"],
                 ["-c", "4096", "-fa", "on", "-nkvo"]):
        setup = model.setup_for(inv, read_settings(argv, eng, reserve=0))
        assert not setup.fa_auto
        for _ in range(3):
            a = rnd.randint(1, n)
            defaults = default_devices(inv, eng, 999, GPUS, [a, n + 1 - a], None, None)
            devices: dict[str, str | None] = {
                t: rnd.choice(["CPU", *GPUS, d]) if "exps" in t and d is not None else d for t, d in defaults.items()}
            pl = Placement(inv, eng, devices, defaults, {})
            reused = model.compute(pl, setup)
            assert model._BUILT and model._BUILT[0].inv is inv
            again = model.compute(pl, setup)
            model._BUILT.clear()
            fresh = model.compute(pl, setup)
            assert reused == fresh == again, (argv, a)
