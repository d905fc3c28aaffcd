"""Lint reads a line before it judges it (issue 18, item 4): a line the engine cannot read stops
the memory and fit rules; each finding sits at the word it is about; one analysis is stated once;
JSON and SARIF list every instance; tensors that go where they were anyway are no finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.linting.linter import lint
from moeconf.linting.model import Config, Finding
from tests.conftest import EXAMPLES

MODELS = EXAMPLES / "models"


def lint_text(tmp_path: Path, body: str, model: str = "glm-4.5-air", **cfg: object) -> list[Finding]:
    path = tmp_path / "launch.sh"
    path.write_text(body)
    config = Config(engine="llama.cpp", models={"/models/m.gguf": str(MODELS / f"{model}.manifest.json")},
                    **cfg)  # type: ignore[arg-type]
    return lint([str(path)], config=config).findings


GUIDE = "#!/bin/sh\n# the guide's line\nllama-server -m /models/m.gguf -ngl 999 \\\n  --cpu-moe -fa --ctx-size 4096\n"


def test_bare_fa_is_found_at_the_fa_and_stops_the_memory_rules(tmp_path: Path) -> None:
    found = lint_text(tmp_path, GUIDE, gpu_memory={"CUDA0": 24 * 2**30})
    assert [(f.name, f.line, f.column) for f in found] == [("flag-value-refused", 4, 13)], [f.text() for f in found]
    assert "'-fa on'" in found[0].message
    # the same line written as meant is judged: its memory and fit findings come back
    fixed = lint_text(tmp_path, GUIDE.replace("-fa --ctx", "-fa on --ctx"), gpu_memory={"CUDA0": 4 * 2**30})
    assert {"memory-over-device", "fit-conflict"} <= {f.name for f in fixed}
    assert "flag-value-refused" not in {f.name for f in fixed}
    # where -fa is still a switch (llama.cpp before b6325) the line reads as written
    old = lint_text(tmp_path, GUIDE, engine_version="b6000")
    assert "flag-value-refused" not in {f.name for f in old}


@pytest.mark.parametrize(("line", "word"), [
    ("llama-server -m /models/m.gguf -ngl 999 -c 32k -ot exps=CPU", "32k"),
    ("llama-server -m /models/m.gguf -ngl 999 -ub 0 -ot exps=CPU", "0"),
    ("llama-server -m /models/m.gguf -ngl lots -ot exps=CPU", "lots"),
    ("llama-server -m /models/m.gguf -ngl 999 -ot exps=CPU -c", "-c"),
])
def test_unreadable_values_are_found_at_their_word(tmp_path: Path, line: str, word: str) -> None:
    found = lint_text(tmp_path, line + "\n", gpu_memory={"CUDA0": 2**30})
    mine = [f for f in found if f.name == "flag-value-refused"]
    assert len(mine) == 1 and mine[0].column == line.index(f" {word}") + 2, [f.text() for f in found]
    assert not {"memory-over-device", "fit-conflict", "cache-type-refused"} & {f.name for f in found}


def test_cache_type_refused_sits_at_the_value_it_is_about(tmp_path: Path) -> None:
    body = "llama-server -m /models/m.gguf -ngl 999 -fit off \\\n  -c 8192 -ctk q8_0 -ot exps=CPU\n"
    found = [f for f in lint_text(tmp_path, body, model="deepseek-v3") if f.name == "cache-type-refused"]
    assert [(f.line, f.column) for f in found] == [(2, 16)]  # the q8_0 after -ctk
    body = "llama-server -m /models/m.gguf -ngl 999 -fit off \\\n  -fa off -ctv q8_0 -ctk q8_0 -ot exps=CPU\n"
    found = [f for f in lint_text(tmp_path, body) if f.name == "cache-type-refused"]
    assert [(f.line, f.column) for f in found] == [(2, 16)] and "flash attention off" in found[0].message
    line = "llama-server -m /models/m.gguf -ngl 999 -fit off -ctk q9_9 -ctv q8_0"
    found = lint_text(tmp_path, line + "\n")
    assert [f.column for f in found if f.name == "cache-type-refused"] == [line.index("q9_9") + 1]


def test_one_analysis_is_stated_once(tmp_path: Path) -> None:
    body = ('llama-server -m /models/m.gguf -ngl 999 -ot "blk\\.([1-9]|1[0-9])\\.ffn_.*_exps=CUDA0,exps=CPU" '
            "-c 65536\n")
    found = {f.name: f.message for f in lint_text(tmp_path, body, gpu_memory={"CUDA0": 24 * 2**30})}
    assert "moeconf fit" in found["memory-over-device"]
    assert "moeconf fit" not in found["fit-conflict"] and "memory-over-device" in found["fit-conflict"]
    assert len(found["fit-conflict"]) < 300
    # with memory-over-device off, fit-conflict says what fit places instead
    alone = {f.name: f.message for f in lint_text(tmp_path, body, gpu_memory={"CUDA0": 24 * 2**30},
                                                  ignore=["memory-over-device"])}
    assert "moeconf fit" in alone["fit-conflict"] and "memory-over-device" not in alone


def _sixty_redundant() -> tuple[str, list[str]]:
    items = [rf"blk\.{n}\.ffn_{k}_exps=CPU" for n in range(3, 23) for k in ("up", "gate", "down")]
    return "llama-server -m /models/m.gguf -ngl 999 -fit off -ot \"exps=CPU," + ",".join(items) + "\"\n", items


@pytest.mark.parametrize("fmt", ["json", "sarif", "text"])
def test_every_instance_is_listed(tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    body, items = _sixty_redundant()
    assert len(items) == 60
    (tmp_path / "launch.sh").write_text(body)
    (tmp_path / ".moeconf.toml").write_text(
        f'engine = "llama.cpp"\n[models]\n"/models/m.gguf" = "{MODELS / "deepseek-v3.manifest.json"}"\n')
    assert main(["lint", str(tmp_path / "launch.sh"), "--format", fmt]) == 1
    out = capsys.readouterr().out
    assert "more shadowed-rule" not in out
    start = body.index('"') + 2
    columns = [start + body[start - 1:].index(it) for it in items]
    if fmt == "json":
        got = [(f["line"], f["column"]) for f in json.loads(out)["findings"] if f["name"] == "shadowed-rule"]
    elif fmt == "sarif":
        results = json.loads(out)["runs"][0]["results"]
        got = [(r["locations"][0]["physicalLocation"]["region"]["startLine"],
                r["locations"][0]["physicalLocation"]["region"]["startColumn"])
               for r in results if r["ruleId"] == "MOE011"]
    else:
        got = [(int(w.split(":")[1]), int(w.split(":")[2])) for w in out.splitlines() if "shadowed-rule" in w]
        for it in items:  # the text report names every item
            assert f"'{it}'" in out
    assert got == [(1, c) for c in columns]


def test_tensors_that_stay_where_they_were_are_no_finding(tmp_path: Path) -> None:
    same = lint_text(tmp_path, "llama-server -m /models/m.gguf -ngl 999 -fit off -ot exp=CUDA0\n",
                     model="deepseek-v3")
    assert "name-collision" not in {f.name for f in same}, [f.text() for f in same]
    moved = lint_text(tmp_path, "llama-server -m /models/m.gguf -ngl 999 -fit off -ot exp=CPU\n",
                      model="deepseek-v3")
    assert "name-collision" in {f.name for f in moved}


def test_an_unknown_flag_stops_the_memory_rules_too(tmp_path: Path) -> None:
    line = "llama-server -m /models/m.gguf -ngl 999 --ctx-sise 131072 -ot 'blk\\.[1-9]\\.ffn_.*_exps=CUDA0,exps=CPU'\n"
    found = {f.name for f in lint_text(tmp_path, line, gpu_memory={"CUDA0": 8 * 2**30})}
    assert "unknown-flag" in found and not {"memory-over-device", "fit-conflict"} & found, found
    fixed = {f.name for f in lint_text(tmp_path, line.replace("sise", "size"), gpu_memory={"CUDA0": 8 * 2**30})}
    assert {"memory-over-device", "fit-conflict"} <= fixed, fixed
