"""Issue 18, items 2 and 3: `fit` prints the whole command a user runs (their own flags passed
through as written, in order; the model path they serve; any output target) and every assumption
the memory table was computed with."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from moeconf.cli import main
from tests.test_fit import _every_printed_command_is_one_explain_accepts  # noqa: F401  (autouse: explain checks)

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"
GLM = str(MODELS / "glm-4.5-air.manifest.json")
QWEN = str(MODELS / "qwen3-30b-a3b.manifest.json")
QWEN235 = str(MODELS / "qwen3-235b-a22b.manifest.json")
GiB = 2**30
MiB = 2**20


def _fit_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    rc = main(["fit", *args, "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    data: dict[str, object] = json.loads(out.out)
    return data


def _fit_err(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = main(["fit", *args])
    out = capsys.readouterr()
    assert rc == 2 and out.out == "" and "internal error" not in out.err, (rc, out)
    return out.err


PASSTHROUGH = ["-t", "16", "--threads-batch", "8", "--host", "0.0.0.0", "--port", "8081", "--jinja", "-lm", "none",
               "--alias", "glm", "--metrics", "-np", "1"]


def test_flags_that_decide_no_placement_pass_through_as_written_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    """`-t 16 --host ... --jinja -lm none` used to be refused ("[flags] extra may
    not hold '-t'"); now they are the end of the command, word for word."""
    out = _fit_json(capsys, GLM, "--gpu", "24GiB", "-c", "16384", *PASSTHROUGH)
    argv = out["argv"]
    assert isinstance(argv, list)
    assert argv[-len(PASSTHROUGH):] == PASSTHROUGH
    # the memory flags are read into the estimate (and the plan), not passed blind
    assert argv[argv.index("-c") + 1] == "16384"


def test_passthrough_is_checked_against_the_engines_flag_table() -> None:
    from moeconf.engines import engine
    from moeconf.engines.flagtable import MAINLINE
    from moeconf.fit import _engine_flags

    uf = _engine_flags(PASSTHROUGH, engine("llama.cpp"))
    words = [w for w in uf.extra if w.startswith("-")]
    assert words and all(w in MAINLINE for w in words)


def test_load_switches_pass_only_for_builds_that_still_take_them(capsys: pytest.CaptureFixture[str]) -> None:
    """--no-mmap/--mlock are gone from the pinned llama.cpp (only -lm/--load-mode): fit refuses
    them for the newest build, naming -lm, and passes them for a build that still has them."""
    from moeconf.engines import engine
    from moeconf.fit import _engine_flags

    old = ["--no-mmap", "--mlock", "-t", "8"]
    assert _engine_flags(old, engine("llama.cpp", "b10000")).extra == old
    err = _fit_err(capsys, GLM, "--gpu", "24GiB", "--", "--no-mmap")
    assert "has no --no-mmap any more" in err and "--load-mode" in err


@pytest.mark.parametrize(("flags", "named", "meant"), [
    (["--ctk", "q8_0"], "'--ctk'", "-ctk"),
    (["--flash-attn-typo", "on"], "'--flash-attn-typo'", "--flash-attn"),
    (["--theads", "16"], "'--theads'", "--threads"),
    (["--ctx-size=32768"], "'--ctx-size=32768'", "write --ctx-size 32768"),
])
def test_unknown_flags_and_typos_are_errors_naming_the_close_flag(capsys: pytest.CaptureFixture[str],
                                                                 flags: list[str], named: str, meant: str) -> None:
    err = _fit_err(capsys, GLM, "--gpu", "24GiB", *flags)
    assert named in err and meant in err


def test_a_stray_word_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "an engine flag was expected" in _fit_err(capsys, GLM, "--gpu", "24GiB", "-c", "8192", "extra-word")


def test_flags_that_load_more_than_the_estimate_knows_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fit_err(capsys, GLM, "--gpu", "24GiB", "-md", "/m/draft.gguf")
    assert "a draft model is not modelled" in err


@pytest.mark.parametrize("how", [["--serve-path", "/models/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf"],
                                 ["-m", "/models/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf"]])
def test_the_served_model_path_is_the_users(capsys: pytest.CaptureFixture[str], how: list[str]) -> None:
    """With a manifest, `-m /models/...` was refused and the bare file name printed."""
    out = _fit_json(capsys, GLM, "--gpu", "24GiB", "-c", "8192", *how)
    argv = out["argv"]
    assert isinstance(argv, list) and argv[argv.index("-m") + 1] == "/models/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf"


def test_two_different_served_paths_are_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "give the served path once" in _fit_err(capsys, GLM, "--gpu", "24GiB", "--serve-path", "/a.gguf",
                                                   "-m", "/b.gguf")


def test_target_works_for_fit_as_for_compile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "fit.toml"
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192", "--serve-path", "/models/glm.gguf", "--target",
                 "docker", "--docker-volume", "/srv/models:/models", "-o", str(plan), "--port", "9000"]) == 0
    out = capsys.readouterr()
    docker = out.out.splitlines()[0]
    words = shlex.split(docker)
    assert words[:2] == ["docker", "run"] and "/srv/models:/models" in words and "9000:9000" in words
    assert words.count("--port") == 1 and "moeconf: warning" not in out.err
    # the written plan compiles to the same docker command
    assert main(["compile", str(plan), "--target", "docker", "-q"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == docker


@pytest.mark.parametrize("target", ["docker", "compose"])
def test_docker_without_volumes_warns_for_fit_and_compile(capsys: pytest.CaptureFixture[str], target: str,
                                                          tmp_path: Path) -> None:
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192", "--serve-path", "/models/glm.gguf",
                 "--target", target]) == 0
    err = capsys.readouterr().err
    assert "mounts no volume, so the container has no file at -m /models/glm.gguf" in err
    plan = tmp_path / "p.toml"
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{QWEN}"\nserve_path = "/models/q.gguf"\n')
    assert main(["compile", str(plan), "--target", target, "-q"]) == 0
    assert "mounts no volume, so the container has no file at -m /models/q.gguf" in capsys.readouterr().err
    with plan.open("a") as f:
        f.write('[targets]\ndocker_volumes = ["/srv/models:/models"]\n')
    assert main(["compile", str(plan), "--target", target, "-q"]) == 0
    assert "mounts no volume" not in capsys.readouterr().err


