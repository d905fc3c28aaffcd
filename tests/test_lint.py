"""The linter end to end: the corpus of launch files, the shipped deploy example, config,
suppression, output formats, exit codes, explain and check."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest

from moeconf.linting.linter import lint
from moeconf.linting.rules import ALL
from tests.conftest import EXAMPLES, REPO

CORPUS = Path(__file__).parent / "corpus"


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moeconf", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


EXPECTED = tomllib.loads((CORPUS / "expected.toml").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus(name: str) -> None:
    result = lint([str(CORPUS / name)])
    got = sorted(f"{f.line}:{f.code}" for f in result.findings)
    assert got == sorted(EXPECTED[name]), [f.text() for f in result.findings]
    if not EXPECTED[name]:
        assert not [f for f in result.findings if f.severity in ("error", "warning")]


def test_corpus_covers_every_file() -> None:
    files = {p.name for p in CORPUS.iterdir() if p.name not in (".moeconf.toml", "expected.toml", "realworld")}
    assert files == set(EXPECTED)


DEPLOY_EXPECTED = {
    "docker-compose.yml": ["7:MOE020", "23:MOE013"],
    "glm-air.service": ["7:MOE007"],
    "llama-swap.yaml": ["16:MOE010"],
    "plans/qwen3-30b.toml": ["5:MOE030", "5:MOE030"],
    "run-glm-air.sh": ["6:MOE020", "8:MOE002", "8:MOE008"],
    "launch-qwen3-30b.sh": [],
}


def test_deploy_example() -> None:
    r = run("lint", ".", cwd=EXAMPLES / "deploy")
    assert r.returncode == 1
    got: dict[str, list[str]] = {k: [] for k in DEPLOY_EXPECTED}
    for line in r.stdout.splitlines()[:-1]:
        path, ln, _col, rest = line.split(":", 3)
        got.setdefault(path.removeprefix("./"), []).append(f"{ln}:{rest.split()[0]}")
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in DEPLOY_EXPECTED.items()}
    assert r.stdout.splitlines()[-1].startswith("2 error(s), 7 warning(s)")


def test_formats_and_exit_codes(tmp_path: Path) -> None:
    j = run("lint", str(CORPUS), "--format", "json")
    assert j.returncode == 1
    data = json.loads(j.stdout)
    jsonschema.validate(data, json.loads((REPO / "schemas" / "lint.schema.json").read_text()))
    assert {"code", "name", "severity", "path", "line", "column", "message"} <= set(data["findings"][0])
    s = run("lint", str(CORPUS), "--format", "sarif")
    sarif = json.loads(s.stdout)
    assert sarif["version"] == "2.1.0"
    run_ = sarif["runs"][0]
    ids = [r["id"] for r in run_["tool"]["driver"]["rules"]]
    assert {m.CODE for m in ALL} <= set(ids)
    res = run_["results"][0]
    assert ids[res["ruleIndex"]] == res["ruleId"]
    assert res["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1
    clean = run("lint", str(CORPUS / "clean-deepseek.sh"))
    assert clean.returncode == 0, clean.stdout
    assert run("lint", "nope").returncode == 2
    only_errors = run("lint", str(CORPUS / "swap.yaml"), "--fail-on", "error")
    assert only_errors.returncode == 0


def test_select_ignore_and_severity(tmp_path: Path) -> None:
    shutil.copy(CORPUS / "multi-gpu-deepseek.sh", tmp_path / "run.sh")
    cfg = (CORPUS / ".moeconf.toml").read_text().replace("../../examples", str(EXAMPLES))
    (tmp_path / ".moeconf.toml").write_text(cfg.replace('engine = "llama.cpp"',
                                                        'engine = "llama.cpp"\nignore = ["repeated-ot"]\n'
                                                        '[severity]\n"duplicate-rule" = "error"'))
    codes = {f.code: f.severity for f in lint([str(tmp_path / "run.sh")]).findings}
    assert "MOE024" not in codes
    assert codes["MOE012"] == "error"
    r = run("lint", str(tmp_path / "run.sh"), "--select", "shadowed-rule")
    assert [ln.split()[1] for ln in r.stdout.splitlines()[:-1]] == ["MOE011"]


def test_inline_suppression(tmp_path: Path) -> None:
    text = (CORPUS / "multi-gpu-deepseek.sh").read_text().replace(
        '  -ot "exps=CPU"', '  -ot "exps=CPU"  # moeconf: ignore[repeated-ot,MOE012]')
    (tmp_path / "run.sh").write_text(text)
    shutil.copy(CORPUS / ".moeconf.toml", tmp_path / ".moeconf.toml")
    cfg = (tmp_path / ".moeconf.toml").read_text().replace("../../examples", str(EXAMPLES))
    (tmp_path / ".moeconf.toml").write_text(cfg)
    codes = sorted(f.code for f in lint([str(tmp_path / "run.sh")]).findings)
    assert codes == ["MOE011"]


def test_model_unknown_is_reported(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text("llama-server -m /somewhere/else.gguf -fit off -ot 'blk\\.1=CPU'\n")
    fs = lint([str(tmp_path / "run.sh")]).findings
    assert [(f.code, f.severity) for f in fs] == [("MOE000", "info"), ("MOE008", "warning")]


# --- explain ---------------------------------------------------------------------------------


def test_explain_map_and_json() -> None:
    args = ["explain", "examples/models/deepseek-v3.manifest.json", "--", "llama-server", "-ngl", "999",
            "-ot", "blk\\.1=CUDA0,exps=CPU, attn=CPU"]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    assert " blk  kind   exp shx rtr att dns nrm" in r.stdout
    assert "   3  moe    C   0   0   0   .   0" in r.stdout
    assert "  10  moe    0   0   0   0   .   0" in r.stdout  # blk\.1 took blk.10-19 experts too
    assert "unmatched:  attn=CPU" in r.stdout
    j = json.loads(run(*args[:2], "--json", *args[2:]).stdout)
    assert j["unmatched"] == [" attn=CPU"]
    assert j["placement"]["blk.15.ffn_up_exps.weight"] == "CUDA0"
    assert j["placement"]["blk.25.ffn_up_exps.weight"] == "CPU"
    assert j["items"][0]["first_match_for"] > 0


def test_explain_cpu_moe_order_and_env() -> None:
    from moeconf.engines import engine
    from moeconf.explanation import explain
    from moeconf.model.load import load_inventory

    inv = load_inventory(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    t = "blk.3.ffn_up_exps.weight"
    # mainline: -ot before --cpu-moe wins; after it loses
    one = "blk\\.3\\.ffn_up_exps=CUDA0"
    assert explain(inv, engine("llama.cpp"), ["-ot", one, "--cpu-moe"]).placement.devices[t] == "CUDA0"
    assert explain(inv, engine("llama.cpp"), ["--cpu-moe", "-ot", one]).placement.devices[t] == "CPU"
    # env items come before the command line
    ex = explain(inv, engine("llama.cpp"), ["-ot", "exps=CUDA0"], env={"LLAMA_ARG_OVERRIDE_TENSOR": "exps=CPU"})
    assert ex.placement.devices[t] == "CPU"
    # --n-cpu-moe: first blocks on mainline, last ones on ik_llama.cpp
    main = explain(inv, engine("llama.cpp"), ["--n-cpu-moe", "2"]).placement.devices
    ikd = explain(inv, engine("ik_llama.cpp"), ["-ngl", "999", "--n-cpu-moe", "2"]).placement.devices
    assert main["blk.0.ffn_up_exps.weight"] == "CPU" and main["blk.47.ffn_up_exps.weight"] == "CUDA0"
    assert ikd["blk.0.ffn_up_exps.weight"] == "CUDA0" and ikd["blk.47.ffn_up_exps.weight"] == "CPU"
    # ik drops every rule with -ngl 0
    assert explain(inv, engine("ik_llama.cpp"), ["-ngl", "0", "-ot", "exps=CUDA0"]).placement.devices[t] == "CPU"


def test_explain_plan_round_trips(tmp_path: Path) -> None:
    plan = tmp_path / "decompiled.toml"
    r = run("explain", "examples/models/glm-4.5-air.manifest.json", "--gpus", "CUDA0,CUDA1", "--json",
            "--plan", str(plan), "--", "-ngl", "999", "-ts", "1,1",
            "-ot", "blk\\.(1|2|3)\\.ffn_.*_exps=CUDA1,exps=CPU,blk\\.4\\.ffn_up_exps\\.weight=CUDA0")
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)["placement"]
    c = run("compile", str(plan), "--json", "-q")
    assert c.returncode == 0, c.stderr
    assert json.loads(c.stdout)["placement"] == want
    # no -m on the line and a manifest: -m is the GGUF the manifest was made from, not a made-up path
    source = json.loads((EXAMPLES / "models" / "glm-4.5-air.manifest.json").read_text())["source"]["file"]
    assert f'serve_path = "{source}"' in plan.read_text()
    argv = json.loads(run("compile", str(plan), "-q", "--target", "argv").stdout)
    assert argv[argv.index("-m") + 1] == source


def test_explain_refusal_is_shown() -> None:
    r = run("explain", "examples/models/kimi-k2.manifest.json", "--ot", "exps=cuda0")
    assert "error: the engine would refuse to start: unknown buffer type 'cuda0'" in r.stdout


# --- check -----------------------------------------------------------------------------------


def test_check_detects_stale_artifacts(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES / "deploy", tmp_path / "deploy")
    shutil.copytree(EXAMPLES / "models", tmp_path / "models")
    ok = run("check", str(tmp_path / "deploy"))
    assert ok.returncode == 0, ok.stdout
    assert "1 generated file(s), 0 stale" in ok.stdout
    plan = tmp_path / "deploy" / "plans" / "qwen3-30b.toml"
    plan.write_text(plan.read_text().replace("layers 14..47", "layers 20..47"))
    bad = run("check", str(tmp_path / "deploy"))
    assert bad.returncode == 1
    assert "launch-qwen3-30b.sh: stale" in bad.stdout
    assert "+llama-server" in bad.stdout and "-llama-server" in bad.stdout


def test_library_api() -> None:
    import moeconf

    r = moeconf.lint(str(CORPUS / "swap.yaml"))
    assert [(f.code, f.name, f.line) for f in r.findings] == [("MOE018", "ngl-conflict", 7)]
    ex = moeconf.explain(str(EXAMPLES / "models" / "deepseek-v3.manifest.json"), ["-ngl", "999", "-ot", "exps=CPU"])
    assert ex.placement.devices["blk.3.ffn_up_exps.weight"] == "CPU"
    assert ex.unmatched == []
    assert ex.json()["unmatched"] == []
