"""llama-server's output reservation (engines/settings.py server_outputs): since llama.cpp b9474 the
context reserves its worst-case graph for min(ubatch, n_outputs_max) output rows, and llama-server
sets n_outputs_max to its slots (min(n_batch, n_parallel * (1 + draft))), so the logits and the last
layer's rows after `out_ids` are that much smaller on the output device. The figures are the
engine's own, measured by tests/engine/outputs.cpp (the model loaded with no_alloc, the context
created as llama-server creates it) on sparse full-size layouts with RPC devices, recorded in
tests/data/server_outputs_oracle.json (the engine suite re-measures them:
tests/engine/test_server_outputs.py). Every row is of an architecture whose compute the engine's graph
gives, and is held exact (to 1 KiB), whatever `kind` the probe recorded it with then (`bound`: the
full-ubatch figure with a note; `phase`: a figure of moeconf's former model)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.engines.settings import MemorySettings, server_outputs
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.memory.support import MODELLED
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.recorded_memory import device_name, rpc_args

DATA = Path(__file__).resolve().parent / "data" / "server_outputs_oracle.json"
MiB = 1024 * 1024
EXACT = 1024  # bytes: what an `exact` row may be off (the replays give the engine's figure to the byte)

_SPLIT = r"-ot blk\.(1[0-9]|[2-4][0-9])\.ffn_.*_exps=CPU,blk\.9\.ffn_down_exps=CPU"
# two GPUs, the second's layers after a layer whose experts are on the CPU (a bound: not replayed), or not
_TWO_CPU_AT_BOUNDARY = r"2rpc -c 32768 -ngl 999 -ts 1,1 -ot blk\.(2[0-9]|3[0-9]|4[0-9])\.ffn_.*_exps=CPU"
_TWO_GPU_AT_BOUNDARY = r"2rpc -c 32768 -ngl 999 -ts 1,1 -ot blk\.(3[0-9]|4[0-9]|5[0-9]|6[0-9])\.ffn_.*_exps=CPU"
_NP3 = "-c 32768 -ngl 999 -ub 1024 -np 3 -kvu -ot exps=CPU"
# the lines measured (as llama-server runs them: 4 slots by default); `2rpc` = two RPC devices
LINES: list[tuple[str, str]] = [
    *(("qwen3-30b-a3b", line) for line in (
        "-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU", "-c 32768 -ngl 999 -ub 2048",
        "-c 32768 -ngl 999 -np 1", "-c 32768 -ngl 999 -np 8 -ub 1024", f"-c 32768 -ngl 999 {_SPLIT}",
        r"-c 32768 -ngl 999 -ot blk\.(4[0-9])\.ffn_.*_exps=CPU,blk\.39\.ffn_(gate|up)_exps=CPU",
        "-c 32768 -ngl 999 --embedding", "-c 32768 -ngl 999 --pooling mean", "-c 32768 -ngl 30",
        "2rpc -c 32768 -ngl 999 -ts 1,1", _TWO_CPU_AT_BOUNDARY, _TWO_GPU_AT_BOUNDARY)),
    *(("glm-4.5-air", line) for line in (
        "-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU -ctk q8_0 -ctv q8_0", "-c 32768 -ngl 999 -ub 2048",
        f"-c 32768 -ngl 999 {_SPLIT}")),
    *(("minimax-m2", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU",
                                        _TWO_CPU_AT_BOUNDARY)),
    *(("llama-4-maverick", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ub 2048",
                                              "-c 32768 -ngl 999 -ot exps=CPU")),
    *(("gpt-oss-20b", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU")),
    *(("deepseek-v3", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU")),
    *(("qwen3.5-35b-a3b", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU",
                                             "-c 32768 -ngl 999 -ub 2048",
                                             "2rpc -c 32768 -ngl 999 -ts 1,1 -ot exps=CPU")),
    *(("nemotron-3-nano-30b-a3b", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU",
                                                     "-c 32768 -ngl 999 -ub 2048",
                                                     "2rpc -c 32768 -ngl 999 -ts 1,1 -ot exps=CPU")),
    *(("kimi-linear-48b-a3b", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU",
                                                 "2rpc -c 32768 -ngl 999 -ts 1,1 -ot exps=CPU")),
    *(("deepseek-v3.2", line) for line in ("-c 32768 -ngl 999", "-c 32768 -ngl 999 -ot exps=CPU")),
    # -np 3 in one cache: the ubatch's 1024 tokens rounded up to 1026 (three equal sequences), 3 outputs
    *((m, _NP3) for m in ("qwen3-30b-a3b", "glm-4.5-air", "qwen3.5-35b-a3b", "kimi-linear-48b-a3b")),
    # -np 2 without -kvu: two KV streams; a partial -ngl: the CPU runs the first layers
    *((m, "-c 32768 -ngl 999 -np 2") for m in ("qwen3.5-35b-a3b", "nemotron-3-nano-30b-a3b", "glm-4.5-air")),
    *((m, "-c 32768 -ngl 20") for m in ("qwen3.5-35b-a3b", "nemotron-3-nano-30b-a3b", "kimi-linear-48b-a3b",
                                        "glm-4.5-air", "llama-4-maverick")),
]
RECORDED = json.loads(DATA.read_text()) if DATA.exists() else {"endpoints": [], "rows": []}
EPS: list[str] = RECORDED["endpoints"]
NOTE = "reserves {n} output rows"


def server_estimate(inv: Inventory, line: str, eps: list[str], settings: MemorySettings | None = None,
                    ) -> MemoryEstimate:
    """The estimate for a recorded line run by llama-server (`settings` in place of the line's)."""
    argv = rpc_args(line, eps)
    e = engine("llama.cpp")
    s = settings or read_settings(argv, e, binary="llama-server")
    return estimate_explained(explain(inv, e, argv, gpus=[]), s)


def row_problems(est: MemoryEstimate, rows: list[Mapping[str, object]], eps: list[str]) -> list[str]:
    """What of the recorded rows the estimate misses (see the module's docstring)."""
    bad = []
    for r in rows:
        dev = device_name(str(r["device"]), eps)
        m = est.devices[dev]
        theirs = int(str(r["compute"]))
        noted = any(NOTE.format(n=r["outputs"]) in n and dev in n for n in est.notes)
        # the host's weights: the probe's Host row counts host buffer types only (not CPU_REPACK,
        # where llama.cpp repacks CPU weights); tests/data/*_oracle.json hold them from llama-fit-params
        for term in ("weights", "kv") if r["device"] != "host" else ("kv",):
            if abs(getattr(m, term) - int(str(r[term]))) >= MiB:
                bad.append(f"{r['device']} {term}: {getattr(m, term)} vs {r[term]}")
        # the engine's graph counts the server's rows exactly: rows recorded as upper bounds (or figures of
        # moeconf's former model) are held to the engine's figure, and a note that the figure is the whole
        # ubatch's is refused
        if LAYOUTS[str(r["model"])].arch not in MODELLED:
            bad.append(f"{r['model']}: compute not modelled")
        elif abs(m.compute - theirs) > EXACT or noted:
            bad.append(f"{r['device']} compute: {m.compute / MiB:.4f} vs the engine's {theirs / MiB:.4f} MiB")
    return bad


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("outputs")
    out = {}
    for key in sorted({m for m, _ in LINES}):
        write_layout(LAYOUTS[key], folder / f"{key}.gguf")
        out[key] = load_inventory(folder / f"{key}.gguf")
    return out


def _rows(model: str, line: str) -> list[Mapping[str, object]]:
    return [r for r in RECORDED["rows"] if r["model"] == model and r["args"] == line]


def test_every_line_is_recorded() -> None:
    assert {(r["model"], r["args"]) for r in RECORDED["rows"]} == set(LINES)


@pytest.mark.parametrize(("model", "line"), LINES, ids=[f"{m}:{line}" for m, line in LINES])
def test_server_memory_matches_the_engines(layouts: dict[str, Inventory], model: str, line: str) -> None:
    rows = _rows(model, line)
    est = server_estimate(layouts[model], line, EPS)
    assert est.complete, est.notes
    # the output rows moeconf reads off the line are the engine's (0: n_batch, as the engine's n_outputs_max)
    argv = rpc_args(line, EPS)
    s = read_settings(argv, engine("llama.cpp"), binary="llama-server")
    assert {r["outputs"] for r in rows} == {s.n_outputs or s.n_batch}
    assert not row_problems(est, rows, EPS)


def test_the_exact_rows_cover_the_architectures_asked_for() -> None:
    exact = {LAYOUTS[str(r["model"])].arch for r in RECORDED["rows"]
             if r["kind"] == "exact" and r["device"] != "host" and int(str(r["outputs"])) < 512}
    assert {"qwen3moe", "glm4moe", "llama4", "minimax-m2", "qwen35moe", "nemotron_h_moe", "kimi-linear"} <= exact


def test_the_full_ubatch_figure_is_refused_for_a_server_line(layouts: dict[str, Inventory]) -> None:
    # the old model (every binary's graph outputs the whole ubatch) on llama-server lines: the output
    # device's compute is hundreds of MiB over the engine's, which the recorded rows catch
    for model, line in (("qwen3-30b-a3b", "-c 32768 -ngl 999"), ("nemotron-3-nano-30b-a3b", "-c 32768 -ngl 999"),
                        ("qwen3.5-35b-a3b", "-c 32768 -ngl 999 -ot exps=CPU")):
        s = read_settings(rpc_args(line, EPS), engine("llama.cpp"), binary="llama-server")
        old = server_estimate(layouts[model], line, EPS, dataclasses.replace(s, n_outputs=0))
        assert any("compute" in p for p in row_problems(old, _rows(model, line), EPS)), model
    # the rows recorded as bounds are held exact now (every one's compute comes from the engine's graph):
    # such a row with the note that its figure is the whole ubatch's is refused
    line = "-c 32768 -ngl 999 -np 2"
    est, rows = server_estimate(layouts["glm-4.5-air"], line, EPS), _rows("glm-4.5-air", line)
    assert row_problems(est, rows, EPS) == []
    dev = device_name(str(rows[0]["device"]), EPS)
    noted = dataclasses.replace(est, notes=(*est.notes, f"{NOTE.format(n=rows[0]['outputs'])} on {dev}"))
    assert row_problems(noted, rows, EPS)


def test_server_outputs_reads_the_binary_slots_batch_and_embedding() -> None:
    e = engine("llama.cpp")

    def outputs(*words: str, env: dict[str, str] | None = None, build: str | None = None) -> int:
        eng = engine("llama.cpp", build) if build else e
        return read_settings(list(words), eng, env).n_outputs

    assert outputs("llama-server", "-c", "4096") == 4  # -np auto: 4 slots
    assert outputs("llama-server", "-np", "2") == 2
    assert outputs("llama-server", "-np", "8", "-b", "4") == 4  # min(n_batch, slots)
    assert outputs("llama-cli", "-np", "2") == 0 and outputs("-c", "4096") == 0  # other binaries: n_batch
    assert outputs("llama-server", "--embedding") == 0 and outputs("llama-server", "--rerank") == 0
    assert outputs("llama-server", "--pooling", "mean") == 0 and outputs("llama-server", "--pooling", "none") == 4
    assert outputs("llama-server", env={"LLAMA_ARG_EMBEDDINGS": "1"}) == 0
    assert outputs("llama-server", build="b9473") == 0 and outputs("llama-server", build="b9474") == 4
    assert read_settings(["llama-server"], engine("ik_llama.cpp")).n_outputs == 0  # ik outputs the ubatch
    assert server_outputs("llama-server", e, 2048, 3, False) == 3
    assert server_outputs("llama-server", e, 2048, 3, True) == 0


def test_an_estimate_with_fewer_outputs_than_sequences_keeps_a_row_per_sequence(layouts: dict[str, Inventory],
                                                                                ) -> None:
    # -np 8 -b 4: the server reserves 4 outputs, the token-generation graph has 8 rows: counted for 8
    line = "-c 32768 -ngl 999 -np 8"
    argv = rpc_args(line, EPS)
    s = read_settings(argv, engine("llama.cpp"), binary="llama-server")
    four = server_estimate(layouts["qwen3-30b-a3b"], line, EPS, dataclasses.replace(s, n_outputs=4))
    eight = server_estimate(layouts["qwen3-30b-a3b"], line, EPS, dataclasses.replace(s, n_outputs=8))
    gpu = device_name("rpc0", EPS)
    assert four.devices[gpu].compute == eight.devices[gpu].compute


