"""`explain` says what `lint` says about its line (issue 18, item 6), from the same rule modules:
each finding under the item it is about or for the command line, the rules --cpu-moe and
--n-cpu-moe add shown as that flag and never as unmatched items."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.linting.linter import lint
from moeconf.linting.model import Config
from moeconf.model.load import load_inventory
from tests.conftest import EXAMPLES

MODELS = EXAMPLES / "models"
# rules whose findings explain states as the engine's refusals instead (see report/explain.py)
REFUSALS = {"invalid-regex", "slow-regex", "unknown-device", "missing-equals", "unknown-flag", "flag-value-refused",
            "unsupported-regex-syntax"}

LINES = [
    ("glm-4.5-air", r"llama-server -m /models/m.gguf -ngl 999 -ot 'blk\.1=CUDA0,exps=CPU, attn=CPU'"),
    ("deepseek-v3", r"llama-server -m /models/m.gguf -ngl 999 -fit off -ot 'blk\.(0-9)\.ffn_.*=CPU,exp=CPU'"),
    ("qwen3-30b-a3b", r"llama-server -m /models/m.gguf -ngl 999 -fit off -ot 'ffn.*=CPU,exps=CPU,output=CPU'"),
    ("deepseek-v3", r"llama-server -m /models/m.gguf -ngl 999 --n-cpu-moe 31 -ot 'blk\.[0-9]\.attn=CUDA0'"),
    ("gpt-oss-120b", r"llama-server -m /models/m.gguf -ngl 20 -fit off -ot 'attn=CUDA0,exps=CPU'"),
]


def _explain_text(model: str, line: str, capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["explain", str(MODELS / f"{model}.manifest.json"), "--color", "never", "--", *shlex.split(line)])
    assert code in (0, 1)
    return capsys.readouterr().out


@pytest.mark.parametrize(("model", "line"), LINES)
def test_explain_says_what_lint_says(tmp_path: Path, model: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "launch.sh").write_text(line + "\n")
    cfg = Config(engine="llama.cpp", models={"/models/m.gguf": str(MODELS / f"{model}.manifest.json")})
    found = [f for f in lint([str(tmp_path / "launch.sh")], config=cfg).findings if f.name not in REFUSALS]
    assert found  # each line has something to say
    out = _explain_text(model, line, capsys)
    for f in found:
        assert f"{f.code} {f.name} [{f.severity}]" in out and f.message in out, (f.text(), out)


def test_findings_sit_under_their_item(capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain_text(*LINES[0], capsys)
    lines = out.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith(r"   1. blk\.1=CUDA0"))
    assert "MOE008 prefix-collision" in lines[first + 1] and "blocks 10-19" in lines[first + 1]
    third = next(i for i, ln in enumerate(lines) if ln.startswith("   3.  attn=CPU"))
    assert "MOE002 space-in-list" in lines[third + 1]


def test_n_cpu_moe_is_shown_as_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain_text(*LINES[3], capsys)
    items = out[out.index("items (in the order"):]
    assert items.count("--n-cpu-moe 31 (cli)") == 1, items
    assert "1-31. --n-cpu-moe 31 (cli): 31 rule(s) the engine adds, taking the routed experts of blocks 3-30" in items
    assert "unmatched:" not in out  # blocks 0-2 are dense: their rules match nothing by design
    inv = load_inventory(str(MODELS / "deepseek-v3.manifest.json"))
    ex = explain(inv, engine("llama.cpp"), shlex.split(LINES[3][1]))
    assert ex.unmatched == [] and ex.json()["unmatched"] == []
    # an item the user wrote that matches nothing still is one
    ex = explain(inv, engine("llama.cpp"), ["llama-server", "--n-cpu-moe", "31", "-ot", "nothing_here=CPU"])
    assert [it.pattern for it in ex.unmatched] == ["nothing_here"]


def test_explain_json_carries_the_findings(capsys: pytest.CaptureFixture[str]) -> None:
    model, line = LINES[1]
    assert main(["explain", str(MODELS / f"{model}.manifest.json"), "--json", "--", *shlex.split(line)]) == 0
    out = json.loads(capsys.readouterr().out)
    names = {f["name"] for f in out["findings"]}
    assert {"unmatched-pattern", "name-collision"} <= names, names
    f = next(f for f in out["findings"] if f["name"] == "unmatched-pattern")
    word = line.index("'blk") + 1  # the -ot value's first character, in its words joined by single spaces
    assert f["column"] == word and "(0-9)" in f["message"]
