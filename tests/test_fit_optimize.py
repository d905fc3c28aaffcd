"""`fit --optimize` (moeconf/optimize.py): every row of the trade-off table is what a separate `fit`
with the same -ub (and -b, cache types) gives, with that command's traffic; the choice follows the
goal's rule, on predicted speeds (a fake predictor here) or on the traffic; refusals say why; and
fit without --optimize is unchanged."""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.engines.settings import MemorySettings
from moeconf.errors import MoeconfError
from moeconf.fit import Budget, fit
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.optimize import (
    BALANCED_WITHIN,
    GOALS,
    UBATCHES,
    Goal,
    NotPredicted,
    Optimized,
    Predictor,
    Speed,
    cache_type_list,
    choose,
    optimize,
)
from moeconf.placement import Placement
from moeconf.report.optimize import render_optimized
from moeconf.speed import rounded
from moeconf.traffic import Traffic, traffic
from tests.conftest import REPO

QWEN = str(REPO / "examples/models/qwen3-30b-a3b.manifest.json")
GPT_OSS = str(REPO / "examples/models/gpt-oss-20b.manifest.json")
GiB = 2**30

# (model, budgets, the command's flags, cache types to try)
CASES: list[tuple[str, dict[str, int], list[str], list[str] | None]] = [
    (QWEN, {"CUDA0": 8 * GiB}, ["-c", "16384"], ["f16", "q8_0"]),
    (GPT_OSS, {"CUDA0": 8 * GiB}, ["-c", "32768", "-t", "8"], None),
    (QWEN, {"CUDA0": 6 * GiB, "CUDA1": 6 * GiB}, ["-c", "8192", "-b", "1024"], None),
]


@cache
def _inv(path: str) -> Inventory:
    return load_inventory(path)


def _budgets(b: dict[str, int]) -> list[Budget]:
    return [Budget(d, n) for d, n in b.items()]


@cache
def _optimized(case: int, goal: Goal = "generation") -> Optimized:
    path, budgets, argv, types = CASES[case]
    return optimize(_inv(path), engine("llama.cpp"), _budgets(budgets), argv, goal, cache_types=types,
                    model_path=path, plan_dir=str(REPO))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_each_row_is_a_separate_fit_with_that_setting(case: int) -> None:
    path, budgets, argv, types = CASES[case]
    opt = _optimized(case)
    user_b = int(argv[argv.index("-b") + 1]) if "-b" in argv else 2048
    # every -ub of the grid, -b raised to it where the command's is smaller, each cache type
    assert [(r.setting.ubatch, r.setting.cache_type_k) for r in opt.rows] == [
        (ub, t) for ub in UBATCHES for t in ([*types] if types else [None])]
    assert opt.rows, "nothing to compare"
    for r in opt.rows:
        ub = r.setting.ubatch
        flags = ["-ub", str(ub)] + (["-b", str(ub)] if ub > user_b else [])
        if r.setting.cache_type_k is not None:
            flags += ["-ctk", r.setting.cache_type_k, "-ctv", r.setting.cache_type_v or ""]
        alone = fit(_inv(path), engine("llama.cpp"), _budgets(budgets), [*argv, *flags], model_path=path,
                    plan_dir=str(REPO))
        assert r.result is not None, r.why
        assert r.result.argv == alone.argv
        assert r.batch == max(ub, user_b)
        assert r.result.gpu_expert_layers == alone.gpu_expert_layers
        assert r.result.split_layers == alone.split_layers
        assert r.gpu_memory() == {d: alone.memory.devices[d].total for d in budgets}
        devices = alone.compiled.placement.devices
        assert r.experts_on_gpus() == sum(t.nbytes for t in _inv(path).tensors
                                          if t.group == "experts" and devices[t.name] not in (None, "CPU"))
        tr = traffic(alone.compiled.placement, alone.memory.settings)
        assert r.traffic is not None and r.traffic.json() == tr.json()
        assert r.host_bytes_per_token == tr.reads["CPU"].total
        assert r.pcie_bytes_per_ubatch == tr.link_bytes(tr.ubatch_copies, "pcie")
        assert tr.n_ubatch == ub and r.pcie_bytes_per_prompt_token == tr.link_bytes(tr.ubatch_copies, "pcie") / ub
        assert isinstance(r.speed, NotPredicted)


