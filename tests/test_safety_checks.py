"""Every safety check handed a wrong answer refuses it: each regex engine's half of the
pre-print check, the read-back of every target, the whole-argv check, decompile's re-check; and
what a plan may not put in `[flags] extra`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.compile import _PASSABLE, Compiled, compile_plan
from moeconf.emitting.readback import OutputMismatch, verify_output
from moeconf.emitting.targets import emit
from moeconf.engines.flags import PLAN_KEYS
from moeconf.errors import MoeconfError, PlanError
from moeconf.plan import plan_from_text
from moeconf.synth.rules import SynthesisError, check
from tests.conftest import EXAMPLES
from tests.test_oracle import targets_of

PLANS = sorted((EXAMPLES / "plans").glob("*.toml"))
MODELS = EXAMPLES / "models"


@pytest.fixture(scope="module")
def compiled() -> dict[str, Compiled]:
    return {p.stem: compile_plan(p) for p in PLANS}


def _never(_pattern: str):  # type: ignore[no-untyped-def]
    return lambda _name: False


@pytest.mark.parametrize("half", ["python_matcher", "ecmascript_matcher"])
def test_each_regex_half_of_the_pre_print_check_refuses_a_lying_matcher(
        half: str, compiled: dict[str, Compiled], monkeypatch: pytest.MonkeyPatch) -> None:
    import moeconf.synth.rules as synth

    c = compiled["glm-4.5-air"]
    check(c.placement, c.synthesis)  # the truth passes
    monkeypatch.setattr(synth, half, _never)  # this half now says no item matches anything
    message = "do not reproduce the placement" if half == "python_matcher" else "ECMAScript reads"
    with pytest.raises(SynthesisError, match=message):
        check(c.placement, c.synthesis)


CORRUPTIONS = {
    "a layer of escaping lost": lambda text: text.replace("\\", ""),
    "the device renamed": lambda text: text.replace("=CPU", "=CUDA0"),
}


@pytest.mark.parametrize("plan", [p.stem for p in PLANS])
@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_every_target_read_back_refuses_a_corrupted_output(plan: str, how: str,
                                                           compiled: dict[str, Compiled]) -> None:
    c = compiled[plan]
    for target in targets_of(c):
        text = emit(c, target)
        verify_output(c, target, text)  # the truth passes
        bad = CORRUPTIONS[how](text)
        assert bad != text, target
        with pytest.raises(OutputMismatch):
            verify_output(c, target, bad)


def test_read_back_refuses_a_quoting_bug(compiled: dict[str, Compiled], monkeypatch: pytest.MonkeyPatch) -> None:
    import moeconf.emitting.targets as tg

    c = compiled["qwen3-235b-a22b"]
    monkeypatch.setattr(tg, "shell_line", lambda argv: " ".join(argv))  # forgets to quote
    for target in ("llama.cpp", "docker"):
        with pytest.raises(OutputMismatch):
            emit(c, target)
    monkeypatch.setattr(tg, "_swap_quote", lambda a: a)
    with pytest.raises(OutputMismatch):
        emit(c, "llama-swap")
    monkeypatch.setattr(tg, "yaml_str", lambda s, compose=False: '"' + s + '"')  # YAML escapes in "..."
    with pytest.raises(OutputMismatch):
        emit(c, "compose")


def test_env_read_back_refuses_a_missing_tensor_split(compiled: dict[str, Compiled]) -> None:
    c = compiled["glm-4.5-air"]  # two GPUs split 3:2: without the split the engine goes by free memory
    text = emit(c, "env")
    bad = "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("LLAMA_ARG_TENSOR_SPLIT"))
    with pytest.raises(OutputMismatch, match="elsewhere than the plan"):
        verify_output(c, "env", bad)


def test_whole_argv_check_refuses_an_argv_that_places_differently(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import moeconf.emitting.argv as argv_mod

    real = argv_mod.build_argv
    monkeypatch.setattr(argv_mod, "build_argv", lambda *a, **k: [*real(*a, **k), "--cpu-moe"])
    with pytest.raises(OutputMismatch, match="compiled command line"):
        compile_plan(EXAMPLES / "plans" / "glm-4.5-air.toml")
    assert main(["compile", str(EXAMPLES / "plans" / "glm-4.5-air.toml")]) == 3
    out = capsys.readouterr()
    assert out.out == "" and "internal error" in out.err


def test_whole_argv_check_refuses_a_wrong_ngl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import moeconf.emitting.argv as argv_mod

    real = argv_mod.build_argv

    def off_by_one(*a, **k):  # type: ignore[no-untyped-def]
        out = real(*a, **k)
        i = out.index("-ngl")
        out[i + 1] = str(int(out[i + 1]) + 1)
        return out

    plan = tmp_path / "p.toml"
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{MODELS}/qwen3-30b-a3b.manifest.json"\n'
                    'serve_path = "/m/q.gguf"\n[flags]\nn_gpu_layers = 20\n')
    compile_plan(plan)
    monkeypatch.setattr(argv_mod, "build_argv", off_by_one)
    with pytest.raises(OutputMismatch):
        compile_plan(plan)


def test_decompile_refuses_rules_that_do_not_reproduce(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import moeconf.decompile as dec
    from moeconf.explanation import explain

    c = compile_plan(EXAMPLES / "plans" / "glm-4.5-air.toml")
    ex = explain(c.inventory, c.engine, c.argv, gpus=["CUDA0", "CUDA1"])
    model = str(MODELS / "glm-4.5-air.manifest.json")
    assert "experts" in dec.decompile(ex, str(tmp_path / "p.toml"), model, ["CUDA0", "CUDA1"])
    real = dec.decompile_rules
    monkeypatch.setattr(dec, "decompile_rules", lambda *a: real(*a)[:-1])  # loses a rule
    with pytest.raises(MoeconfError, match="does not reproduce"):
        dec.decompile(ex, str(tmp_path / "p.toml"), model, ["CUDA0", "CUDA1"])


# --- [flags] extra ------------------------------------------------------------------------------

BASE = f'rules = ["experts -> cpu"]\n[model]\npath = "{MODELS}/qwen3-30b-a3b.manifest.json"\nserve_path = "/m/q.gguf"\n'


@pytest.mark.parametrize("flag", [*sorted(set(PLAN_KEYS) - set(_PASSABLE)), "--n_gpu_layers", "--n-gpu-layers=3",
                                  "--cpu_moe", "--port=8080"])
def test_extra_refuses_options_a_plan_key_owns(flag: str) -> None:
    text = BASE + f'[flags]\nextra = ["--jinja", "{flag}", "1"]\n'
    with pytest.raises(PlanError, match=re.escape(f"[flags] extra may not hold '{flag}'")) as e:
        compile_plan(plan_from_text(text, "/x/p.toml"))
    assert (e.value.line, e.value.column) == (6, 22)
    assert e.value.hint and e.value.hint.startswith("use ")


def test_extra_value_of_a_known_option_is_not_an_option() -> None:
    c = compile_plan(plan_from_text(BASE + '[flags]\nextra = ["--alias", "-ngl", "--jinja"]\n', "/x/p.toml"))
    assert c.argv[-3:] == ("--alias", "-ngl", "--jinja") and not c.warnings


@pytest.mark.parametrize(("flag", "key"), [("-t", "threads = 8"), ("--threads", "threads = 8"),
                                           ("--no-mmap", "no_mmap = true"), ("--mlock", "mlock = true"),
                                           ("-lm", "mlock = true"), ("--load-mode", "no_mmap = true"),
                                           ("--mmap", "no_mmap = true")])
def test_extra_passes_a_flag_that_decides_no_placement_while_its_key_is_unset(flag: str, key: str) -> None:
    """What `moeconf fit` writes for `-t 16 --no-mmap ...`: as given, in order, when the plan does
    not set the same thing; set both ways it is still refused (two copies, the engine reads the last)."""
    words = {"-lm": [flag, "none"], "--load-mode": [flag, "none"], "-t": [flag, "16"], "--threads": [flag, "16"]
             }.get(flag, [flag])
    extra = ", ".join(f'"{w}"' for w in ["--jinja", *words])
    c = compile_plan(plan_from_text(BASE + f'[flags]\nextra = [{extra}]\n', "/x/p.toml"))
    assert c.argv[-len(words) - 1:] == ("--jinja", *words)
    with pytest.raises(PlanError, match=re.escape(f"[flags] extra may not hold '{flag}'")):
        compile_plan(plan_from_text(BASE + f'[flags]\n{key}\nextra = [{extra}]\n', "/x/p.toml"))


def test_extra_host_and_port_pass_and_containers_use_them() -> None:
    from moeconf.emitting.targets import emit

    c = compile_plan(plan_from_text(BASE + '[flags]\nextra = ["--host", "127.0.0.1", "--port", "9000"]\n',
                                    "/x/p.toml"))
    docker = emit(c, "docker")
    assert "-p 9000:9000" in docker and docker.count("--port") == 1 and docker.count("--host") == 1
    assert "'--port', '${PORT}'" not in emit(c, "llama-swap") and "${PORT}" not in emit(c, "llama-swap")
    with pytest.raises(PlanError, match=re.escape("[flags] extra may not hold '--port'")):
        compile_plan(plan_from_text(BASE + '[targets]\nport = 8000\n[flags]\nextra = ["--port", "9000"]\n',
                                    "/x/p.toml"))


def test_extra_unknown_options_are_refused_naming_the_close_flag(tmp_path: Path) -> None:
    """The engine stops at an argument it does not know: compile never prints one (issue 18)."""
    plan = tmp_path / "p.toml"
    plan.write_text(BASE + '[flags]\nextra = ["--jinja", "--flash-attn-typo", "on"]\n')
    with pytest.raises(PlanError) as e:
        compile_plan(plan)
    assert (e.value.line, e.value.column) == (6, 22)
    assert "unknown argument '--flash-attn-typo' (did you mean --flash-attn?)" in e.value.message
    # a binary that is not the engines' common parser: its flags are not known, so they pass with a warning
    plan.write_text(BASE + '[flags]\nextra = ["--jinja", "--frobnicate", "7", "-fmoe"]\n'
                    '[targets]\nbinary = "my-server"\n')
    c = compile_plan(plan)
    assert c.argv[-4:] == ("--jinja", "--frobnicate", "7", "-fmoe")
    assert [str(w) for w in c.warnings] == [
        f"{plan}:6:22: [flags] extra: '--frobnicate' is not an option llama.cpp is known to accept; passed through "
        "unchecked",
        f"{plan}:6:43: [flags] extra: '-fmoe' is not an option llama.cpp is known to accept; passed through "
        "unchecked",
    ]


def test_issue_13_extra_cpu_moe_is_a_plan_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.toml"
    plan.write_text(BASE + '[flags]\nextra = ["--cpu-moe", "-ngl", "0"]\n')
    assert main(["compile", str(plan)]) == 2
    err = capsys.readouterr().err
    assert f"{plan}:6:11: [flags] extra may not hold '--cpu-moe'" in err and "Traceback" not in err


def test_lint_reports_a_refused_extra(tmp_path: Path) -> None:
    from moeconf import lint

    plan = tmp_path / "p.toml"
    plan.write_text(BASE + '[flags]\nextra = ["-ot", "exps=CUDA0"]\n')
    (f,) = lint([str(plan)]).findings
    assert (f.name, f.line, f.column) == ("plan-invalid", 6, 11)


# --- ik_llama.cpp -ngl 0 ------------------------------------------------------------------------

IK = (f'[model]\npath = "{MODELS}/deepseek-v3.manifest.json"\nserve_path = "/m/d.gguf"\n'
      '[engine]\nname = "ik_llama.cpp"\n')


def test_ik_ngl_0_with_rules_that_move_tensors_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "p.toml"
    plan.write_text('rules = ["experts -> gpu"]\n' + IK + "[flags]\nn_gpu_layers = 0\n")
    assert main(["compile", str(plan)]) == 2
    err = capsys.readouterr().err
    assert f"{plan}:1:11: ik_llama.cpp ignores every -ot rule when -ngl is 0" in err


def test_ik_ngl_0_with_rules_that_keep_the_default_agrees_with_explain(tmp_path: Path) -> None:
    from moeconf import explain

    plan = tmp_path / "p.toml"
    plan.write_text('rules = ["experts -> cpu"]\n' + IK + "[flags]\nn_gpu_layers = 0\n")
    c = compile_plan(plan)
    assert not c.synthesis.items and set(c.placement.bytes_by_device()) == {"CPU"}
    ex = explain(c.inventory, list(c.argv), engine="ik_llama.cpp")
    assert ex.placement.devices == c.placement.devices