# --- item 3: assumptions on the page -------------------------------------------------------------

@pytest.mark.parametrize("flag", [["--gpu", "24"], ["--gpu", "24GiB", "--ram", "128"],
                                  ["--gpu", "24GiB", "--reserve", "1024"]])
def test_sizes_need_a_unit(capsys: pytest.CaptureFixture[str], flag: list[str]) -> None:
    """`--gpu 24` was 24 bytes ("over its 0 MiB budget")."""
    err = _fit_err(capsys, GLM, *flag)
    n = flag[-1]
    assert f"{n!r} has no unit: write {n}GiB" in err


def test_the_command_alone_on_standard_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`fit --target compose > file` wrote the layer summary, the assumptions and the memory table after the
    YAML: the file was not YAML. Every target's artifact is alone on standard output, the report on standard
    error, and -q leaves the report out."""
    import yaml

    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192", "--target", "compose"]) == 0
    got = capsys.readouterr()
    assert isinstance(yaml.safe_load(got.out), dict) and "memory (MiB)" in got.err and "assumed:" in got.err
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192", "--target", "json"]) == 0
    json.loads(capsys.readouterr().out)
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192"]) == 0
    got = capsys.readouterr()
    assert len(got.out.splitlines()) == 1 and shlex.split(got.out)[0] == "llama-server"
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192", "-q"]) == 0
    quiet = capsys.readouterr()
    assert quiet.out == got.out and quiet.err == ""


def test_gb_and_gib_are_both_taken_and_echoed_in_mib(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", GLM, "--gpu", "24GB", "-c", "8192"]) == 0
    err = capsys.readouterr().err  # the report (the command alone is on standard output)
    assert "assumed: GPU budgets CUDA0 24GB = 22,888 MiB" in err
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192"]) == 0
    assert "assumed: GPU budgets CUDA0 24GiB = 24,576 MiB" in capsys.readouterr().err


def test_ram_keeps_a_headroom_for_the_system(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-235B with --ram 128GiB was accepted with 1.6 GiB of RAM left."""
    err = _fit_err(capsys, QWEN235, "--gpu", "24GiB", "--ram", "128GiB", "-c", "32768")
    assert "over its 126,976 MiB budget" in err  # 128 GiB less the 4 GiB default headroom
    out = _fit_json(capsys, QWEN235, "--gpu", "32GiB", "--ram", "128GiB", "--ram-headroom", "1GiB", "-c", "32768")
    mem = out["memory"]
    assert isinstance(mem, dict) and mem["CPU"]["total"] <= 127 * GiB
    assert out["assumptions"]["ram"] == {"bytes": 128 * GiB, "headroom": GiB, "budget": 127 * GiB}  # type: ignore[index]
    assert "leaves nothing" in _fit_err(capsys, GLM, "--gpu", "24GiB", "--ram", "4GiB")