def test_the_context_caps_the_ubatch() -> None:
    """At -c 1024, -ub 2048 and 4096 are -ub 1024 again (the engine takes at most -c tokens a batch)."""
    opt = optimize(_inv(QWEN), engine("llama.cpp"), _budgets({"CUDA0": 8 * GiB}), ["-c", "1024"], "prompt",
                   model_path=QWEN, plan_dir=str(REPO))
    assert [r.setting.ubatch for r in opt.rows] == [512, 1024]
    assert len(opt.notes) == 2 and all("the same as -ub 1024 at -c 1024" in n for n in opt.notes)


def test_the_commands_own_ubatch_is_a_row() -> None:
    opt = _with(["-c", "16384", "-ub", "256"], "prompt")
    assert [r.setting.ubatch for r in opt.rows] == [256, *UBATCHES]


def _with(argv: list[str], goal: Goal, predictor: Predictor | None = None) -> Optimized:
    return optimize(_inv(QWEN), engine("llama.cpp"), _budgets({"CUDA0": 8 * GiB}), argv, goal,
                    predictor=predictor, model_path=QWEN, plan_dir=str(REPO))


# a fake speed model, by -ub: generation falls and prompt speed rises with the batch
GEN = {512: 30.0, 1024: 29.0, 2048: 27.5, 4096: 20.0}
PROMPT = {512: 500.0, 1024: 900.0, 2048: 1200.0, 4096: 1500.0}


def _fake(gen: dict[int, float], prompt: dict[int, float], refuse: frozenset[int] = frozenset()) -> Predictor:
    def predict(placement: Placement, settings: MemorySettings, tr: Traffic) -> Speed | NotPredicted:
        if settings.n_ubatch in refuse:
            return NotPredicted("the machine lacks host: memory_bandwidth (give --host-bandwidth)")
        return Speed(prompt[settings.n_ubatch], gen[settings.n_ubatch], 0.2, 0.1, ("fake",))
    return predict


def test_the_choice_on_predicted_speeds() -> None:
    opt = _with(["-c", "16384"], "balanced", _fake(GEN, PROMPT))
    assert opt.by_prediction and opt.chosen is not None
    assert opt.result is opt.rows[opt.chosen].result
    # balanced: the best prompt speed among those within 10% of the best generation speed
    near = [ub for ub in UBATCHES if GEN[ub] >= max(GEN.values()) * (1 - BALANCED_WITHIN)]
    assert near == [512, 1024, 2048]
    wants: tuple[tuple[Goal, int], ...] = (("generation", 512), ("prompt", 4096), ("balanced", 2048))
    for goal, want in wants:
        chosen, by_prediction, why = choose(opt.rows, goal)
        assert by_prediction and why is None and chosen is not None
        assert opt.rows[chosen].setting.ubatch == want, goal


def test_ties_go_to_the_smaller_ubatch() -> None:
    flat = dict.fromkeys(UBATCHES, 25.0)
    opt = _with(["-c", "16384"], "generation", _fake(flat, flat))
    for goal in GOALS:
        assert choose(opt.rows, goal)[0] == 0, goal


def test_the_choice_on_traffic_without_predictions() -> None:
    rows = _optimized(0, "balanced").rows
    for goal in GOALS:
        chosen, by_prediction, _why = choose(rows, goal)
        assert not by_prediction and chosen is not None
        opt = Optimized(goal, rows, chosen, by_prediction, None)
        host = [r.host_bytes_per_token or 0 for r in opt.rows]
        pcie = [r.pcie_bytes_per_prompt_token or 0.0 for r in opt.rows]
        if goal == "generation":
            want = host.index(min(host))
        elif goal == "prompt":
            want = pcie.index(min(pcie))
        else:
            near = [i for i, h in enumerate(host) if h <= min(host) * (1 + BALANCED_WITHIN)]
            want = min(near, key=lambda i: (pcie[i], i))
        assert opt.chosen == want, goal
    # the traffic decides differently by goal here: the table is a trade-off
    assert choose(rows, "generation")[0] != choose(rows, "prompt")[0]


