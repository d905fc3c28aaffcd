"""GLM-5.3-Flash (`glm5-next`): the KDA state per sequence, the MLA latent and the k-pool indexer
cache of the DSA layers, and compute through the engine's graph (memory/graph/archs/glm5_next.py;
it replaced a hand replay that every figure here was first held to), held to
the figures llama.cpp's own projection (`llama-fit-params -fitp on`, RPC devices) printed for the
sparse full-size layout of GLM-5.3-Flash (tests/data/glm5next_memory_oracle.json; the engine suite
re-measures them: tests/engine/test_memory_oracle.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import moeconf.memory.indexer as indexer
from moeconf.cli import main
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.memory.estimate import MemoryEstimate
from moeconf.memory.graph import model
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from tests.recorded_memory import estimate_line, rpc_args
from tests.recorded_memory import mismatches as recorded_mismatches

DATA = Path(__file__).resolve().parent / "data" / "glm5next_memory_oracle.json"
RECORDED = json.loads(DATA.read_text())
EPS: list[str] = RECORDED["endpoints"]
LINES = sorted({r["args"] for r in RECORDED["rows"]})
KEY = "glm-5.3-flash"


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("glm5next") / f"{KEY}.gguf"
    write_layout(LAYOUTS[KEY], p)
    return p


@pytest.fixture(scope="module")
def inv(path: Path) -> Inventory:
    return load_inventory(path)


def _estimate(inv: Inventory, line: str) -> MemoryEstimate:
    return estimate_line(inv, rpc_args(line, EPS))


def _rows(line: str) -> list[dict[str, object]]:
    return [r for r in RECORDED["rows"] if r["args"] == line]


def test_the_record_covers_the_families() -> None:
    """f16 and q8_0 caches, a long context at -ub 2048, four slots, routed experts on the host
    (all and some layers), every layer on the host, a partial -ngl, two GPUs with and without
    pipeline parallelism, flash attention off, -ngl 1, and at least 3 held-out lines."""
    for fragment in ("-ctk q8_0", "-c 131072", "-np 4", "-ot exps=CPU", "--n-cpu-moe", "-ngl 0", "-ngl 40",
                     "2rpc -c 32768 -ngl 999 -ts 1,1", "-ts 1,1 -ot exps=CPU", "2rpc -c 32768 -ngl 30", "-fa off",
                     "-c 32768 -ngl 1", "-np 4 -kvu", "-nkvo"):
        assert any(fragment in line for line in LINES), fragment
    assert len({r["args"] for r in RECORDED["rows"] if r["held_out"]}) >= 3


@pytest.mark.parametrize("line", LINES)
def test_memory_matches_the_recorded_engine_figures(inv: Inventory, line: str) -> None:
    est = _estimate(inv, line)
    assert est.complete, est.notes
    assert not recorded_mismatches(est, _rows(line), EPS)


def test_the_check_catches_a_wrong_figure(inv: Inventory) -> None:
    """The comparison itself: a recorded compute 0.1 MiB off, a KV 2 MiB off or weights 1.5 MiB
    under moeconf's are reported, on the GPU and on the host."""
    line = "2rpc -c 32768 -ngl 999 -ts 1,1 -ot exps=CPU"
    rows = _rows(line)
    est = _estimate(inv, line)
    assert not recorded_mismatches(est, rows, EPS)
    for row in rows:
        for term, delta in (("compute", 0.1), ("kv", 2), ("weights", -2)):
            wrong = {**row, term: float(str(row[term])) + delta}
            assert [b[1] for b in recorded_mismatches(est, [wrong], EPS)] == [term]


