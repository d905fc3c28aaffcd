"""Text output never carries control characters from a file: tensor names and metadata strings
with terminal escape sequences, file names, plan values and lint findings are printed escaped
(`\\x1b[2J`), in every text report and error message; JSON escapes them by itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from moeconf.errors import MoeconfError
from moeconf.textsafe import first_unsafe, safe
from tests import rawgguf as R
from tests.conftest import REPO

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;owned\x07"


def _raw_controls(text: str) -> list[str]:
    return sorted({ch for ch in text if first_unsafe(ch) is not None and ch != "\n"})


def _strings(obj: object) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moeconf", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, errors="surrogateescape")


def evil_gguf(path: Path, *, truncated: bool = False) -> Path:
    g = R.minimal()
    g.kv.append(("general.name", R.STR, f"Evil{TITLE}{CLEAR}"))
    g.tensors.append((f"blk.0.attn_q.weight{CLEAR}", (64,), 0, 256))
    g.data_size = 256 if truncated else 512
    path.write_bytes(g.build())
    return path


def test_safe_escapes_controls_and_keeps_text() -> None:
    assert safe(f"a{CLEAR}b") == "a\\x1b[2Jb"
    assert safe("tab\there\nnew\r\x7f\x9b\u202e\u2028\ufeff\udcff") == \
        "tab\\there\\nnew\\r\\x7f\\x9b\\u202e\\u2028\\ufeff\\udcff"
    assert safe("line\nline", keep="\n") == "line\nline"
    assert safe(r"blk\.(\d+)\.ffn_.*_exps=CPU ünïcode ✓") == r"blk\.(\d+)\.ffn_.*_exps=CPU ünïcode ✓"
    assert first_unsafe("ok") is None and first_unsafe("a\nb") == "\\n"


@given(st.text())
def test_safe_output_has_no_control_character_and_is_idempotent(text: str) -> None:
    out = safe(text)
    assert _raw_controls(out) == [] and "\n" not in out
    assert safe(out) == out
    out.encode("utf-8")  # lone surrogates (undecodable file names) no longer break printing


def test_error_messages_escape_path_message_and_hint() -> None:
    e = MoeconfError(f"tensor 'x{CLEAR}' is bad\nfake line", path=f"dir/{TITLE}.gguf", hint=f"h{CLEAR}")
    text = str(e)
    assert _raw_controls(text) == []
    assert text.count("\n") == 1  # only the hint line
    assert "dir/\\x1b]0;owned\\x07.gguf: tensor 'x\\x1b[2J' is bad\\nfake line" in text


def test_inspect_and_explain_text_escape_gguf_strings(tmp_path: Path) -> None:
    model = str(evil_gguf(tmp_path / "evil.gguf"))
    for args in (["inspect", model, "--tensors"],
                 ["explain", model, "--tensors", "--color", "always", "--ot", f"attn_q{CLEAR}=CPU"]):
        r = run(*args)
        assert r.returncode in (0, 1), r.stderr
        out = r.stdout + r.stderr
        assert "blk.0.attn_q.weight\\x1b[2J" in out
        assert "Evil\\x1b]0;owned\\x07\\x1b[2J" in out
        if "--color" in args:  # moeconf's own colours are the only escape sequences
            assert all(seq.startswith(("[3", "[0m")) for seq in out.split("\x1b")[1:])
        else:
            assert _raw_controls(out) == []


def test_inspect_json_is_escaped_by_json(tmp_path: Path) -> None:
    model = str(evil_gguf(tmp_path / "evil.gguf"))
    for args in (["inspect", model, "--json"], ["inspect", model, "--manifest"]):
        r = run(*args)
        assert r.returncode == 0, r.stderr
        assert _raw_controls(r.stdout) == []
        assert "blk.0.attn_q.weight" + CLEAR in r.stdout.encode().decode("unicode_escape")
    data = json.loads(run("inspect", model, "--json").stdout)
    assert {t["name"] for t in data["tensors"]} == {"blk.0.attn_norm.weight", "blk.0.attn_q.weight" + CLEAR}


def test_gguf_error_naming_a_tensor_is_escaped(tmp_path: Path) -> None:
    r = run("inspect", str(evil_gguf(tmp_path / f"trunc{CLEAR}.gguf", truncated=True)))
    assert r.returncode == 2
    assert _raw_controls(r.stderr) == [], r.stderr
    assert "trunc\\x1b[2J.gguf" in r.stderr and "attn_q.weight\\x1b[2J" in r.stderr


def test_lint_text_escapes_file_content_and_names(tmp_path: Path) -> None:
    script = tmp_path / f"run{CLEAR}.sh"
    script.write_text(f"llama-server -m /m/model.gguf -ngl 99 -ot 'exps{CLEAR}=cpu'\n")
    r = run("lint", str(script))
    assert r.returncode == 1, r.stdout + r.stderr
    assert _raw_controls(r.stdout + r.stderr) == []
    assert "run\\x1b[2J.sh:1:" in r.stdout
    for fmt in ("sarif", "json"):
        r = run("lint", str(script), "--format", fmt)
        assert _raw_controls(r.stdout) == []
        assert any(CLEAR in v for v in _strings(json.loads(r.stdout)))  # the value itself is intact


def test_plan_errors_and_compile_summary_escape_plan_values(tmp_path: Path) -> None:
    from tests.conftest import EXAMPLES

    plan = tmp_path / "plan.toml"
    manifest = EXAMPLES / "models" / "kimi-k2.manifest.json"
    plan.write_text(f'rules = ["experts -> CUDA9\\u001b[2J"]\n[model]\npath = "{manifest}"\n')  # TOML escape
    r = run("compile", str(plan))
    assert r.returncode == 2
    assert _raw_controls(r.stderr) == [], r.stderr
    assert "\\x1b[2J" in r.stderr


def test_init_cannot_be_given_plan_lines_by_a_gguf_name(tmp_path: Path) -> None:
    import tomllib

    g = R.minimal()
    g.kv.append(("general.name", R.STR, 'x\nrules = ["experts -> CUDA7"]\n[flags]\nextra = ["--rpc"]\n#'))
    model = tmp_path / "m.gguf"
    model.write_bytes(g.build())
    r = run("init", str(model))
    assert r.returncode == 0, r.stderr
    assert _raw_controls(r.stdout) == []
    plan = tomllib.loads(r.stdout)
    assert plan["rules"] == ["experts -> cpu"]
    assert set(plan) == {"rules", "model", "engine", "flags"} and set(plan["flags"]) == {"ctx_size"}
    assert "# moeconf plan for x\\nrules = " in r.stdout