def test_the_command_holds_every_setting_the_table_assumes(capsys: pytest.CaptureFixture[str]) -> None:
    """The table said "flash attention on" while the command had no -fa."""
    assert main(["fit", QWEN, "--gpu", "24GiB"]) == 0
    got = capsys.readouterr()
    command = shlex.split(got.out.splitlines()[0])
    header = next(line for line in got.err.splitlines() if line.startswith("memory (MiB) at"))
    assert "flash attention on" in header and command[command.index("-fa") + 1] == "on"
    ctx = header.split("-c ")[1].split()[0]
    assert command[command.index("-c") + 1] == ctx  # the model's own context, written out


def test_engine_and_version_are_printed_and_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", QWEN, "--gpu", "24GiB", "-c", "8192"]) == 0
    assert "assumed: llama.cpp b11312 (the newest moeconf knows" in capsys.readouterr().err
    out = _fit_json(capsys, QWEN, "--gpu", "24GB", "-c", "8192", "--engine-version", "b7600")
    a = out["assumptions"]
    assert isinstance(a, dict)
    assert a["engine"] == "llama.cpp" and a["engine_version"] == "b7600" and a["engine_version_given"] is True
    assert a["flash_attn"] == "on" and a["ctx_size"] == 8192 and a["reserve_per_gpu"] == GiB
    assert a["budgets"] == {"CUDA0": {"bytes": 24 * 10**9, "given": "24GB"}}


