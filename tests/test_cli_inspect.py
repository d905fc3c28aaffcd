"""`moeconf inspect` end to end, through the real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from moeconf.atomic import write_text_atomic
from moeconf.cli import main
from moeconf.model.load import load_inventory
from tests.conftest import EXAMPLES, REPO


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moeconf", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_inspect_shipped_example() -> None:
    r = run("inspect", "examples/models/glm-4.5-air.manifest.json")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "GLM-4.5-Air (glm4moe, Q4_K_M)" in out
    assert "47 blocks: dense 0, moe 1-45, nextn 46" in out
    assert "128 routed experts, 8 used per token, 1 shared" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line and line.split()[0] in (
        "experts", "shexp", "nextn", "dense")}
    assert lines["experts"][1] == "135"
    assert lines["nextn"][1] == "21"
    assert r.stderr == ""


def test_inspect_gguf_and_manifest_print_the_same(layout_paths: dict[str, Path], tmp_path: Path) -> None:
    gguf_path = layout_paths["deepseek-v3"]
    manifest = tmp_path / "ds.json"
    assert main(["inspect", str(gguf_path), "--manifest", "-o", str(manifest)]) == 0
    a = run("inspect", str(gguf_path), "--json")
    b = run("inspect", str(manifest), "--json")
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    for j in (ja, jb):
        j.pop("source")
        j.pop("shards")
    assert ja == jb
    assert run("inspect", str(gguf_path)).stdout == run("inspect", str(manifest)).stdout


def test_inspect_json_schema(layout_paths: dict[str, Path]) -> None:
    r = run("inspect", str(layout_paths["gpt-oss-120b"]), "--json")
    data = json.loads(r.stdout)
    schema = json.loads((REPO / "schemas" / "inventory.schema.json").read_text())
    registry = _registry()
    jsonschema.Draft202012Validator(schema, registry=registry).validate(data)
    assert data["arch"] == "gpt-oss"
    assert data["block_count"] == 36
    assert data["layers"][0] == {"index": 0, "kind": "moe", "recurrent": False}
    assert data["unknown_tensors"] == []
    t = next(t for t in data["tensors"] if t["name"] == "blk.5.ffn_up_exps.bias")
    assert t == {"name": "blk.5.ffn_up_exps.bias", "type": "F32", "shape": [2880, 128], "nbytes": 2880 * 128 * 4,
                 "group": "experts", "role": "experts", "layer": 5}
    out = next(t for t in data["tensors"] if t["name"] == "output.weight")
    assert out["layer"] is None


def _registry() -> object:
    from referencing import Registry, Resource

    reg: Registry = Registry()  # type: ignore[type-arg]
    for name in ("manifest.schema.json", "inventory.schema.json"):
        doc = json.loads((REPO / "schemas" / name).read_text())
        reg = reg.with_resource(doc["$id"], Resource.from_contents(doc))
    return reg


def test_inspect_manifest_to_stdout_loads_back(tmp_path: Path) -> None:
    r = run("inspect", "examples/models/qwen3-30b-a3b.manifest.json", "--manifest")
    assert r.returncode == 0
    p = tmp_path / "m.json"
    p.write_text(r.stdout)
    assert load_inventory(p) == load_inventory(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")


def test_inspect_tensor_listing() -> None:
    r = run("inspect", "examples/models/kimi-k2.manifest.json", "--tensors")
    row = next(line for line in r.stdout.splitlines() if line.startswith("blk.60.ffn_down_exps.weight "))
    assert row.split() == ["blk.60.ffn_down_exps.weight", "Q6_K", "[2048,", "7168,", "384]", "4410.00", "experts"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["inspect", "nope.gguf"], "nope.gguf: no such file"),
        (["inspect", "pyproject.toml"], "pyproject.toml (byte offset 0): not a GGUF file"),
        (["inspect", "schemas/manifest.schema.json"], "format: expected 'moeconf-manifest'"),
        (["inspect", "examples"], "is a directory"),
        (["inspect", "examples/models/kimi-k2.manifest.json", "--manifest", "-o", "/nonexistent/dir/x.json"],
         "/nonexistent/dir/x.json: cannot write"),
    ],
)
def test_errors_are_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    r = run(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert fragment in r.stderr
    assert r.stderr.startswith("moeconf: error: ")


def test_usage_errors() -> None:
    assert run().returncode == 2
    assert run("inspect").returncode == 2
    assert run("frobnicate").returncode == 2
    v = run("--version")
    assert v.returncode == 0 and v.stdout.startswith("moeconf ")


def test_cli_start_up_imports_nothing_heavy(tmp_path: Path) -> None:
    """The inspect command must not import numpy, the gguf package, lark, pydantic, jsonschema or
    huggingface_hub (and its HTTP clients): that is what keeps a pre-commit hook instant."""
    out = tmp_path / "inventory.json"
    code = (
        "import sys; from moeconf.cli import main; "
        f"rc = main(['inspect', 'examples/models/deepseek-v3.manifest.json', '--json', '-o', {str(out)!r}]); "
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'gguf', 'lark', 'pydantic', 'jsonschema', "
        "'huggingface_hub', 'httpx', 'httpx2', 'requests'}); "
        "print(rc, heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.stdout.strip() == "0 []", r.stdout + r.stderr
    assert json.loads(out.read_text())["arch"] == "deepseek2"


def test_atomic_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")

    def boom(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(target, "new content")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