def test_a_setting_the_predictor_refuses_means_the_traffic_decides() -> None:
    opt = _with(["-c", "16384"], "generation", _fake(GEN, PROMPT, refuse=frozenset({4096})))
    assert not opt.by_prediction
    host = [r.host_bytes_per_token or 0 for r in opt.rows]
    assert opt.chosen == host.index(min(host))
    text = render_optimized(opt)
    assert ("prompt and gen t/s not predicted for -ub 4096 -b 4096: the machine lacks host: memory_bandwidth "
            "(give --host-bandwidth)") in text
    assert "the least host bytes read per generated token" in text
    # the predicted rows show their speeds, rounded to what the error allows
    assert "1,200 +-20%" in text and "28 +-10%" in text


def test_no_predictions_say_why_in_the_table() -> None:
    text = render_optimized(_optimized(0, "balanced"))
    assert "prompt and gen t/s not predicted: no machine described" in text
    for line in text.splitlines()[2:10]:
        assert line.split()[-2:] == ["-", "-"], line  # no number in the speed columns


def test_rounded_keeps_the_digits_the_error_allows() -> None:
    assert rounded(14.9, 0.3) == "15"
    assert rounded(933, 0.3) == "900"
    assert rounded(1.234, 0.01) == "1.23"
    assert rounded(197.4, 0.05) == "197"


def test_traffic_unmodelled_and_no_prediction_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fit", GPT_OSS, "--gpu", "8GiB", "--engine", "ik_llama.cpp", "--optimize", "generation",
               "-c", "32768"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert "traffic and t/s not given: traffic is modelled for llama.cpp only" in err
    assert "error: --optimize generation reads each setting's predicted speed, or its traffic" in err
    assert "--engine llama.cpp" in err


def test_a_refused_setting_is_a_row_and_nothing_fitting_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fit", GPT_OSS, "--gpu", "4GiB", "--optimize", "prompt", "--cache-types", "q8_0,f16", "-c", "32768",
               "-fa", "off"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert "refused: -ub 512 -ctk q8_0 -ctv q8_0: llama.cpp would refuse this command: llama.cpp refuses a " \
           "quantized V cache (q8_0) with flash attention off" in err
    assert "does not fit: -ub 512 -ctk f16 -ctv f16: CUDA0 needs" in err
    assert "error: no setting fits the budgets; at -ub 512 -ctk f16 -ctv f16: does not fit:" in err


def test_a_refused_setting_beside_fitting_ones() -> None:
    opt = optimize(_inv(QWEN), engine("llama.cpp"), _budgets({"CUDA0": 8 * GiB}), ["-c", "16384", "-fa", "off"],
                   "generation", cache_types=["q8_0", "f16"], model_path=QWEN, plan_dir=str(REPO))
    assert [r.refused for r in opt.rows] == [True, False] * 4
    assert opt.chosen is not None and opt.rows[opt.chosen].setting.cache_type_k == "f16"


