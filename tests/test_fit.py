"""`moeconf fit`: budgets respected by the memory model, layers filled in policy order, the
verification step catching a solver that over-fills, and clear errors when nothing fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf import fit as fit_mod
from moeconf.cli import main
from moeconf.engines import engine
from moeconf.errors import MoeconfError
from moeconf.fit import Budget, FitError, fit
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
GiB = 1024**3
MiB = 1024**2


@pytest.fixture(autouse=True)
def _every_printed_command_is_one_explain_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18: each command a test here gets from fit is run through explain (its own
    simulation and memory settings) and fails the test on any refusal."""
    from moeconf.explanation import explain
    from moeconf.memory import read_settings
    from moeconf.sizing import estimate_explained

    solve = fit_mod._Solver.solve

    def checked(self: fit_mod._Solver) -> fit_mod.FitResult:
        r = solve(self)
        ex = explain(self.inv, self.eng, list(r.argv), gpus=self.gpus)
        est = estimate_explained(ex, read_settings(list(r.argv), self.eng))
        assert not ex.refusals and not est.problems, (r.argv, ex.refusals, est.problems)
        return r

    monkeypatch.setattr(fit_mod._Solver, "solve", checked)


@pytest.fixture(scope="module")
def qwen() -> Inventory:
    return load_inventory(MODELS / "qwen3-30b-a3b.manifest.json")


def _fit(inv: Inventory, budgets: list[Budget], argv: list[str], tmp: Path, **kw: object) -> fit_mod.FitResult:
    return fit(inv, engine("llama.cpp"), budgets, argv, model_path=str(inv.source), plan_dir=str(tmp),
               reserve=GiB, **kw)  # type: ignore[arg-type]


def test_everything_fits_on_a_big_card(qwen: Inventory, tmp_path: Path) -> None:
    r = _fit(qwen, [Budget("CUDA0", 24 * GiB)], ["-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0"], tmp_path)
    assert r.gpu_expert_layers["CUDA0"] == list(range(48)) and r.ot == ""
    assert r.memory.devices["CUDA0"].total <= 24 * GiB
    assert "-c" in r.argv and "32768" in r.argv  # the context is the user's


@pytest.mark.parametrize("policy", ["first", "last"])
def test_fill_policy_takes_contiguous_layers(qwen: Inventory, tmp_path: Path, policy: str) -> None:
    r = _fit(qwen, [Budget("CUDA0", 12 * GiB)], ["-c", "32768"], tmp_path, policy=policy, split=False)
    layers = r.gpu_expert_layers["CUDA0"]
    assert 0 < len(layers) < 48
    assert layers == (list(range(len(layers))) if policy == "first" else list(range(48 - len(layers), 48)))
    assert r.memory.devices["CUDA0"].total <= 12 * GiB
    # one more whole layer would not fit
    more = r.memory.devices["CUDA0"].total + sum(
        t.nbytes for t in qwen.tensors if t.layer == (layers[-1] + 1 if policy == "first" else layers[0] - 1)
        and t.group == "experts")
    assert more > 12 * GiB


def test_split_layer_uses_the_remainder(qwen: Inventory, tmp_path: Path) -> None:
    # 12 GiB less 128 MiB: at 12 GiB, llama-server's 4 output rows (engines/settings.py server_outputs)
    # leave room for a 19th whole layer and 37 MiB, less than any expert tensor of the 20th
    budget = 12 * GiB - 128 * MiB
    whole = _fit(qwen, [Budget("CUDA0", budget)], ["-c", "32768"], tmp_path, split=False)
    split = _fit(qwen, [Budget("CUDA0", budget)], ["-c", "32768"], tmp_path)
    assert split.split_layers and split.split_layers[0][0] == whole.gpu_expert_layers["CUDA0"][-1] + 1
    assert whole.memory.devices["CUDA0"].weights < split.memory.devices["CUDA0"].weights
    assert split.memory.devices["CUDA0"].total <= budget


def test_two_gpus_get_a_tensor_split_and_both_budgets_hold(qwen: Inventory, tmp_path: Path) -> None:
    r = _fit(qwen, [Budget("CUDA0", 8 * GiB), Budget("CUDA1", 6 * GiB)], ["-c", "16384"], tmp_path)
    assert "-ts" in r.argv and "tensor_split" not in r.plan_text.replace("no tensor_split", "")
    assert r.memory.devices["CUDA0"].total <= 8 * GiB and r.memory.devices["CUDA1"].total <= 6 * GiB
    assert r.gpu_expert_layers["CUDA0"] and r.gpu_expert_layers["CUDA1"]
    # the plan it writes leaves -ts to the solver: compiled, it chooses the same split
    from moeconf.compile import compile_plan
    from moeconf.plan import plan_from_text

    again = compile_plan(plan_from_text(r.plan_text, str(tmp_path / "fit.plan.toml")), inventory=qwen)
    assert again.argv == r.argv