def test_the_indexer_row_is_key_gate_and_pooled(inv: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The k-pool indexer caches 3 x key_length per cell (llama-memory-hybrid-idx.cpp): with the
    DSA indexer's single row the KV would be 176 MiB under the engine's at -c 32768."""
    import importlib

    estimate = importlib.import_module("moeconf.memory.estimate")  # the module (the package exports the function)
    line = "-c 32768 -ngl 999"
    real = indexer.traits  # the DSA indexer's single row of key_length (Traits.indexer "all", not "kpool")
    monkeypatch.setattr(indexer, "traits", lambda arch: dataclasses.replace(real(arch), indexer="all"))
    monkeypatch.setattr(estimate, "checked_compute", lambda *a: ({}, []))  # the graph asserts the row it reads
    bad = recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    assert ("rpc0", "kv") in [(b[0], b[1]) for b in bad]


def test_the_worst_case_outputs_stay_the_ubatch(inv: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """-np 3 rounds the reserve's 512 tokens up to 513 (llama-context.cpp graph_reserve) while the
    outputs stay 512: counted as 513 outputs the GPU's buffer misses the engine's (0.61 MiB over)."""
    line = "-c 32768 -ngl 999 -ot blk\\.[12][0-9]\\.ffn_.*_exps=CPU -np 3"
    assert not recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    real = model.setup_for

    def all_outputs(*a, **kw):  # type: ignore[no-untyped-def]
        s = real(*a, **kw)
        return dataclasses.replace(s, n_outputs=s.n_tokens)

    monkeypatch.setattr(model, "setup_for", all_outputs)
    bad = recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    assert ("rpc0", "compute") in [(b[0], b[1]) for b in bad]


@pytest.mark.parametrize("case", RECORDED["refused_placements"], ids=lambda c: str(c["args"]))
def test_the_placements_the_replay_refused_match_the_engine(inv: Inventory, case: dict[str, object]) -> None:
    """The placements the older replay did not cover (the engine's figures recorded beside them: the
    attention output matrices on the host; host layers with their routed experts on a GPU): through
    the graph every figure is the engine's."""
    line = str(case["args"])
    est = _estimate(inv, line)
    assert est.complete, est.notes
    rows = [{**r, "args": line, "exact": True} for r in case["engine"]]  # type: ignore[attr-defined]
    assert not recorded_mismatches(est, rows, EPS)


def test_a_quantized_cache_without_flash_attention_is_refused(inv: Inventory) -> None:
    """llama.cpp refuses a quantized V cache without flash attention (llama_init_from_model)."""
    est = _estimate(inv, "-c 16384 -ngl 999 -fa off -ctk q8_0 -ctv q8_0")
    assert any("refuses a quantized V cache (q8_0) with flash attention off" in p for p in est.problems)


def test_a_ubatch_that_gathers_the_selection_is_refused(inv: Inventory) -> None:
    """A ubatch of 16 tokens or fewer gathers the selected latents (build_inp_kpool), a form of the graph
    no recorded figure checked: KV cache and compute left out, saying what to do."""
    est = _estimate(inv, "-c 32768 -ngl 999 -ub 16")
    assert not est.complete and any("use -ub 17 or more" in n for n in est.notes), est.notes


@pytest.mark.parametrize(("key", "fragment"), [
    ("kda.gate_lower_bound", "without kda.gate_lower_bound"),
    ("attention.indexer.kpool_select_tail", "without attention.indexer.kpool_select_tail"),
])
def test_a_file_without_what_the_replay_assumes_is_refused(inv: Inventory, key: str, fragment: str) -> None:
    md = inv.metadata
    other = dataclasses.replace(inv, metadata=dataclasses.replace(
        md, arch_keys=tuple(k for k in (md.arch_keys or ()) if k != key)))
    est = _estimate(other, "-c 32768 -ngl 999")
    assert not est.complete and any(fragment in n for n in est.notes)


@pytest.mark.parametrize("key", ["attention.q_lora_rank", "attention.indexer.head_count"])
def test_a_file_without_a_size_the_replay_reads_is_refused(inv: Inventory, key: str) -> None:
    """Without it the replay has no graph to rebuild: refused, never a compute of 0."""
    md = inv.metadata
    attr = {"attention.q_lora_rank": {"q_lora_rank": None}}.get(key, {})
    other = dataclasses.replace(inv, metadata=dataclasses.replace(
        md, hparams=tuple((k, v) for k, v in md.hparams if k != key), **attr))
    est = _estimate(other, "-c 32768 -ngl 999")
    assert not est.complete and any(f"lacks glm5-next.{key}" in n for n in est.notes), est.notes


def test_explain_prints_every_term(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(path), "--json", "--", "-c", "32768", "-ngl", "999", "-ot", "exps=CPU"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_complete"] is True
    assert all(d["kv"] is not None and d["compute"] is not None for d in data["memory"].values())


def test_the_engines_fused_op_probe_matters(inv: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """-ngl 40 (the first layers on the host): the engine's probe finds a host layer's fused HC post run on
    the GPU and turns the fused post off for every layer (llama-context.cpp resolve_fused_ops); kept
    fused, the compute misses the engine's."""
    line = "-c 32768 -ngl 40"
    assert not recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    monkeypatch.setattr(model, "fused_off", lambda *a: frozenset())
    bad = recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    assert any(b[1] == "compute" for b in bad), bad


@pytest.mark.parametrize(("line", "refused"), [
    ("-c 4096 -ngl 999 -ot blk.1.hc_attn_scale=CPU", "DSV4_HC_COMB"),
    ("-c 4096 -ngl 999 -ot blk.1.hc_ffn_base=CPU", ""), ("-c 4096 -ngl 999 -ot exps=CPU", ""), ("-c 4096 -ngl 2", "")])
def test_a_fused_op_turned_off_unchecked_is_refused(inv: Inventory, line: str, refused: str) -> None:
    """The pinned engine (tests/engine/graphdump.cpp's log on the tiny glm5-next model "a", -c 512 -ub 64 -ngl 99)
    turns DSV4_HC_COMB off where a layer's hc_attn_scale
    lies on the host and the layer on a GPU (the fused comb reads it: scheduled on the host), not for its
    hc_ffn_base nor under -ot exps=CPU; -ngl 2 turns the HC post off, whose unfused form the -ngl 2 dumps
    checked. No dump checked the unfused comb: that placement is refused, naming the op; the others are not."""
    est = _estimate(inv, line)
    notes = " ".join(est.notes)
    assert est.complete is not bool(refused), notes
    if refused:
        assert f"llama.cpp turns off its fused {refused} here" in notes and "-fitp on" in notes, notes


def test_an_unchecked_unfused_op_is_refused(inv: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the probe turns off an op whose unfused form no recorded dump checked (fed here: the probe made
    to turn off the HC pre, which no line turns off), `estimate` refuses rather than print the unfused
    graph's figure; the HC post's unfused form (checked) is not refused."""
    line = "-c 32768 -ngl 40"
    monkeypatch.setattr(model, "fused_off", lambda *a: frozenset({"DSV4_HC_PRE", "DSV4_HC_POST"}))
    est = _estimate(inv, line)
    assert not est.complete
    assert "llama.cpp turns off its fused DSV4_HC_PRE here" in " ".join(est.notes), est.notes
    monkeypatch.setattr(model, "fused_off", lambda *a: frozenset({"DSV4_HC_POST"}))
    assert _estimate(inv, line).complete


def test_the_sizing_reserve_drops_the_host_attention_pin(inv: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """-nkvo without flash attention: the graph build pins each attention's output to the host, but the
    sizing reserve (ggml_backend_sched_reserve_size) resets the scheduler first, dropping the pin; kept,
    the host's compute is 47 MiB over the engine's."""
    line = "-c 32768 -ngl 999 -nkvo -fa off"
    assert not recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    real = model.setup_for

    def pinned(*a, **kw):  # type: ignore[no-untyped-def]
        return dataclasses.replace(real(*a, **kw), norm_pins=True)

    monkeypatch.setattr(model, "setup_for", pinned)
    bad = recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    assert ("host", "compute") in [(b[0], b[1]) for b in bad], bad


@pytest.mark.parametrize("slots", [["-np", "1"], []])
def test_fit_places_glm5next_within_its_budgets(inv: Inventory, tmp_path: Path, slots: list[str]) -> None:
    """`moeconf fit` works for GLM-5.3-Flash (refused before): one 16 GiB GPU and 12 + 8 GiB at 32k,
    with one sequence or llama-server's 4 unified slots, each command's memory complete and within
    its budgets by moeconf's count (the engine measures them: with -np 1 14,758 MiB, and 11,211 +
    7,042 MiB, + 1 GiB reserve each, tests/engine/test_fit_oracle.py; with 4 unified slots 15,317,
    and 10,917 + 6,737 MiB, by tests/engine/fit_print_kvu.cpp)."""
    from moeconf.engines import engine
    from moeconf.explanation import explain
    from moeconf.fit import Budget, fit
    from moeconf.memory import read_settings
    from moeconf.sizing import estimate_explained

    MiB = 1024 * 1024
    eps = ["127.0.0.1:50931", "127.0.0.1:50932"]
    for gib in ([16], [12, 8]):
        budgets = [Budget(f"RPC0[{ep}]", g * 1024 * MiB) for ep, g in zip(eps, gib, strict=False)]
        res = fit(inv, engine("llama.cpp"), budgets, ["--rpc", ",".join(eps[:len(gib)]), "-c", "32768", *slots],
                  model_path=str(inv.source), plan_dir=str(tmp_path), reserve=1024 * MiB)
        argv = list(res.argv[3:]) + ([] if slots else ["-np", "4", "-kvu"])  # llama-server's default slots
        eng = engine("llama.cpp")
        est = estimate_explained(explain(inv, eng, argv, gpus=[]), read_settings(argv, eng))
        assert est.complete, est.notes
        for b in budgets:
            assert est.devices[b.device].total <= b.size
