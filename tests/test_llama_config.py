r"""llama.cpp's config files (engines/llamaconfig.py): read as common/preset.cpp reads them,
applied before the environment and the command line as common/arg.cpp applies them, in explain,
fit and lint. Every test writes its files under tmp_path; none reads /etc/llama.cpp or ~/.config
(conftest sets MOECONF_LLAMA_CONFIG to none, and discovery is tested with paths of its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.engines.argvread import Arg
from moeconf.engines.cmdline import parse_invocation
from moeconf.engines.llamaconfig import (
    CONFIG_SINCE_BUILD,
    LlamaConfig,
    apply,
    discover,
    load,
    memory_env,
    parse_ini,
    stoi,
)
from moeconf.errors import MoeconfError
from moeconf.explanation import explain_invocation
from moeconf.memory import read_settings
from moeconf.model.load import load_inventory
from tests.conftest import EXAMPLES

MANIFEST = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
ML = engine("llama.cpp")

# A config.ini as a user would write one, in the shape of llama.cpp's docs/preset.md examples
# (a global section, per-model sections, comments), with placement and memory keys.
REAL_LOOKING = """\
; /etc/llama.cpp/config.ini -- shared by every llama.cpp program on this box
version = 1

[*]
ctx-size             = 32768
cache-type-k         = q8_0
cache-type-v         = q8_0
flash-attn           = on
kv-unified           = 1
parallel             = 2
n-gpu-layers         = 999
override-tensor      = blk\\.(4[0-7])\\.ffn_.*_exps=CPU   # the last 8 expert layers stay in RAM

