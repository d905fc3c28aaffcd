"""GLM-5.3-Flash (`glm5-next`): the KDA state per sequence, the MLA latent and the k-pool indexer
cache of the DSA layers, and compute by a node-by-node replay (memory/replay_glm5next.py), held to
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
from moeconf.memory import replay_glm5next as rg
from moeconf.memory.estimate import MemoryEstimate
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
    line = "-c 32768 -ngl 999"
    monkeypatch.setattr(indexer, "KPOOL_ARCHS", frozenset())
    bad = recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    assert ("rpc0", "kv") in [(b[0], b[1]) for b in bad]


def test_the_worst_case_outputs_stay_the_ubatch() -> None:
    """-np 3 rounds the reserve's 512 tokens up to 513 (llama-context.cpp graph_reserve) while the
    outputs stay 512: counted as 513 outputs the GPU's buffer is 0.61 MiB over the engine's."""
    line = "-c 32768 -ngl 999 -ot blk\\.[12][0-9]\\.ffn_.*_exps=CPU -np 3"
    gpu = next(r for r in _rows(line) if r["device"] == "rpc0")
    lay = LAYOUTS[KEY]
    shape = rg.Glm5NextShape(
        n_embd=lay.hidden, n_vocab=lay.vocab, hc=4, n_head=64, kda_head_dim=128, d_conv=4, q_lora_rank=1536,
        kv_lora_rank=512, head_k_mla=256, head_v_mla=256, idx_heads=32, idx_dim=128, idx_top_k=2048, kpool=4,
        select_tail=True, n_expert=288, n_expert_used=8, n_ff_exp=2048, n_ff_shexp=2048,
        n_ff=tuple(12288 if il < 3 else 0 for il in range(45)), recurrent=tuple((il + 1) % 4 != 0 for il in range(45)),
        n_tokens=513, n_kv=11008, n_pool_real=11008 // 4 * 3, n_seqs=3,
        cpu_experts=tuple((10 <= il < 30,) * 3 for il in range(45)), n_outputs=512)
    MiB = 1024 * 1024
    assert rg.glm5next_peaks(shape, 32)[0] / MiB == pytest.approx(float(str(gpu["compute"])), abs=0.01)
    wrong = dataclasses.replace(shape, n_outputs=0)
    assert abs(rg.glm5next_peaks(wrong, 32)[0] / MiB - float(str(gpu["compute"]))) > 0.5


@pytest.mark.parametrize("case", RECORDED["refused_placements"], ids=lambda c: str(c["args"]))
def test_unreplayed_placements_are_refused(inv: Inventory, case: dict[str, object]) -> None:
    """Placements and settings the replay does not cover (the engine's figures recorded beside them)
    leave KV and compute uncomputed with a note naming what is not modelled."""
    est = _estimate(inv, str(case["args"]))
    assert not est.complete
    assert any("not modelled" in n and ("glm5-next" in n) for n in est.notes), est.notes
    assert all(m.kv == 0 and m.compute == 0 for m in est.devices.values())


def test_a_quantized_cache_without_flash_attention_is_refused(inv: Inventory) -> None:
    """llama.cpp refuses a quantized V cache without flash attention (llama_init_from_model)."""
    est = _estimate(inv, "-c 16384 -ngl 999 -fa off -ctk q8_0 -ctv q8_0")
    assert not est.complete and any("flash attention off and a q8_0 K cache" in n for n in est.notes)


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


@pytest.mark.parametrize(("line", "knob"), [
    ("-c 32768 -ngl 40", "fused_post"),  # the unfused HC post and the boundary's view copies
    ("2rpc -c 32768 -ngl 999 -ts 1,1", "copies"),  # pipeline parallelism's pinned input copies
    ("-c 32768 -ngl 999 -fa off", "flash_attn"),  # KQ, its softmax and the latent's copy
    ("-c 32768 -ngl 1", "out_home"),  # the output's GPU after the host's layers
    ("-c 32768 -ngl 999 -nkvo", "kv_host"),  # the caches' reads and writes on the host, views copied
])
def test_each_placement_rule_matters(inv: Inventory, line: str, knob: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replayed without the rule its placement needs (the fused HC post kept on with host layers
    first; one copy of the inputs under pipeline parallelism; flash attention's graph with it off;
    the output on the host with -ngl 1), a device's compute misses the engine's figure."""
    flip = {"fused_post": True, "copies": 1, "flash_attn": True, "out_home": -1, "kv_host": False}
    assert not recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    monkeypatch.setattr(dataclasses, "replace", _replace_then(knob, flip[knob]))
    rg.glm5next_peaks.cache_clear()
    bad = recorded_mismatches(_estimate(inv, line), _rows(line), EPS)
    rg.glm5next_peaks.cache_clear()
    assert any(b[1] == "compute" for b in bad), bad


def _replace_then(knob: str, value: object):  # type: ignore[no-untyped-def]
    """dataclasses.replace that forces `knob` to `value` on the replay's shapes."""
    real = dataclasses.replace

    def replace(obj: object, /, **changes: object) -> object:
        if isinstance(obj, rg.Glm5NextShape):
            changes[knob] = value
        return real(obj, **changes)  # type: ignore[type-var]

    return replace


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


_TWO_EPS = ["127.0.0.1:50941", "127.0.0.1:50942"]


def _fit_two(inv: Inventory, tmp_path: Path, gib: tuple[int, int] = (12, 8)):  # type: ignore[no-untyped-def]
    from moeconf.engines import engine
    from moeconf.fit import Budget, fit

    MiB = 1024 * 1024
    return fit(inv, engine("llama.cpp"), [Budget(f"RPC0[{ep}]", g * 1024 * MiB) for ep, g in zip(_TWO_EPS, gib,
                                                                                                  strict=True)],
               ["--rpc", ",".join(_TWO_EPS), "-c", "32768", "-np", "1"], model_path=str(inv.source),
               plan_dir=str(tmp_path), reserve=1024 * MiB)


def _within(inv: Inventory, argv: list[str], gib: tuple[int, int]) -> bool:
    from moeconf.engines import engine
    from moeconf.explanation import explain
    from moeconf.memory import read_settings
    from moeconf.sizing import estimate_explained

    eng = engine("llama.cpp")
    est = estimate_explained(explain(inv, eng, argv, gpus=[]), read_settings(argv, eng))
    return est.complete and all(est.devices[f"RPC0[{ep}]"].total <= g * 1024**3 for ep, g in zip(_TWO_EPS, gib,
                                                                                                  strict=True))


def _exact_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real = rg.replayed_glm5next
    monkeypatch.setattr(rg, "replayed_glm5next", lambda *a, **kw: real(*a, **{**kw, "approximate": False}))


@pytest.mark.parametrize("gib", [(12, 8), (24, 24)])
def test_two_gpu_fit_ranks_on_the_approximate_replay_and_prints_the_exact_searchs_command(
        inv: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gib: tuple[int, int]) -> None:
    """The two-GPU search ranks its splits on each run's last layers (`approximate`, twice as fast);
    the command it prints is the one the exact search prints, within both budgets."""
    res = _fit_two(inv, tmp_path, gib)
    assert _within(inv, list(res.argv[3:]), gib)
    _exact_only(monkeypatch)
    assert _fit_two(inv, tmp_path, gib).argv == res.argv


def test_an_underrating_approximation_never_prints_a_command_over_budget(
        inv: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong answer: the search's approximate compute a tenth of the truth. The splits it ranks
    best are over once measured exactly: given up (fill._SplitOver), never printed."""
    from moeconf.errors import MoeconfError

    real = rg.replayed_glm5next

    def too_low(*a, **kw):  # type: ignore[no-untyped-def]
        out = real(*a, **kw)
        return {d: v // 10 for d, v in out.items()} if kw.get("approximate") else out

    monkeypatch.setattr(rg, "replayed_glm5next", too_low)
    for gib in ((12, 8), (8, 8)):
        try:
            res = _fit_two(inv, tmp_path, gib)
        except MoeconfError:
            continue
        assert _within(inv, list(res.argv[3:]), gib)


def test_an_overrating_approximation_falls_back_to_the_exact_search(
        inv: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong answer the other way (a TiB too much): no split seems to fit, and the exact search
    decides, printing its command rather than a refusal."""
    with monkeypatch.context() as m:
        _exact_only(m)
        want = _fit_two(inv, tmp_path).argv
    real = rg.replayed_glm5next

    def too_high(*a, **kw):  # type: ignore[no-untyped-def]
        out = real(*a, **kw)
        return {d: v + 2**40 for d, v in out.items()} if kw.get("approximate") else out

    monkeypatch.setattr(rg, "replayed_glm5next", too_high)
    assert _fit_two(inv, tmp_path).argv == want
