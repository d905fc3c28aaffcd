"""Every block on the CPU (-ngl 0; -ngl 1: only the output layer offloaded), issue 17: every
modelled architecture's layouts held to llama.cpp's own projection. tests/data/cpu_layers_oracle.json
holds `llama-fit-params -fitp on` figures (llama.cpp 0.3.36, one RPC device, sparse full-size layouts
of moeconf/fixtures; -c 32768, -ub 512 and 1024, f16 and q8_0 caches, some with -fa off) per device:
model MiB, context MiB, compute MiB. An architecture is modelled in a case ("host": -ngl 0,
"gpu_output": -ngl 1) only where every recorded line of it is within tolerance (weights and KV
within 1 MiB, compute within max(3%, 16 MiB)); in the others the estimate is refused, and the
refusal is held to be still needed (its figures without the refusal are off)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.memory.support import MODELLED
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.engine.memory_table import _ok

DATA = Path(__file__).parent / "data" / "cpu_layers_oracle.json"
ROWS = json.loads(DATA.read_text())
# the architectures whose figures with layers on the host were recorded here (those an older replay modelled)
ARCHS = frozenset({"qwen3moe", "glm4moe", "deepseek2", "gpt-oss", "llama4", "qwen35moe", "qwen3next",
                   "nemotron_h_moe", "kimi-linear", "minimax-m2", "grok", "glm5-next", "deepseek32", "glm-dsa",
                   "ernie4_5-moe", "bailingmoe2", "dots1", "qwen3vlmoe", "hunyuan-moe"})
MiB = 1024 * 1024
EP = "127.0.0.1:50052"
NAMES = {"CPU": "host", f"RPC0[{EP}]": "RPC0"}
_INV: dict[str, Inventory] = {}


def _case(line: str) -> str:
    return "host" if shlex.split(line)[shlex.split(line).index("-ngl") + 1] == "0" else "gpu_output"


def _arch(model: str) -> str:
    return LAYOUTS[model].arch


@pytest.fixture
def inventories(layout_paths: dict[str, Path]) -> dict[str, Inventory]:
    if not _INV:
        _INV.update({k: load_inventory(layout_paths[k]) for k in sorted({r["model"] for r in ROWS})})
    return _INV


def _estimate(inv: Inventory, line: str) -> MemoryEstimate:
    args = ["--rpc", EP, "-fit", "off", *shlex.split(line)]
    eng = engine("llama.cpp")
    ex = explain(inv, eng, args, gpus=[])
    assert not ex.refusals, ex.refusals
    return estimate_explained(ex, read_settings(args, eng))


def _errors(est: MemoryEstimate, figures: dict[str, list[float]]) -> list[str]:
    bad = []
    ours = {NAMES[d]: (m.weights / MiB, m.kv / MiB, m.compute / MiB) for d, m in est.devices.items()}
    for dev in sorted(set(ours) | set(figures)):
        for term, o, t in zip(("weights", "kv", "compute"), ours.get(dev, (0, 0, 0)), figures.get(dev, (0, 0, 0)),
                              strict=True):
            if not _ok(term, dev, o, t):
                bad.append(f"{dev} {term}: moeconf {o:.2f} MiB, llama.cpp {t}")
    return bad


# Kimi-Linear's lines at -ngl 0 and 1 are recorded with its others (held by tests/test_memory_kda.py)
_KDA = json.loads((DATA.parent / "kda_memory_oracle.json").read_text())
_KDA_ROWS = [{"model": "kimi-linear-48b-a3b", **r} for r in _KDA["rows"] + _KDA["refused_placements"]
             if shlex.split(r["args"])[shlex.split(r["args"]).index("-ngl") + 1] in ("0", "1")]


def test_every_modelled_architecture_is_measured_in_both_cases() -> None:
    measured = {(_arch(r["model"]), _case(r["args"])) for r in ROWS + _KDA_ROWS}
    # (the graph's architectures are measured at -ngl 0 and 1 in tests/data/graph_real_oracle.json, DSA's in
    # tests/engine/figures_dsa.json, GLM-5.3-Flash's in tests/data/glm5next_memory_oracle.json)
    own = set(MODELLED) - ARCHS | {"deepseek32", "glm-dsa", "glm5-next"}
    assert {(a, c) for a in MODELLED if a not in own for c in ("host", "gpu_output")} <= measured
    # every layout of a modelled architecture, at both ubatch sizes
    for key, lay in LAYOUTS.items():
        if lay.arch in MODELLED and lay.arch not in own:
            lines = {r["args"] for r in ROWS + _KDA_ROWS if r["model"] == key}
            assert {"-c 32768 -ngl 0", "-c 32768 -ngl 1 -ub 1024"} <= lines, key


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['model']}:{r['args']}" for r in ROWS])
def test_cpu_layers_match_recorded_engine_figures_or_refuse(inventories: dict[str, Inventory],
                                                           row: dict[str, object]) -> None:
    model, line = str(row["model"]), str(row["args"])
    est = _estimate(inventories[model], line)
    case = _case(line)
    # the engine's graph gives every modelled architecture's compute here (refused before the switch to the
    # graph where the phase model was off; every recorded line exact through it, tests/test_memory_graph.py)
    assert est.complete and _arch(model) in MODELLED, (case, est.notes)
    assert _errors(est, row["engine"]) == []  # type: ignore[arg-type]


def test_a_wrong_gpu_figure_is_caught(inventories: dict[str, Inventory]) -> None:
    """The comparison refuses the output GPU's compute of -ngl 1 off by what Qwen3/gpt-oss/MiniMax
    miss there (n_embd x n_expert_used x ubatch floats: 8 MiB on Ling-mini-2.0 at -ub 512 is inside
    16 MiB, so 4x that) and a KV cache counted on the GPU."""
    line = "-c 32768 -ngl 1"
    row = next(r for r in ROWS if r["model"] == "ling-mini-2.0" and r["args"] == line)
    est = _estimate(inventories["ling-mini-2.0"], line)
    assert _errors(est, row["engine"]) == []
    gpu = f"RPC0[{EP}]"
    m = est.devices[gpu]
    for wrong in (m.__class__(gpu, m.weights, m.kv, m.compute - 32 * MiB),
                  m.__class__(gpu, m.weights, m.kv + 2 * MiB, m.compute)):
        bad = MemoryEstimate({**est.devices, gpu: wrong}, est.settings, est.n_ctx, est.kv_cells, est.swa_cells,
                             est.flash_attn)
        assert _errors(bad, row["engine"]) != []


def test_fill_goes_on_with_every_block_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan whose -ngl puts every block on the CPU: the fill rule is checked through the engine's graph
    and compile goes on (Qwen3.5's -ngl 0 was refused while its compute was the older replay's)."""
    from moeconf.cli import main

    models = Path(__file__).resolve().parent.parent / "examples" / "models"
    for name, ngl in (("qwen3.5-35b-a3b", 0), ("glm-4.5-air", 1), ("glm-4.5-air", 0), ("qwen3-30b-a3b", 1),
                      ("gpt-oss-20b", 0)):
        plan = tmp_path / f"{name}-{ngl}.toml"
        plan.write_text(f'rules = ["experts -> gpu, cpu"]\n[model]\npath = "{models / name}.manifest.json"\n'
                        f'serve_path = "/models/{name}.gguf"\n[engine]\nname = "llama.cpp"\n'
                        f'[flags]\nctx_size = 32768\nn_gpu_layers = {ngl}\n[budget]\ngpu = "24 GiB"\n')
        rc = main(["compile", str(plan)])
        err = capsys.readouterr().err
        assert rc == 0 and "every block" not in err, err