@pytest.mark.parametrize(("argv", "message"), [
    (["--cache-types", "q8_0,q3_k"], "--cache-types: llama.cpp does not accept cache type 'q3_k'"),
    (["--cache-types", "f16,,q8_0"], "--cache-types 'f16,,q8_0': a comma-separated list"),
    (["-c", "abc"], "-c needs a number, not 'abc'"),
])
def test_bad_input_is_one_clear_error(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", QWEN, "--gpu", "8GiB", "--optimize", "balanced", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.count("error:") == 1, err


def test_cache_types_need_optimize(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", QWEN, "--gpu", "8GiB", "--cache-types", "q8_0"]) == 2
    assert "--cache-types is for --optimize" in capsys.readouterr().err


def test_the_chosen_command_is_printed_as_fit_prints(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    args = ["fit", "examples/models/qwen3-30b-a3b.manifest.json", "--gpu", "8GiB", "--optimize", "balanced",
            "--cache-types", "f16,q8_0", "-c", "16384", "--no-detect"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    opt = _optimized(0, "balanced")
    assert out == shlex.join(opt.result.argv) + "\n"
    assert "trade-off (--optimize balanced)" in err and "routed experts on the GPUs:" in err
    assert main([*args, "-q"]) == 0
    assert capsys.readouterr() == (out, "")
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["argv"] == list(opt.result.argv)
    assert data["optimize"]["chosen"] == opt.chosen and len(data["optimize"]["rows"]) == 8
    row = data["optimize"]["rows"][opt.chosen]
    assert row["argv"] == data["argv"] and row["traffic"]["prompt"]["n_ubatch"] == row["ubatch"]
    assert data["optimize"]["by"] == "traffic"
    assert row["speed"]["not_predicted"].startswith("the machine description lacks host: memory_bandwidth, CUDA0: ")


def test_without_optimize_fit_is_unchanged(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    path = "examples/models/qwen3-30b-a3b.manifest.json"
    assert main(["fit", path, "--gpu", "8GiB", "-c", "16384", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    alone = fit(path, "llama.cpp", {"CUDA0": "8GiB"}, ["-c", "16384"], plan_dir=str(REPO))
    assert "optimize" not in data and data == json.loads(json.dumps(alone.json()))
    assert main(["fit", path, "--gpu", "8GiB", "-c", "16384"]) == 0
    out, err = capsys.readouterr()
    assert out == shlex.join(alone.argv) + "\n" and "trade-off" not in err
    assert "-ub" not in alone.argv


def test_choose_with_nothing_fitting_names_the_first_setting_the_engine_takes() -> None:
    from moeconf.optimize import Row, Setting

    rows = [Row(Setting(512, 2048, False, "q8_0", "q8_0"), None, "refused because", refused=True),
            Row(Setting(512, 2048, False, "f16", "f16"), None, "does not fit: CUDA0 needs more")]
    chosen, by_prediction, why = choose(rows, "balanced")
    assert chosen is None and not by_prediction
    assert why == "no setting fits the budgets; at -ub 512 -ctk f16 -ctv f16: does not fit: CUDA0 needs more"


def test_the_chosen_plan_compiles_to_the_chosen_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.toml"
    assert main(["fit", QWEN, "--gpu", "8GiB", "--optimize", "prompt", "-c", "16384", "-o", str(plan), "-q"]) == 0
    chosen = capsys.readouterr().out
    assert "-ub 4096" in chosen and "-b 4096" in chosen
    assert main(["compile", str(plan)]) == 0
    assert capsys.readouterr().out == chosen


def test_optimize_solves_one_model_not_a_repos_quants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "unsloth/Qwen3-30B-A3B-GGUF", "--gpu", "8GiB", "--optimize", "prompt"]) == 2
    assert "--optimize solves one model: give the quant (OWNER/REPO:TAG)" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_speed_without_a_positive_error_or_value_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="a predicted speed needs a positive generation_error"):
        Speed(900.0, 15.0, 0.3, bad)
    with pytest.raises(ValueError, match="a predicted speed needs a positive prompt_tps"):
        Speed(bad, 15.0, 0.3, 0.3)


def test_predictions_that_print_alike_tie_to_the_smaller_ubatch() -> None:
    # prompt +-20 %: 1,210 and 1,190 both print as 1,200; generation +-10 %: 30.4 and 29.6 both as 30
    close_gen = {512: 29.6, 1024: 30.4, 2048: 30.0, 4096: 29.8}
    close_prompt = {512: 1190.0, 1024: 1210.0, 2048: 1205.0, 4096: 1195.0}
    for goal in GOALS:
        opt = _with(["-c", "16384"], goal, _fake(close_gen, close_prompt))
        assert opt.by_prediction and opt.rows[opt.chosen].setting.ubatch == 512, goal
    # a difference that prints is still taken
    opt = _with(["-c", "16384"], "prompt", _fake(close_gen, {**close_prompt, 2048: 1500.0}))
    assert opt.rows[opt.chosen].setting.ubatch == 2048


def test_cache_types_are_read_as_the_engine_reads_ctk() -> None:
    """Each type as the engine reads -ctk (engines/settings.read_cache_type): as written, ik's q8_KV on ik only
    (ik's kv_cache_type_from_str compares the word exactly: `q8_kv` stops it)."""
    assert cache_type_list("q8_KV,f16", engine("ik_llama.cpp")) == ["q8_KV", "f16"]
    for text, eng in (("q8_KV", "llama.cpp"), ("Q8_0", "ik_llama.cpp"), ("Q8_0", "llama.cpp"),
                      ("q8_kv", "ik_llama.cpp"), ("Q8_KV", "ik_llama.cpp")):
        with pytest.raises(MoeconfError, match=f"does not accept cache type '{text}'"):
            cache_type_list(text, engine(eng))