# llama-server router presets: ignored by config files
[Qwen3-30B-A3B]
hf                   = unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M
ctx-size             = 131072
"""


def write(tmp_path: Path, text: str, name: str = "config.ini") -> str:
    p = tmp_path / name
    p.write_bytes(text.encode())
    return str(p)


def cfg_of(tmp_path: Path, *texts: str) -> LlamaConfig:
    return load([write(tmp_path, t, f"c{k}.ini") for k, t in enumerate(texts)])


def words(cfg: LlamaConfig, binary: str | None = "llama-server", eng: object = ML) -> list[list[str]]:
    return [s.words() for s in apply(cfg, eng, binary).settings]  # type: ignore[arg-type]


def invocation(cfg: LlamaConfig | None, argv: list[str], env: dict[str, str] | None = None,
               eng: object = ML) -> object:
    return parse_invocation([Arg(a) for a in argv], eng, {k: Arg(v) for k, v in (env or {}).items()},  # type: ignore[arg-type]
                            cfg)


def settings(cfg: LlamaConfig | None, argv: list[str], env: dict[str, str] | None = None) -> object:
    inv = invocation(cfg, argv, env)
    return read_settings(argv, ML, memory_env(inv.config, env or {}))  # type: ignore[attr-defined]


# --- the file format (common/preset.cpp parse_ini_from_file) ------------------------------------

def test_real_looking_config(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, REAL_LOOKING)
    applied = apply(cfg, ML, "llama-server")
    got = {s.entry.key: (s.value, s.entry.line) for s in applied.settings}
    assert got["ctx-size"] == ("32768", 5)
    assert got["override-tensor"] == (r"blk\.(4[0-7])\.ffn_.*_exps=CPU", 12)  # the comment is not the value
    assert got["kv-unified"] == ("true", 9)
    assert "version" not in got and "hf" not in got  # reserved key; a named section
    assert [(s[1], s[2]) for s in applied.sections] == [("Qwen3-30B-A3B", 15)]
    # applied in the order of each option's first spelling (strcmp), not the file's
    assert [s.option.first for s in applied.settings] == ["-c", "-ctk", "-ctv", "-fa", "-kvu", "-ngl", "-np", "-ot"]


def test_inline_comments_and_blanks(tmp_path: Path) -> None:
    f = parse_ini("a = x y  ; c\nb=1#c\nc =\n\n  ; comment\n# c\n", "p")
    d = f.sections["default"]
    assert (d["a"].value, d["b"].value, d["c"].value) == ("x y", "1", "")
    assert d["a"].value_column == 5


def test_line_endings_count_lines(tmp_path: Path) -> None:
    f = parse_ini("a = 1\r\nb = 2\rc = 3\n", "p")
    assert [e.line for e in f.sections["default"].values()] == [1, 2, 3]


def test_a_header_starts_its_section_afresh(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "ctx-size = 1\n[*]\nbatch-size = 64\n[default]\nubatch-size = 32\n[*]\nctx-size = 2\n")
    # the keys before any header are the default section's: `[default]` drops them; the second `[*]` the first's
    assert words(cfg) == [["-c", "2"], ["-ub", "32"]]


def test_spaced_section_names_are_named_sections(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "[ * ]\nctx-size = 5\n[default ]\nbatch-size = 7\n")
    applied = apply(cfg, ML, "llama-server")
    assert applied.settings == []
    assert [name for _p, name, _l in applied.sections] == ["* ", "default "]


@pytest.mark.parametrize(("text", "line", "column", "words_"), [
    ("ctx-size = 1\n  batch-size = 2\n", 2, 1, "indented"),
    ("ctx-size 4096\n", 1, 10, "expected '='"),
    ("[*\nctx-size = 1\n", 1, 1, "without its ']'"),
    ("[*] x\n", 1, 5, "after the section header"),
    ("= 3\n", 1, 1, "cannot start a line"),
    ("a = 1\n-ot = x\n", 2, 1, "cannot start a line"),
])
def test_lines_llama_cpp_refuses(tmp_path: Path, text: str, line: int, column: int, words_: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(MoeconfError) as e:
        load([path])
    assert (e.value.path, e.value.line, e.value.column) == (path, line, column)
    assert words_ in e.value.message and "every program stops" in e.value.message


def test_not_utf8_names_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "config.ini"
    p.write_bytes(b"ctx-size = 1\nhf = caf\xe9\n")
    with pytest.raises(MoeconfError) as e:
        load([str(p)])
    assert (e.value.line, e.value.column) == (2, 9)


def test_unreadable_and_special_files(tmp_path: Path) -> None:
    with pytest.raises(MoeconfError, match="cannot read"):
        load([str(tmp_path / "missing.ini")])
    with pytest.raises(MoeconfError, match="not a regular file"):
        load([str(tmp_path)])


# --- keys, values, sections and order (common/preset.cpp load_from_ini, apply_to_params) --------

def test_keys_are_names_or_variables_case_and_underscore_matter(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "LLAMA_ARG_BATCH = 64\nub = 32\nctx_size = 9\nCTX-SIZE = 9\n")
    applied = apply(cfg, ML, "llama-server")
    assert [s.words() for s in applied.settings] == [["-b", "64"], ["-ub", "32"]]
    why = {e.key: w for e, w in applied.ignored}
    assert "did you mean ctx-size?" in why["ctx_size"] and set(why) == {"ctx_size", "CTX-SIZE"}


def test_of_two_keys_for_one_option_the_last_sorted_applies(tmp_path: Path) -> None:
    # file order says `override-tensor` first; std::map order puts `ot` first, so `override-tensor` wins
    cfg = cfg_of(tmp_path, "override-tensor = a=CPU\not = b=CPU\nLLAMA_ARG_CTX_SIZE = 1\nctx-size = 2\n")
    assert words(cfg) == [["-c", "2"], ["-ot", "a=CPU"]]


def test_switch_values(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "no-kv-offload = true\nswa-full = false\nkv-unified = yes\n")
    got = {s.entry.key: s.words() for s in apply(cfg, ML, "llama-server").settings}
    assert got == {"no-kv-offload": ["-nkvo"], "swa-full": ["--swa-full"], "kv-unified": ["-no-kvu"]}


def test_the_negative_variable_name_is_not_reversed(tmp_path: Path) -> None:
    # a negative NAME reverses the value (parse_bool_arg); the LLAMA_ARG_NO_* variable as a key does not
    cfg = cfg_of(tmp_path, "LLAMA_ARG_NO_KV_OFFLOAD = 1\n")
    assert words(cfg) == [["-kvo"]]
    assert settings(cfg, ["llama-server"]).offload_kqv is True  # type: ignore[attr-defined]


def test_a_switch_without_negative_applies_whatever_the_value(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "cpu-moe = false\n")
    inv = invocation(cfg, ["llama-server", "-ngl", "99"])
    assert len(inv.cpu_moe) == 1  # type: ignore[attr-defined]


def test_numbers_read_as_stoi(tmp_path: Path) -> None:
    assert (stoi("4096abc"), stoi("  -3"), stoi("+7"), stoi("x1"), stoi(""), stoi("99999999999")) == (
        4096, -3, 7, None, None, None)
    assert words(cfg_of(tmp_path, "ctx-size = 4096abc\n")) == [["-c", "4096"]]


@pytest.mark.parametrize(("text", "column", "why"), [
    ("ctx-size = big\n", 12, "not a number"),
    ("cache-type-k = q8\n", 16, "takes f32"),
    ("flash-attn = ON\n", 14, "takes on"),
    ("n-cpu-moe = -1\n", 13, ">= 0"),
    ("override-tensor = exps\n", 19, "has no '='"),
])
def test_values_the_engine_stops_on(tmp_path: Path, text: str, column: int, why: str) -> None:
    cfg = cfg_of(tmp_path, "\n" + text)
    with pytest.raises(MoeconfError) as e:
        apply(cfg, ML, "llama-server")
    assert (e.value.line, e.value.column) == (2, column) and why in e.value.message


def test_a_program_reads_only_the_keys_it_knows(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "cache-ram = 0\nkv-unified = 1\n")
    assert words(cfg, "llama-server") == [["-cram", "0"], ["-kvu"]]
    assert words(cfg, "llama-cli") == [["-cram", "0"]]  # llama-cli has no -kvu
    assert words(cfg, "llama-completion") == []
    assert words(cfg, "llama-bench") == []  # its own parser reads no config file


def test_only_mainline_since_b10398(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "ctx-size = 5\n")
    assert words(cfg, eng=engine("llama.cpp", f"b{CONFIG_SINCE_BUILD}")) == [["-c", "5"]]
    assert words(cfg, eng=engine("llama.cpp", f"b{CONFIG_SINCE_BUILD - 1}")) == []
    assert words(cfg, eng=engine("ik_llama.cpp", "0.1.5")) == []
    assert words(cfg, eng=engine("ik_llama.cpp")) == []


def test_global_section_before_default_and_files_in_order(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "ot = a=CPU\nctx-size = 1\n[*]\not = b=CPU\nctx-size = 2\n",
                 "[*]\not = c=CPU\nctx-size = 3\n")
    inv = invocation(cfg, ["llama-server"])
    assert [it.text for it in inv.items()] == ["b=CPU", "a=CPU", "c=CPU"]  # type: ignore[attr-defined]
    assert inv.ctx_size.text == "3"  # type: ignore[attr-defined]  # the later file wins a value option


# --- precedence: config < environment < command line (common/arg.cpp common_params_parse_ex) -----

def test_value_option_config_then_env_then_cli(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "ctx-size = 1024\ncache-type-k = q8_0\n")
    assert settings(cfg, ["llama-server"]).n_ctx == 1024  # type: ignore[attr-defined]
    assert settings(cfg, ["llama-server"], {"LLAMA_ARG_CTX_SIZE": "2048"}).n_ctx == 2048  # type: ignore[attr-defined]
    s = settings(cfg, ["llama-server", "-c", "4096"], {"LLAMA_ARG_CTX_SIZE": "2048"})
    assert s.n_ctx == 4096 and s.cache_type_k == "q8_0"  # type: ignore[attr-defined]


def test_negative_env_beats_the_config(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "kv-offload = on\n")
    assert settings(cfg, ["llama-server"], {"LLAMA_ARG_NO_KV_OFFLOAD": "1"}).offload_kqv is False  # type: ignore[attr-defined]


def test_ngl_config_then_cli(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "n-gpu-layers = 10\n")
    assert invocation(cfg, ["llama-server"]).n_gpu_layers() == 10  # type: ignore[attr-defined]
    assert invocation(cfg, ["llama-server"], {"LLAMA_ARG_N_GPU_LAYERS": "20"}).n_gpu_layers() == 20  # type: ignore[attr-defined]
    assert invocation(cfg, ["llama-server", "-ngl", "30"], {"LLAMA_ARG_N_GPU_LAYERS": "20"}).n_gpu_layers() == 30  # type: ignore[attr-defined]


def test_ot_of_the_config_comes_first_and_wins(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "override-tensor = blk\\.0\\.ffn_up_exps=CPU\n")
    argv = ["llama-server", "-ngl", "99", "-ot", "blk\\.0\\.ffn_.*_exps=CUDA0"]
    inv = invocation(cfg, argv, {"LLAMA_ARG_OVERRIDE_TENSOR": "blk\\.0\\.ffn_up_exps=CUDA0"})
    assert [it.text for it in inv.items()] == [  # type: ignore[attr-defined]
        "blk\\.0\\.ffn_up_exps=CPU", "blk\\.0\\.ffn_up_exps=CUDA0", "blk\\.0\\.ffn_.*_exps=CUDA0"]
    ex = explain_invocation(load_inventory(MANIFEST), inv, ["CUDA0"])  # type: ignore[arg-type]
    assert ex.placement.devices["blk.0.ffn_up_exps.weight"] == "CPU"
    assert ex.placement.devices["blk.0.ffn_down_exps.weight"] == "CUDA0"
    assert ex.placement.reasons["blk.0.ffn_up_exps.weight"].startswith("-ot item 1 (config ")


def test_cpu_moe_of_the_config_beats_the_lines_ot(tmp_path: Path) -> None:
    cfg = cfg_of(tmp_path, "cpu-moe = 1\n")
    inv = invocation(cfg, ["llama-server", "-ngl", "99", "-ot", "exps=CUDA0"])
    ex = explain_invocation(load_inventory(MANIFEST), inv, ["CUDA0"])  # type: ignore[arg-type]
    assert ex.placement.devices["blk.3.ffn_up_exps.weight"] == "CPU"


# --- discovery (common_params_apply_system_config, fs_get_config_directory) -----------------------

def test_discovery_posix(tmp_path: Path) -> None:
    sysf = str(tmp_path / "etc.ini")
    assert discover({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}, windows=False, system=sysf) == [
        sysf, "/x/llama.cpp/config.ini"]
    assert discover({"XDG_CONFIG_HOME": "", "HOME": "/h"}, windows=False, system=sysf) == [
        sysf, "/h/.config/llama.cpp/config.ini"]
    assert discover({}, windows=False, system=sysf, home="/pw")[1] == "/pw/.config/llama.cpp/config.ini"


def test_discovery_windows() -> None:
    import os

    got = discover({"PROGRAMDATA": "P", "APPDATA": "A", "XDG_CONFIG_HOME": "/x"}, windows=True)
    assert got == [os.path.join("P", "llama.cpp", "config.ini"), os.path.join("A", "llama.cpp", "config.ini")]
    assert discover({}, windows=True) == []


def test_load_choices(tmp_path: Path) -> None:
    a = write(tmp_path, "ctx-size = 1\n", "a.ini")
    assert load(off=True, environ={"MOECONF_LLAMA_CONFIG": a}).files == []
    assert [f.path for f in load(environ={"MOECONF_LLAMA_CONFIG": a}).files] == [a]
    assert load(environ={"MOECONF_LLAMA_CONFIG": ""}).files == []
    assert [f.path for f in load([a], environ={"MOECONF_LLAMA_CONFIG": ""}).files] == [a]


def test_discovery_reads_only_existing_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config" / "llama.cpp").mkdir(parents=True)
    (home / ".config" / "llama.cpp" / "config.ini").write_text("ctx-size = 7\n")
    cfg = load(environ={"HOME": str(home), "XDG_CONFIG_HOME": ""})
    assert [f.path for f in cfg.files][-1] == str(home / ".config" / "llama.cpp" / "config.ini")
    assert cfg.looked[0] == "/etc/llama.cpp/config.ini"


# --- the commands ----------------------------------------------------------------------------

def test_explain_attributes_each_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, REAL_LOOKING)
    assert main(["explain", MANIFEST, "--llama-config", path, "--json", "--", "llama-server", "-c", "8192"]) == 0
    data = json.loads(capsys.readouterr()[0])
    lc = data["llama_config"]
    assert lc["files"] == [path]
    by_key = {s["key"]: s for s in lc["settings"]}
    assert by_key["ctx-size"]["line"] == 5 and by_key["ctx-size"]["overridden_by"] == "-c on the command line"
    assert by_key["override-tensor"]["adds_first"] and by_key["override-tensor"]["file"] == path
    assert data["placement"]["blk.40.ffn_up_exps.weight"] == "CPU"
    assert data["reasons"]["blk.40.ffn_up_exps.weight"].startswith(f"-ot item 1 (config {path}:12)")
    assert data["memory_problems"] == []
    main(["explain", MANIFEST, "--llama-config", path, "--", "llama-server", "-c", "8192"])
    out = capsys.readouterr()[0]
    assert f"{path}:6: cache-type-k = q8_0  -> -ctk q8_0  (applied)" in out
    assert "-ctk q8_0 -ctv q8_0" in out  # the memory table is at the config's cache types


def test_explain_without_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "cpu-moe = 1\n")
    main(["explain", MANIFEST, "--no-llama-config", "--json", "--", "llama-server", "-ngl", "99"])
    assert json.loads(capsys.readouterr()[0])["placement"]["blk.3.ffn_up_exps.weight"] == "CUDA0"
    main(["explain", MANIFEST, "--llama-config", path, "--json", "--", "llama-server", "-ngl", "99"])
    assert json.loads(capsys.readouterr()[0])["placement"]["blk.3.ffn_up_exps.weight"] == "CPU"


def test_explain_bad_config_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[*]\n ctx-size = 5\n")
    assert main(["explain", MANIFEST, "--llama-config", path, "--", "-ngl", "99"]) == 2
    err = capsys.readouterr()[1]
    assert f"{path}:2:1:" in err and "Traceback" not in err


def test_fit_writes_memory_settings_and_refuses_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "[*]\ncache-type-k = q8_0\nctx-size = 16384\n", "good.ini")
    assert main(["fit", MANIFEST, "--gpu", "8GiB", "--llama-config", good, "-c", "8192"]) == 0
    out, err = capsys.readouterr()
    first = out.splitlines()[0]
    assert "-ctk q8_0" in first and "-c 8192" in first and "-c 16384" not in first
    assert f"{good}:2: cache-type-k" in err
    bad = write(tmp_path, "\n\noverride-tensor = exps=CPU\n", "bad.ini")
    assert main(["fit", MANIFEST, "--gpu", "8GiB", "--llama-config", bad]) == 2
    assert f"{bad}:3:1:" in capsys.readouterr()[1]


def _lint(tmp_path: Path, name: str, body: str, ini: str) -> list[str]:
    from moeconf.linting.linter import lint

    (tmp_path / ".moeconf.toml").write_text(f'engine = "llama.cpp"\n[models]\n"m.gguf" = "{MANIFEST}"\n')
    (tmp_path / name).write_text(body)
    res = lint([str(tmp_path / name)], llama_config=load([write(tmp_path, ini)]))
    return [f.code for f in res.findings]


def test_lint_applies_the_hosts_files_to_shell_launches_only(tmp_path: Path) -> None:
    ini = "[*]\ncpu-moe = on\n"
    assert "MOE043" in _lint(tmp_path, "run.sh", "llama-server -m m.gguf -ngl 999 -ot 'blk\\.1\\.ffn_.*=CUDA0'\n", ini)
    compose = ("services:\n  llm:\n    image: ghcr.io/ggml-org/llama.cpp:server-cuda\n    command: -m m.gguf -ngl 999 "
               "-ot 'blk\\.1\\.ffn_.*=CUDA0'\n")
    assert "MOE043" not in _lint(tmp_path, "compose.yaml", compose, ini)
    assert "MOE011" not in _lint(tmp_path, "compose.yaml", compose, ini)


def test_lint_memory_reads_the_config(tmp_path: Path) -> None:
    from moeconf.linting.linter import lint

    (tmp_path / ".moeconf.toml").write_text(f'engine = "llama.cpp"\n[models]\n"m.gguf" = "{MANIFEST}"\n')
    (tmp_path / "run.sh").write_text("llama-server -m m.gguf -ngl 999 -ctv q8_0\n")
    ini = write(tmp_path, "cache-type-k = q4_1\nflash-attn = off\n")
    codes = [f.code for f in lint([str(tmp_path / "run.sh")], llama_config=load([ini])).findings]
    assert "MOE041" in codes  # a quantized V cache with -fa off (from the file): the engine refuses
    assert "MOE041" not in [f.code for f in lint([str(tmp_path / "run.sh")]).findings]


def test_the_config_ot_is_no_repeat_on_the_line(tmp_path: Path) -> None:
    codes = _lint(tmp_path, "run.sh", "llama-server -m m.gguf -ngl 999 -ot 'exps=CPU'\n", "ot = blk\\.0\\.=CUDA0\n")
    assert "MOE024" not in codes
    codes = _lint(tmp_path, "run.sh", "llama-server -m m.gguf -ngl 999 -ot 'exps=CPU' -ot 'x=CPU'\n", "\n")
    assert "MOE024" in codes