def test_ik_fit_over_two_gpus_splits_by_its_layer_sizes(qwen: Inventory, tmp_path: Path) -> None:
    ik = engine("ik_llama.cpp")
    r = fit(qwen, ik, [Budget("CUDA0", 8 * GiB), Budget("CUDA1", 6 * GiB)], ["-c", "16384"],
            model_path=str(qwen.source), plan_dir=str(tmp_path), reserve=GiB)
    assert "-ts" in r.argv and "GPU(auto)" not in r.memory.devices
    assert r.memory.devices["CUDA0"].total <= 8 * GiB and r.memory.devices["CUDA1"].total <= 6 * GiB
    from moeconf.compile import compile_plan
    from moeconf.plan import plan_from_text

    again = compile_plan(plan_from_text(r.plan_text, str(tmp_path / "fit.plan.toml")), inventory=qwen)
    assert again.argv == r.argv


def test_verification_catches_a_solver_that_overfills(qwen: Inventory, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # the greedy step thinks experts cost 10% less than they do: the fill measured again as a
    # whole must still bring the device back within its budget
    import moeconf.fill

    real = moeconf.fill.alloc_size
    monkeypatch.setattr(moeconf.fill, "alloc_size", lambda t, dev: real(t, dev) * 9 // 10)
    r = _fit(qwen, [Budget("CUDA0", 12 * GiB)], ["-c", "32768"], tmp_path, split=False)
    assert r.memory.devices["CUDA0"].total <= 12 * GiB
    assert 0 < len(r.gpu_expert_layers["CUDA0"]) < 48


def test_infeasible_names_the_device_and_what_would_help(tmp_path: Path) -> None:
    inv = load_inventory(MODELS / "deepseek-v3.manifest.json")
    with pytest.raises(FitError) as ei:
        _fit(inv, [Budget("CUDA0", 8 * GiB)], ["-c", "65536"], tmp_path)
    msg = str(ei.value)
    assert "CUDA0 needs" in msg and "MiB over its 8,192 MiB budget" in msg
    assert "smaller -c" in msg and "-ctk q8_0 -ctv q8_0" in msg and "-ub" in msg


@pytest.mark.parametrize(("argv", "message"), [
    (["-ngl", "20"], "fit chooses -ngl itself"),
    (["-ot", "exps=CPU"], "fit chooses -ot itself"),
    (["-c"], "-c needs a value"),
])
def test_flags_fit_decides_are_refused(qwen: Inventory, tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(MoeconfError, match=message):
        _fit(qwen, [Budget("CUDA0", 24 * GiB)], argv, tmp_path)


def test_rpc_budget_needs_its_server(qwen: Inventory, tmp_path: Path) -> None:
    with pytest.raises(MoeconfError, match="give its server with --rpc"):
        _fit(qwen, [Budget("RPC0[10.0.0.2:50052]", 18 * GiB)], [], tmp_path)
    r = _fit(qwen, [Budget("RPC0[10.0.0.2:50052]", 12 * GiB)], ["--rpc", "10.0.0.2:50052", "-c", "8192"], tmp_path)
    assert r.argv.index("--rpc") < r.argv.index("-ot")
    assert r.memory.devices["RPC0[10.0.0.2:50052]"].total <= 12 * GiB


def test_cli_writes_a_plan_that_compiles_to_the_same_command(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.toml"
    model = str(MODELS / "qwen3-30b-a3b.manifest.json")
    assert main(["fit", model, "--gpu", "12GiB", "-o", str(plan), "--json", "--", "-c", "32768"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"argv", "ot", "memory"} and out["memory"]["CUDA0"]["total"] <= 12 * GiB
    assert main(["compile", str(plan), "-q", "--target", "argv"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert compiled == out["argv"]


def test_cli_infeasible_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fit", str(MODELS / "deepseek-v3.manifest.json"), "--gpu", "8GiB", "--", "-c", "65536"])
    assert rc == 2 and "does not fit" in capsys.readouterr().err
    assert main(["fit", str(MODELS / "deepseek-v3.manifest.json"), "--gpu", "lots"]) == 2


def test_cli_takes_engine_flags_inline_as_the_issue_writes_them(capsys: pytest.CaptureFixture[str]) -> None:
    """`moeconf fit MODEL --gpu 24GiB -c 32768 -ctk q8_0 -ctv q8_0` (no `--`) reads the engine flags,
    exactly as with `--` before them; commands that take no engine flags still refuse extra words."""
    model = str(MODELS / "qwen3-30b-a3b.manifest.json")
    flags = ["-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0"]
    assert main(["fit", model, "--gpu", "24GiB", "--json", *flags]) == 0
    inline = json.loads(capsys.readouterr().out)
    assert main(["fit", model, "--gpu", "24GiB", "--json", "--", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == inline
    assert inline["argv"][inline["argv"].index("-c") + 1] == "32768" and "q8_0" in inline["argv"]
    with pytest.raises(SystemExit) as e:
        main(["inspect", model, "-c", "5"])
    assert e.value.code == 2 and "unrecognized arguments: -c 5" in capsys.readouterr().err


def test_ram_budget_is_written_and_checked_after_the_fill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(MODELS / "glm-4.5-air.manifest.json")
    plan = tmp_path / "plan.toml"
    assert main(["fit", model, "--gpu", "24GiB", "--ram", "64GiB", "-o", str(plan), "--json", "-c", "32768"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 4 GiB of the 64 are kept for the system (--ram-headroom's default)
    assert out["memory"]["CPU"]["total"] <= 60 * GiB and 'cpu = "60 GiB"' in plan.read_text()
    assert out["assumptions"]["ram"] == {"bytes": 64 * GiB, "headroom": 4 * GiB, "budget": 60 * GiB}
    assert main(["compile", str(plan), "-q", "--target", "argv"]) == 0
    assert json.loads(capsys.readouterr().out) == out["argv"]
    assert main(["fit", model, "--gpu", "24GiB", "--ram", "32GiB", "-c", "32768"]) == 2
    err = capsys.readouterr().err
    assert "system RAM holds" in err and "over its 28,672 MiB budget" in err


def test_gpu_order_as_given_does_not_change_what_the_engine_numbers(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp numbers local GPUs CUDA0, CUDA1 whatever order --gpu names them in; -ts counts in
    that order. Judged by explain with the GPUs listed either way."""
    model = str(MODELS / "qwen3-30b-a3b.manifest.json")
    assert main(["fit", model, "--gpu", "CUDA1=16GiB", "--gpu", "CUDA0=6GiB", "--json"]) == 0
    rev = json.loads(capsys.readouterr().out)
    assert main(["fit", model, "--gpu", "CUDA0=6GiB", "--gpu", "CUDA1=16GiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["argv"] == rev["argv"]
    for listed in ("CUDA1,CUDA0", "CUDA0,CUDA1"):
        code = main(["explain", model, "--gpus", listed, "--budget", "CUDA0=6GiB", "--budget", "CUDA1=16GiB",
                     "--", rev["argv"][0], *rev["argv"][3:]])  # the command fit printed (llama-server's 4 output rows)
        capsys.readouterr()
        assert code == 0, listed


@pytest.mark.parametrize(("flags", "words"), [
    (["-sm", "none"], "CUDA1 is not used with -sm none"),
    (["-sm", "row"], "leave -sm at layer and -ts unset, and moeconf chooses -ts)"),
])
def test_fit_errors_speak_in_flags_not_in_its_own_plan(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                       words: str) -> None:
    """fit's plan is its own, not a file the user has: no fit.plan.toml:line:col, no plan keys."""
    rc = main(["fit", str(MODELS / "qwen3-30b-a3b.manifest.json"), "--gpu", "24GiB", "--gpu", "24GiB", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and "fit.plan.toml" not in err and "split_mode" not in err


def test_fit_refuses_a_negative_main_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", str(MODELS / "qwen3-30b-a3b.manifest.json"), "--gpu", "24GiB", "-mg", "-1", "-sm", "none"]) == 2
    assert "nothing for fit to place" in capsys.readouterr().err


def test_a_fill_measured_far_over_its_room_refills_without_an_internal_error(
        qwen: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the greedy step thinks experts cost 40% of what they do: measured as a whole the device is over
    # by more than the room it had, so the next round starts with no room at all (negative); splitting
    # a layer into that room must take nothing, not stop on the packing's own check
    import moeconf.fill

    real = moeconf.fill.alloc_size
    monkeypatch.setattr(moeconf.fill, "alloc_size", lambda t, dev: real(t, dev) * 4 // 10)
    r = _fit(qwen, [Budget("CUDA0", 12 * GiB)], ["-c", "32768"], tmp_path, split=True)
    assert r.memory.devices["CUDA0"].total <= 12 * GiB