def test_the_fit_command_lint_suggests_for_a_gb_budget_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Sizes need a unit now: lint's suggested `moeconf fit` for a `[gpu_memory]` in GB (not a
    whole MiB) must still give one (it wrote the bytes bare)."""
    import re

    from tests.test_lint_memory import _lint

    line = "llama-server -m m.gguf -ngl 999 -c 8192 -ot exps=CPU"
    found = [f for f in _lint(tmp_path, line, "qwen3-30b-a3b", {"CUDA0": "13GB"}) if f.code == "MOE020"]
    assert len(found) == 1
    m = re.search(r"\((moeconf fit [^)]*)\)$", found[0].message)
    assert m and "--gpu CUDA0=13000000000B" in m.group(1)
    words = shlex.split(m.group(1))[1:]
    words[1] = QWEN  # the model the config names
    assert main(words) == 0, capsys.readouterr().err


def test_a_later_shard_is_served_as_the_first_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192", "-m", "/models/GLM-00002-of-00002.gguf"]) == 0
    out = capsys.readouterr()
    assert " -m /models/GLM-00001-of-00002.gguf " in out.out.splitlines()[0]
    assert "moeconf: note: -m /models/GLM-00001-of-00002.gguf, not /models/GLM-00002-of-00002.gguf" in out.err


def test_engine_flags_are_never_read_as_fits_own(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse read `-ot` as fit's `-o t` (exit 0, the user's -ot gone, a plan file named `t` written) and
    `-hf` as `-h f` ("ignored explicit argument 'f'"). A word the engines' flag table knows goes to the
    engine: fit then says what it does with it."""
    monkeypatch.chdir(tmp_path)
    assert main(["fit", GLM, "--gpu", "12GiB", "-c", "16384", "-ot", r"blk\.0\.=CPU"]) == 2
    assert "fit chooses -ot itself" in capsys.readouterr().err
    assert not (tmp_path / "t").exists() and list(tmp_path.iterdir()) == []
    assert main(["fit", GLM, "--gpu", "12GiB", "-hf", "foo/bar"]) == 2
    err = capsys.readouterr().err
    assert "-hf: a model downloaded by the engine" in err and "ignored explicit argument" not in err
    # fit's own -o (the engine's -o too, meaningless to llama-server) stays fit's, as its help says
    assert main(["fit", GLM, "--gpu", "24GiB", "-c", "8192", "-o", str(tmp_path / "p.toml"), "-q"]) == 0
    assert (tmp_path / "p.toml").is_file() and capsys.readouterr().out.startswith("llama-server ")


def test_env_target_writes_engine_flags_as_their_variables(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    """`fit --target env -t 16 --jinja`: both have LLAMA_ARG_* forms (llama.cpp's option table); the
    file, read back as the engine reads its environment, is the command fit printed (issue 25)."""
    from moeconf.engines import mainline
    from moeconf.engines.argvread import Arg
    from moeconf.engines.cmdline import parse_invocation

    model = QWEN
    assert main(["fit", model, "--gpu", "12GiB", "-q", "--target", "env", "-t", "16", "--jinja", "--no-webui"]) == 0
    text = capsys.readouterr().out
    env = dict(line.split("=", 1) for line in text.splitlines())
    assert env["LLAMA_ARG_THREADS"] == "16" and env["LLAMA_ARG_JINJA"] == "1" and env["LLAMA_ARG_UI"] == "0"
    inv = parse_invocation([Arg("llama-server")], mainline(), {k: Arg(v) for k, v in env.items()})
    assert not inv.problems and inv.ot and inv.ot[0].value.text == env["LLAMA_ARG_OVERRIDE_TENSOR"]


@pytest.mark.parametrize(("flags", "says"), [
    (["--lora-init-without-apply"], "--lora-init-without-apply: no LLAMA_ARG_* variable reads it"),
    (["-t", "4", "--threads", "8"], "--threads: given twice, and LLAMA_ARG_THREADS holds one value"),
])
def test_env_target_names_the_flag_without_a_variable(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                      says: str) -> None:
    model = QWEN
    assert main(["fit", model, "--gpu", "12GiB", "-q", "--target", "env", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "fit.plan" not in err and ".toml" not in err, err


def test_llama_swap_names_the_model_not_fits_plan(capsys: pytest.CaptureFixture[str]) -> None:
    model = QWEN
    assert main(["fit", model, "--gpu", "12GiB", "-q", "--target", "llama-swap"]) == 0
    out = capsys.readouterr().out
    assert "fit.plan" not in out and "'qwen3-30b-a3b':" in out


def test_an_idle_gpu_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-30B on 2 x 24 GiB: every expert fits beside its layer on CUDA0 (-ts 48,1); fit says why
    CUDA1 holds no layer (issue 25: the search's order, not a tie-break gone wrong)."""
    assert main(["fit", QWEN, "--gpu", "24GiB", "--gpu", "24GiB", "-c", "32768", "-q"]) == 0
    out, err = capsys.readouterr()
    assert "-ts 48,1" in out and "CUDA1 holds no layer and no expert" in err
