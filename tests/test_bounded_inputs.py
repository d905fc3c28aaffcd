"""Hostile and broken models, manifests and plans: every count is checked against what the file
can hold, only regular files are read, and every failure is a clear error (exit 2) naming the
file (and line:col where there is one), never a traceback, a hang or a huge allocation."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType as VT

from moeconf.cli import main
from moeconf.errors import GGUFError, ManifestError, MoeconfError, PlanError
from moeconf.fixtures import write_gguf
from moeconf.model.inventory import first_shard
from moeconf.model.load import load_inventory
from moeconf.plan import load_plan
from tests import rawgguf as rg
from tests.conftest import EXAMPLES, address_space_cap

MANIFEST = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def limited_memory() -> object:
    """Cap the address space at 1 GiB more than now, so a huge allocation fails fast instead of
    swapping (the defect this file guards against allocated gigabytes)."""
    with address_space_cap():
        yield


# --- counts against what the file holds ---------------------------------------------------------


@pytest.mark.parametrize("vtype", [rg.U32, rg.U64, rg.I64])
def test_huge_block_count_in_a_tiny_gguf(tmp_path: Path, limited_memory: object, vtype: int) -> None:
    g = rg.minimal()
    g.kv[1] = ("qwen3moe.block_count", vtype, 2**31 - 1 if vtype == rg.U32 else 10**15)
    p = tmp_path / "tiny.gguf"
    p.write_bytes(g.build())
    assert p.stat().st_size < 600
    with pytest.raises(GGUFError, match=r"block_count is \d+, but there are only 1 tensors") as ei:
        load_inventory(p)
    assert ei.value.path == str(p)


def test_block_count_equal_to_tensors_is_fine(tmp_path: Path) -> None:
    g = rg.minimal(blocks=1)
    p = tmp_path / "ok.gguf"
    p.write_bytes(g.build())
    assert load_inventory(p).block_count == 1


def _manifest(**changes: object) -> dict[str, object]:
    data = json.loads(MANIFEST.read_text())
    for k, v in changes.items():
        section, _, key = k.partition("__")
        if key:
            data[section][key] = v
        else:
            data[section] = v
    return data


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"metadata__block_count": 10**12}, "block_count is 1000000000000, but there are only"),
        ({"source__shards": 10**11}, "source.shards: 100000000000 shards cannot hold"),
        ({"source__shards": "3"}, 'source.shards: expected an integer >= 1, got "3"'),
        ({"source__shards": 0}, "source.shards: expected an integer >= 1"),
        ({"source": [1, 2]}, "source: expected an object"),
        ({"source__file": {"a": 1}}, "source.file: expected a file name or null"),
        ({"metadata__head_count_kv": [4] * 5000}, "head_count_kv has 5000 entries for 48 blocks"),
        ({"metadata__expert_count": "many"}, 'metadata.expert_count: expected an integer >= 0 or null, got "many"'),
        ({"metadata__block_count": [1] * 10_000}, "metadata.block_count: expected an integer >= 0, got [1, 1,"),
    ],
)
def test_manifest_counts_and_types(tmp_path: Path, limited_memory: object, changes: dict[str, object],
                                   fragment: str) -> None:
    p = tmp_path / "m.manifest.json"
    p.write_text(json.dumps(_manifest(**changes)))
    with pytest.raises(ManifestError) as ei:
        load_inventory(p)
    assert fragment in str(ei.value)
    assert len(str(ei.value)) < 400  # a wrong-typed value is quoted short, not dumped


def test_manifest_huge_shape(tmp_path: Path) -> None:
    data = _manifest()
    data["tensors"][0]["shape"] = [2**40, 2**40]  # type: ignore[index]
    p = tmp_path / "m.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"element count of .* overflows"):
        load_inventory(p)


def test_manifest_json_deep_nesting_and_long_integers(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "moeconf-manifest",\n "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ManifestError, match="nested more than 64 deep") as ei:
        load_inventory(deep)
    assert (ei.value.line, ei.value.column) == (2, 70)
    long = tmp_path / "long.json"
    long.write_text('{"format": "moeconf-manifest",\n  "version": ' + "9" * 5000 + "}")
    with pytest.raises(ManifestError, match="more than 4300 digits") as ei:
        load_inventory(long)
    assert (ei.value.line, ei.value.column) == (2, 14)


def test_manifest_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moeconf.model import manifest

    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(ManifestError, match="a manifest is at most 1000 bytes"):
        load_inventory(MANIFEST)


def test_manifest_not_utf8_points_at_the_byte(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    p.write_bytes(b'{\n  "format": "\xff"}')
    with pytest.raises(ManifestError, match="not valid UTF-8") as ei:
        load_inventory(p)
    assert (ei.value.line, ei.value.column) == (2, 14)


# --- split shards -------------------------------------------------------------------------------


@pytest.fixture
def split3(tmp_path: Path) -> list[Path]:
    (tmp_path / "m").mkdir()
    return write_gguf(
        tmp_path / "m" / "x.gguf", "qwen3moe", [("qwen3moe.block_count", 1, VT.UINT32)],
        [("blk.0.attn_norm.weight", "F32", (8,)), ("blk.0.ffn_norm.weight", "F32", (8,)),
         ("output_norm.weight", "F32", (8,))],
        split_max_tensors=1,
    )


def test_shards_pointing_at_each_other(split3: list[Path]) -> None:
    one, two, three = split3
    assert two.name == "x-00002-of-00003.gguf"
    # shard 3 is a link to shard 2: its split.no says 1, not 2
    three.unlink()
    three.symlink_to(two.name)
    with pytest.raises(GGUFError, match=r"expected split\.no 2 of split\.count 3, found split\.no 1"):
        load_inventory(one)
    # shard 2 a link to shard 1
    three.unlink()
    shutil.copy(two, three)
    two.unlink()
    two.symlink_to(one.name)
    with pytest.raises(GGUFError, match=r"expected split\.no 1 .* found split\.no 0"):
        load_inventory(one)
    # shards linked in a loop
    two.unlink()
    three.unlink()
    two.symlink_to(three.name)
    three.symlink_to(two.name)
    with pytest.raises(GGUFError, match="cannot read") as ei:
        load_inventory(one)
    assert ei.value.path == str(two)


def test_shard_that_is_a_fifo_or_device(split3: list[Path]) -> None:
    two = split3[1]
    two.unlink()
    os.mkfifo(two)
    with pytest.raises(GGUFError, match=r"is a FIFO \(named pipe\), not a GGUF file"):
        load_inventory(split3[0])
    two.unlink()
    two.symlink_to("/dev/zero")
    with pytest.raises(GGUFError, match="is a character device"):
        load_inventory(split3[0])


def test_first_shard_names() -> None:
    assert first_shard("/m/x-00002-of-00003.gguf") == "/m/x-00001-of-00003.gguf"
    assert first_shard("/m/x-00001-of-00003.gguf") == "/m/x-00001-of-00003.gguf"
    assert first_shard("/m/x.gguf") == "/m/x.gguf"


# --- only regular files -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["m.gguf", "m.json", "plan.toml"])
@pytest.mark.parametrize("kind", ["fifo", "zero", "broken", "dir"])
def test_special_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                   kind: str) -> None:
    p = tmp_path / name
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "zero":
        p.symlink_to("/dev/zero")
    elif kind == "broken":
        p.symlink_to(tmp_path / "gone")
    else:
        p.mkdir()
    args = ["compile", str(p)] if name.endswith(".toml") else ["inspect", str(p)]
    code, out, err = cli(capsys, *args)
    assert code == 2
    expected = {"fifo": "is a FIFO", "zero": "is a character device", "broken": "is a broken symbolic link",
                "dir": "is a directory"}[kind]
    assert f"{p}: {expected}" in err
    assert out == ""
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_plan_model_path_and_model_option_must_be_regular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "pipe.gguf")
    plan = tmp_path / "p.toml"
    plan.write_text('rules = ["experts -> cpu"]\n[model]\npath = "pipe.gguf"\n')
    code, _, err = cli(capsys, "compile", str(plan))
    assert code == 2 and "pipe.gguf: is a FIFO" in err
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{MANIFEST}"\nserve_path = "/m.gguf"\n')
    code, _, err = cli(capsys, "compile", str(plan), "--model", "/dev/zero")
    assert code == 2 and "/dev/zero: is a character device" in err
    code, _, err = cli(capsys, "explain", "/dev/zero", "--ot", "exps=CPU")
    assert code == 2 and "/dev/zero: is a character device" in err


# --- plans --------------------------------------------------------------------------------------

BASE = f'rules = ["experts -> cpu"]\n[model]\npath = "{MANIFEST}"\nserve_path = "/m.gguf"\n'


@pytest.mark.parametrize(
    ("tail", "message", "line", "column"),
    [
        ('[engine]\ngpus = [1, 2]\n', "engine.gpus.0: Input should be a valid string", 6, 9),
        ('[engine]\ngpus = "CUDA0"\n', "engine.gpus: Input should be a valid list", 6, 1),
        ('[engine]\nversion = 7600\n', "engine.version: Input should be a valid string", 6, 1),
        ('[flags]\nctx_size = ' + "9" * 5000 + "\n", "a number has more than 4300 digits", 6, 12),
        ('[flags]\nctx_size = 99999999999999999999\n',
         "flags.ctx_size: Input should be less than or equal to 2147483647", 6, 1),
        ('[flags]\nn_gpu_layers = 4294967296\n', "less than or equal to 2147483647", 6, 1),
        ('[flags]\nextra = ' + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply", 6, 73),
        ('[flags]\ntensor_split = [1, inf]\n', "inf is not a proportion", 6, 1),
        ('[flags]\nrpc = ["a:1", 5]\n', "flags.rpc.1: Input should be a valid string", 6, 15),
    ],
)
def test_plan_values(tmp_path: Path, tail: str, message: str, line: int, column: int) -> None:
    p = tmp_path / "p.toml"
    p.write_text(BASE + tail)
    with pytest.raises(PlanError) as ei:
        load_plan(p)
    assert message in ei.value.message
    assert (ei.value.line, ei.value.column) == (line, column)


@pytest.mark.parametrize(("tail", "message", "line"), [
    ('[engine]\nversion = "banana"\n', "llama.cpp version 'banana': write a build number", 6),
    ('[engine]\nname = "ik_llama.cpp"\nversion = "0.9"\n', "ik_llama.cpp version '0.9': write a package version", 7),
])
def test_engine_versions_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str], tail: str, message: str,
                                     line: int) -> None:
    p = tmp_path / "p.toml"
    p.write_text(BASE + tail)
    code, out, err = cli(capsys, "compile", str(p), "-q")
    assert code == 2 and out == ""
    assert f"{p}:{line}:1: " in err and message in err


def test_known_engine_versions_load(tmp_path: Path) -> None:
    for tail in ('[engine]\nversion = "b7600"\n', '[engine]\nversion = "7600"\n',
                 '[engine]\nname = "ik_llama.cpp"\nversion = "0.1.5"\n',
                 '[engine]\nname = "ik_llama.cpp"\nversion = "2025-08-31"\n'):
        p = tmp_path / "p.toml"
        p.write_text(BASE + tail)
        load_plan(p)


@pytest.mark.parametrize(
    ("gpus", "fragment", "column"),
    [
        ('["cuda0", "cuda1"]', "buffer-type names are case-sensitive: did you mean 'CUDA0'?", 9),
        ('["CUDA0", "$GPU"]', "'$GPU' holds an unexpanded variable", 18),
        ('["CUDA0", "CUDA0"]', "engine.gpus names 'CUDA0' twice", 18),
        ('["CPU"]', "engine.gpus lists the CPU", 9),
        ('["RPC0[h:1]"]', "engine.gpus names an RPC device that flags.rpc already adds", 1),
    ],
)
def test_plan_device_names_checked_before_printing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   gpus: str, fragment: str, column: int) -> None:
    p = tmp_path / "p.toml"
    p.write_text(BASE + f"[engine]\ngpus = {gpus}\n[flags]\nrpc = [\"h:1\"]\n")
    code, out, err = cli(capsys, "compile", str(p), "-q")
    assert code == 2
    assert out == ""
    assert f"{p}:6:{column}: " in err and fragment in err


def test_explain_engine_version_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "explain", str(MANIFEST), "--engine-version", "banana", "--ot", "exps=CPU")
    assert code == 2
    assert "llama.cpp version 'banana'" in err


# --- -m is the first shard of the GGUF the engine loads ------------------------------------------


def test_dash_m_from_a_later_shard_and_init(split3: list[Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    one, two, _ = split3
    plan = tmp_path / "p.toml"
    code, _, err = cli(capsys, "init", str(two), "-o", str(plan))
    assert code == 0, err
    assert 'path = "m/x-00001-of-00003.gguf"' in plan.read_text()
    code, out, err = cli(capsys, "compile", str(plan), "-q")
    assert code == 0, err
    assert f"-m {one} " in out
    # --model naming shard 2 still emits shard 1
    code, out, err = cli(capsys, "compile", str(plan), "-q", "--model", str(two))
    assert code == 0, err
    assert f"-m {one} " in out and "00002" not in out


def test_dash_m_never_a_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.toml"
    plan.write_text('rules = ["experts -> cpu"]\n[model]\npath = "x.gguf"\n')
    code, out, err = cli(capsys, "compile", str(plan), "-q", "--model", str(MANIFEST))
    assert code == 2
    assert out == ""
    assert f"--model {MANIFEST} is a manifest" in err and "serve_path" in err
    # with serve_path, -m is the serve path (its first shard)
    plan.write_text('rules = ["experts -> cpu"]\n[model]\npath = "x.gguf"\n'
                    'serve_path = "/models/q-00003-of-00004.gguf"\n')
    code, out, err = cli(capsys, "compile", str(plan), "-q", "--model", str(MANIFEST))
    assert code == 0, err
    assert "-m /models/q-00001-of-00004.gguf " in out
    assert ".json" not in out


def test_no_traceback_for_model_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t.gguf"
    g = rg.minimal()
    g.kv[1] = ("qwen3moe.block_count", rg.U64, 2**63)
    p.write_bytes(g.build())
    code, _, err = cli(capsys, "inspect", str(p))
    assert code == 2 and "Traceback" not in err and f"{p}: qwen3moe.block_count is" in err
    assert sys.getrecursionlimit() >= 1000
    with pytest.raises(MoeconfError):
        load_inventory(p)


# --- the pre-print verification checks both Python re and ECMAScript ----------------------------


@pytest.mark.parametrize("half", ["python_matcher", "ecmascript_matcher"])
def test_verification_refuses_when_one_matcher_lies(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], half: str) -> None:
    """Each half of the check before printing, fed a wrong result, refuses: exit 3, nothing printed."""
    import moeconf.compile as compile_mod
    from moeconf.synth import rules

    real = getattr(rules, half)
    original_check = compile_mod.check

    def liar(pattern: str) -> object:
        m = real(pattern)
        return lambda name: not m(name)

    def lying_check(pl: object, syn: object) -> None:
        monkeypatch.setattr(rules, half, liar)
        try:
            original_check(pl, syn)  # type: ignore[arg-type]
        finally:
            monkeypatch.setattr(rules, half, real)

    monkeypatch.setattr(compile_mod, "check", lying_check)
    code, out, err = cli(capsys, "compile", str(EXAMPLES / "plans" / "qwen3-235b-a22b.toml"), "-q")
    assert code == 3, err
    assert out == ""
    assert "internal error" in err
    # and the honest check passes
    monkeypatch.setattr(compile_mod, "check", original_check)
    code, out, err = cli(capsys, "compile", str(EXAMPLES / "plans" / "qwen3-235b-a22b.toml"), "-q")
    assert code == 0, err


def test_manifest_without_serve_path_only_fails_targets_that_need_dash_m(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p.toml"
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{MANIFEST}"\n')
    code, out, err = cli(capsys, "compile", str(plan), "-q", "--target", "ot")
    assert code == 0, err
    assert out.strip().endswith("=CPU")
    for target in ("llama.cpp", "argv", "docker", "compose", "llama-swap", "json", "env"):
        code, out, err = cli(capsys, "compile", str(plan), "-q", "--target", target)
        assert code == 2 and out == "", target
        assert "serve_path" in err


def test_rule_numbers_too_large(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text(BASE.replace('"experts -> cpu"', '"experts layers 0..' + "9" * 5000 + ' -> cpu"'))
    with pytest.raises(PlanError, match="is too large for a layer number") as ei:
        load_plan(p)
    assert (ei.value.line, ei.value.column) == (1, 29)


# --- issue 18: the five inputs that ended in "internal error" (exit 3) ---------------------------


def _gguf_with(tmp_path: Path, name: str, g: rg.RawGGUF) -> Path:
    p = tmp_path / name
    p.write_bytes(g.build())
    return p


def test_head_count_kv_array_of_strings_is_a_located_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = rg.minimal()
    g.kv.append(("qwen3moe.attention.head_count_kv", rg.ARR, (rg.STR, ["a", "b"])))
    p = _gguf_with(tmp_path, "hkv.gguf", g)
    code, _, err = cli(capsys, "inspect", str(p))
    assert code == 2 and err.startswith(f"moeconf: error: {p}: qwen3moe.attention.head_count_kv is an array holding "
                                        "str values")


def test_a_block_number_of_5000_digits_is_a_located_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = rg.minimal()
    g.tensors = [("blk." + "9" * 5000 + ".attn_norm.weight", (64,), 0, 0)]
    p = _gguf_with(tmp_path, "long.gguf", g)
    code, _, err = cli(capsys, "inspect", str(p))
    assert code == 2 and err.startswith(f"moeconf: error: {p}: tensor blk.999") and "5000 digits" in err
    assert len(err) < 400


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem (Linux)")
@pytest.mark.parametrize("command", ["inspect", "explain", "fit"])
def test_a_read_that_fails_with_eio_is_an_error_naming_the_file(capsys: pytest.CaptureFixture[str],
                                                                 command: str) -> None:
    extra = ["--gpu", "24GiB"] if command == "fit" else []
    code, out, err = cli(capsys, command, "/proc/self/mem", *extra)
    assert code == 2 and out == "" and err.startswith("moeconf: error: /proc/self/mem: cannot read: ")


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
@pytest.mark.parametrize("command", ["explain", "fit"])
def test_an_engine_version_of_5000_digits_is_refused(capsys: pytest.CaptureFixture[str], engine: str,
                                                     command: str) -> None:
    extra = ["--gpu", "24GiB"] if command == "fit" else []
    code, _, err = cli(capsys, command, str(MANIFEST), "--engine", engine, "--engine-version", "b" + "9" * 5000,
                       *extra)
    assert code == 2 and err.startswith("moeconf: error: --engine-version: ") and "'b9999999999999999999...9999" in err
    assert len(err) < 400


def test_an_engine_version_of_5000_digits_in_a_plan_is_located(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text(BASE + f'[engine]\nversion = "b{"9" * 5000}"\n')
    from moeconf.compile import compile_plan

    with pytest.raises(PlanError, match="write a build number") as e:
        compile_plan(p)
    assert e.value.line == 6


@pytest.mark.parametrize(("text", "line", "message"), [
    ("tool = 5\n", 1, "tool must be a table"),
    ("[tool]\nmoeconf = 5\n", 2, "[tool.moeconf] must be a table, not an integer"),
    ("[tool.moeconf]\nengine = \"llama.cpp\"\nx = [\n", 4, "TOML syntax"),
])
def test_pyproject_errors_are_located(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int,
                                      message: str) -> None:
    """`tool = 5` in pyproject.toml was an internal error; a TOML error had no line or column."""
    (tmp_path / "pyproject.toml").write_text(text)
    (tmp_path / "run.sh").write_text("llama-server -m m.gguf -ot exps=CPU\n")
    code, _, err = cli(capsys, "lint", str(tmp_path / "run.sh"))
    assert code == 2 and f"{tmp_path / 'pyproject.toml'}:{line}:" in err and message in err


def test_a_moeconf_toml_syntax_error_has_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".moeconf.toml").write_text('engine = "llama.cpp"\n[severity\n')
    (tmp_path / "run.sh").write_text("llama-server -m m.gguf -ot exps=CPU\n")
    code, _, err = cli(capsys, "lint", str(tmp_path / "run.sh"))
    assert code == 2 and f"{tmp_path / '.moeconf.toml'}:2:10: TOML syntax" in err


def test_a_plan_copied_elsewhere_names_its_model_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said only `.../glm-4.5-air.manifest.json: no such file`: now the plan's line, and that
    `path` is relative to the plan's folder."""
    plan = tmp_path / "glm.toml"
    shutil.copy(EXAMPLES / "plans" / "glm-4.5-air.toml", plan)
    code, _, err = cli(capsys, "compile", str(plan))
    line = next(i for i, t in enumerate(plan.read_text().splitlines(), 1) if t.startswith("path"))
    assert code == 2 and err.startswith(f"moeconf: error: {plan}:{line}:1: [model] path ")
    assert f"no such file: {tmp_path.parent / 'models' / 'glm-4.5-air.manifest.json'}" in err
    assert f"relative to the plan's folder, {tmp_path}" in err
    # lint's plan-invalid says the same, at the same line
    code, out, _ = cli(capsys, "lint", str(plan))
    assert code == 1 and f"{plan}:{line}:1: MOE032 plan-invalid" in out and "no such file: " in out


def test_lint_plan_invalid_names_the_file_that_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`MOE032 plan-invalid no such file` said no file: a GGUF the plan names that is gone."""
    gone = tmp_path / "m-00001-of-00002.gguf"
    g = rg.minimal()
    g.kv += [("split.count", rg.U16, 2), ("split.no", rg.U16, 0)]
    gone.write_bytes(g.build())
    plan = tmp_path / "p.toml"
    plan.write_text(f'rules = ["experts -> cpu"]\n[model]\npath = "{gone.name}"\n')
    code, out, _ = cli(capsys, "lint", str(plan))
    assert code == 1 and "MOE032 plan-invalid" in out and str(tmp_path / "m-00002-of-00002.gguf") in out


def test_a_plan_toml_error_at_the_end_of_the_file_is_located(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text(BASE + "[flags]\nextra = [\n")
    with pytest.raises(PlanError, match="TOML syntax") as e:
        load_plan(p)
    assert (e.value.line, e.value.column) == (7, 1)  # where the text ends
