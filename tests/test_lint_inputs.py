"""Every input surface of `moeconf lint` is strict, bounded and loud: broken files exit 2 with
file:line:col, special files are skipped with a note, values the file does not fix are not
checked (and say so), expansions and findings are capped, and nothing outside the tree is quoted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from moeconf import cli
from moeconf.linting.linter import MAX_ITEMS, MAX_PER_FILE, MAX_PER_RULE, lint
from moeconf.linting.shell import split_commands
from moeconf.linting.sources import MAX_LAUNCHES, read_source


def run_lint(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["lint", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(text)
    return p


# (file name, text, line:col of the MOE090 finding, words its message must contain)
BROKEN = [
    ("compose.yml", "services:\n  a:\n    image: ghcr.io/ggml-org/llama.cpp:server\n    command: [ -m\n",
     "5:1", "YAML syntax"),
    ("swap.yaml", "models:\n  x:\n    cmd: \"llama-server -m /m.gguf\n", "4:1", "YAML syntax"),
    ("swap.yaml", "models:\n  - name: x\n    cmd: llama-server -m /m.gguf\n", "2:3", "must be a mapping"),
    ("swap.yaml", "models:\n  x:\n    command: llama-server -m /m.gguf -ot exps=CPU\n", "3:5", "did you mean `cmd:`"),
    ("swap.yaml", "models:\n  x:\n    cmd:\n      - llama-server\n      - -ot\n      - exps=CPU\n", "4:7",
     "not a list"),
    ("swap.yaml", "models:\n  x:\n    cmd: {a: 1}\n", "3:10", "must be a string, not a mapping"),
    ("swap.yaml", "macros:\n  m: [1, 2]\nmodels:\n  x:\n    cmd: llama-server\n", "2:6", "must be a string"),
    ("swap.yaml", "models:\n  x:\n    cmd: llama-server -ot 'exps=CPU\n", "3:27", "unterminated single quote"),
    ("compose.yml", "services:\n  a:\n    image: ghcr.io/ggml-org/llama.cpp:server\n    command: [-m, [x, y]]\n",
     "4:19", "must be a string, not a list"),
    ("compose.yml", "services:\n  a:\n    image: [ghcr.io/ggml-org/llama.cpp:server]\n", "3:12",
     "must be a string, not a list"),
    ("compose.yml", "services:\n  a:\n    image: ghcr.io/ggml-org/llama.cpp:server\n    environment: 5\n", "4:18",
     "environment must be a mapping"),
    ("compose.yml", "services:\n  - a\n", "2:3", "must be a mapping of service names"),
    ("compose.yml", "services:\n  a: [1]\n", "2:6", "must be a mapping"),
    ("run.service", "[Service]\nExecStart=-\n", "2:11", "no command"),
    ("run.service", "[Service]\nExecStart=/llama-server -ot 'exps=CPU\n", "2:29", "unterminated single quote"),
    ("run.sh", "llama-server -m /m.gguf -ot 'exps=CPU\n", "1:29", "unterminated single quote"),
    ("run.sh", 'llama-server -m /m.gguf -ot "exps=CPU\n', "1:29", "unterminated double quote"),
    ("run.sh", "llama-server -m /m.gguf -ot $(echo exps=CPU\n", "1:29", "unterminated $("),
    ("run.sh", "# moeconf: engine=banana\nllama-server -m /m.gguf -ot exps=CPU\n", "2:1", "unknown engine"),
]


@pytest.mark.parametrize(("name", "text", "where", "words"), BROKEN)
def test_broken_input_exits_2_with_position(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                            text: str, where: str, words: str) -> None:
    write(tmp_path, name, text)
    code, out, err = run_lint(capsys, str(tmp_path))
    assert code == 2, out
    hits = [line for line in out.splitlines() if "MOE090 input-invalid" in line]
    assert hits and f":{where}: " in hits[0] and words in hits[0], out
    assert "input-invalid" in err
    assert "ends with whitespace" not in out  # the old misleading message for an unterminated quote


def test_broken_file_does_not_stop_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "a.yml", "services: [\n")
    write(tmp_path, "b.sh", "llama-server -m /m.gguf -ot 'exps=CPU,'\n")
    code, out, _ = run_lint(capsys, "--format", "json", str(tmp_path))
    assert code == 2
    assert '"MOE003"' in out and '"MOE090"' in out  # b.sh still linted


def test_valid_systemd_reset_and_unrelated_yaml_are_not_broken(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "override.service", "[Service]\nExecStart=\nExecStart=/usr/bin/llama-server -m /m.gguf -fit off\n")
    write(tmp_path, "dbt.yml", "version: 2\nmodels:\n  - name: orders\n    description: x\n")
    write(tmp_path, "k8s.yaml", "a: 1\n---\nb: [1, 2]\n")
    write(tmp_path, "ci.yml", "jobs:\n  x: !reference [a, b]\n")
    code, out, _ = run_lint(capsys, str(tmp_path))
    assert code in (0, 1) and "MOE090" not in out, out


# --- special files --------------------------------------------------------------------------

def test_special_files_are_skipped_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "fifo.sh")
    os.mkfifo(tmp_path / "fifo-plan.toml")
    (tmp_path / "dangling.yml").symlink_to(tmp_path / "nowhere")
    (tmp_path / "zero.sh").symlink_to("/dev/zero")
    (tmp_path / "pipe-link.env").symlink_to(tmp_path / "fifo.sh")
    os.mkfifo(tmp_path / "runme")  # no extension: not sniffed (that would block)
    write(tmp_path, "ok.sh", "llama-server -m /m.gguf -ot 'exps=CPU,'\n")
    code, out, _ = run_lint(capsys, str(tmp_path))
    assert code == 1, out
    for name, what in [("fifo.sh", "FIFO"), ("dangling.yml", "broken symbolic link"), ("zero.sh", "character device"),
                       ("pipe-link.env", "FIFO"), ("fifo-plan.toml", "FIFO")]:
        lines = out.splitlines()
        assert any(name in ln and "MOE091 input-skipped [info]" in ln and what in ln for ln in lines), (name, out)
    assert "MOE003" in out


def test_model_paths_must_be_regular_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "model.gguf")
    write(tmp_path, "run.sh", "# moeconf: model=model.gguf\nllama-server -m /x.gguf -ot exps=CPU\n")
    code, out, _ = run_lint(capsys, str(tmp_path / "run.sh"))
    assert code in (0, 1) and "not a regular file" in out, out
    write(tmp_path, ".moeconf.toml", '[models]\n"x.gguf" = "model.gguf"\n')
    code, _, err = run_lint(capsys, str(tmp_path / "run.sh"))
    assert code == 2 and ".moeconf.toml:2:1" in err and "not a regular file" in err


def test_model_outside_the_tree_is_never_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "outside" / "secret.gguf"
    secret.parent.mkdir()
    secret.write_text("TOKEN=hunter2-very-secret\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    write(repo, "run.sh", f"llama-server -m {secret} -ot exps=CPU\n")
    inside = write(repo, "inside.gguf", "TOKEN=inside" + "x" * 40)
    write(repo, "run2.sh", f"llama-server -m {inside} -ot exps=CPU\n")
    _, out, err = run_lint(capsys, str(repo))
    assert "TOKEN" not in out.replace("TOKEN=inside", "") and "hunter2" not in out + err, out
    assert "not a GGUF file moeconf can read" in out
    assert "b'TOKE'" in out  # a file inside the tree may be quoted (its own error message)


# --- values the file does not fix -------------------------------------------------------------

@pytest.mark.parametrize("value", ['"blk\\.$(seq 1 3)\\.=CUDA0"', '"`cat ot.txt`"', '"exps=$GPU"', '"${OT}"',
                                   '"exps=${GPU:-$OTHER}"', "$(printf %s 'x=CUDA9')"])
def test_substitutions_are_not_checked_but_noted(tmp_path: Path, value: str) -> None:
    p = write(tmp_path, "run.sh", f"llama-server -m /m.gguf -fit off -ot {value}\n")
    result = lint([str(p)])
    codes = {f.code for f in result.findings}
    assert "MOE092" in codes, [f.text() for f in result.findings]
    assert not codes & {"MOE005", "MOE006", "MOE007", "MOE004", "MOE002", "MOE001"}, [f.text() for f in result.findings]


def test_known_variables_are_still_checked(tmp_path: Path) -> None:
    p = write(tmp_path, "run.sh", "OT='exps=CPU,'\nllama-server -m /m.gguf -fit off -ot \"$OT\"\n")
    assert "MOE003" in {f.code for f in lint([str(p)]).findings}


def test_heredoc_bodies_are_data_unless_fed_to_a_shell(tmp_path: Path) -> None:
    p = write(tmp_path, "run.sh", (
        "cat > start.sh <<'EOF'\nllama-server -m /m.gguf -ot 'blk.1.=CPU'\nEOF\n"
        "cat <<-END\n\tllama-server -m /m.gguf -ot 'blk.2.=CPU'\n\tEND\n"
        "bash <<EOF\nllama-server -m /m.gguf -fit off -ot 'blk.3.=CPU'\nEOF\n"))
    src = read_source(str(p))
    assert src is not None
    assert [la.line for la in src.launches] == [8]


# --- budgets and caps -------------------------------------------------------------------------

def test_shell_doubling_stops_at_the_budget(tmp_path: Path) -> None:
    text = "A=x\n" + "A=$A$A\n" * 64 + "llama-server -m /m.gguf -ot \"$A=CPU\"\n"
    result = lint([str(write(tmp_path, "run.sh", text))])
    msgs = [f.message for f in result.findings if f.code == "MOE092"]
    assert msgs and "too large" in msgs[0]


def test_yaml_alias_bomb_is_not_expanded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ['a0: &a0 "llama-server -ot exps=CPU"']
    for i in range(1, 30):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines += ["services:", "  s:", "    image: ghcr.io/ggml-org/llama.cpp:server", "    command: *a29"]
    write(tmp_path, "compose.yml", "\n".join(lines) + "\n")
    code, out, _ = run_lint(capsys, str(tmp_path))
    assert code == 2 and "must be a string, not a list" in out


def test_yaml_aliases_cannot_multiply_work(tmp_path: Path) -> None:
    big = "-ot " + ",".join(["exps=CPU"] * 20000)
    lines = [f'x-cmd: &cmd "llama-server {big}"', "services:"]
    lines += [f"  s{i}:\n    image: ghcr.io/ggml-org/llama.cpp:server\n    command: *cmd" for i in range(300)]
    result = lint([str(write(tmp_path, "compose.yml", "\n".join(lines) + "\n"))])
    assert any(f.code == "MOE092" and "alias" in f.message for f in result.findings)


def test_nested_macros_stop_at_the_budget(tmp_path: Path) -> None:
    lines = ["macros:", '  m0: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"']
    lines += [f'  m{i}: "' + "${m" + str(i - 1) + "}" * 1 + ("${m" + str(i - 1) + "}") * 15 + '"' for i in range(1, 6)]
    lines += ["models:", "  x:", "    cmd: llama-server -ot ${m5}=CPU"]
    result = lint([str(write(tmp_path, "swap.yaml", "\n".join(lines) + "\n"))])
    assert any(f.code == "MOE092" and "too large" in f.message for f in result.findings), result.findings


def test_items_beyond_the_engine_limit_are_reported_not_simulated(tmp_path: Path) -> None:
    ot = ",".join(f"blk\\.{i % 60}\\.ffn_up_exps=CPU" for i in range(MAX_ITEMS + 500))
    p = write(tmp_path, "run.sh", f"llama-server -m /m.gguf -fit off -ot '{ot}'\n")
    result = lint([str(p)])
    over = [f for f in result.findings if f.code == "MOE094"]
    assert over and over[0].severity == "error" and f"{MAX_ITEMS + 500}" in over[0].message
    p.write_text(f"# moeconf: engine=ik_llama.cpp\nllama-server -m /m.gguf -ot '{ot}'\n")
    notes = [f for f in lint([str(p)]).findings if f.code == "MOE092"]
    assert notes and "500 -ot item(s)" in notes[0].message


def test_findings_are_capped_with_a_count(tmp_path: Path) -> None:
    # findings of one rule on one -ot value are grouped; each value is its own group
    p = write(tmp_path, "run.sh", "llama-server -m /m.gguf -fit off" + " -ot 'exps=CPU,'" * (MAX_PER_RULE + 10) + "\n")
    result = lint([str(p)])
    trailing = [f for f in result.findings if f.code == "MOE003"]
    capped = [f for f in result.findings if f.code == "MOE093"]
    assert len(trailing) == MAX_PER_RULE and capped and "10 more MOE003" in capped[0].message
    lines = "".join(f"llama-server -m /m.gguf -fit off -ot 'blk.{i}.=CPU'\n" for i in range(MAX_PER_FILE))
    p.write_text(lines)
    result = lint([str(p)])
    assert len(result.findings) == MAX_PER_FILE + 1
    assert "more finding(s) in this file" in result.findings[-1].message or any(
        "more finding(s) in this file" in f.message for f in result.findings)


def test_launches_are_capped_with_a_count(tmp_path: Path) -> None:
    p = write(tmp_path, "run.sh", "llama-server -m /m.gguf -fit off\n" * (MAX_LAUNCHES + 7))
    src = read_source(str(p))
    assert src is not None and len(src.launches) == MAX_LAUNCHES
    assert [n.line for n in src.notes if n.kind == "capped"] == [MAX_LAUNCHES + 1]
    assert "(7 more line(s) below name an engine)" in src.notes[0].message


def test_huge_words_keep_positions_without_per_character_storage() -> None:
    word = "w" * 1_000_000
    cmds, _, _ = split_commands(f"llama-server --alias {word} -ot 'a=CPU'\n")
    w = cmds[0].words[2]
    assert w.length == 1_000_000 and len(w.runs) == 1 and w.at(999_999) == (1, 22 + 999_999)
    assert cmds[0].words[4].at(2) == (1, len("llama-server --alias ") + len(word) + len(" -ot '") + 1 + 2)


# --- config and rule names ----------------------------------------------------------------------

CONFIGS = [
    ("select = 5\n", "1:1", "select must be a list of strings, not an integer"),
    ("gpus = [1, 2]\n", "1:1", "gpus must be a list of strings"),
    ('select = ["MOE01O"]\n', "1:11", "did you mean 'MOE010'"),
    ('ignore = ["unescaped-dots"]\n', "1:11", "did you mean 'unescaped-dot'"),
    ('[severity]\nunescaped-dot = "warn"\n', "2:1", "not 'warn'"),
    ('[severity]\nunescapd-dot = "info"\n', "2:1", "did you mean 'unescaped-dot'"),
    ('[models]\n"m.gguf" = "missing.gguf"\n', "2:1", "which is missing"),
    ("selec = []\n", "1:1", "did you mean 'select'"),
    ("severity = 3\n", "1:1", "[severity] must be a table"),
    ("engine_version = 7600\n", "1:1", "engine_version must be a string"),
    ("models = 1\n", "1:1", "[models] must be a table"),
    ("fail_on = 'warn'\n", "1:1", "fail_on must be one of"),
]


@pytest.mark.parametrize(("config", "where", "words"), CONFIGS)
def test_config_errors_exit_2_with_position(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str,
                                            where: str, words: str) -> None:
    write(tmp_path, ".moeconf.toml", config)
    write(tmp_path, "run.sh", "llama-server -m /m.gguf -ot exps=CPU\n")
    code, _, err = run_lint(capsys, str(tmp_path))
    assert code == 2 and f".moeconf.toml:{where}:" in err and words in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("args", "words"), [(["--select", "MOE01O"], "did you mean 'MOE010'"),
                                             (["--ignore", "unescaped-dot,space-in-lst"], "'space-in-list'")])
def test_unknown_rule_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          words: str) -> None:
    write(tmp_path, "run.sh", "llama-server -m /m.gguf -ot exps=CPU\n")
    code, _, err = run_lint(capsys, *args, str(tmp_path))
    assert code == 2 and words in err


def test_meta_findings_can_be_ignored_but_broken_input_cannot(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "f.sh")
    write(tmp_path, "b.yml", "services: [\n")
    code, out, _ = run_lint(capsys, "--ignore", "input-skipped,input-invalid", str(tmp_path))
    assert code == 2 and "MOE091" not in out and "MOE090" in out


def test_unreadable_file_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    p = write(tmp_path, "run.sh", "llama-server -m /m.gguf\n")
    p.chmod(0)
    try:
        code, out, _ = run_lint(capsys, str(tmp_path))
    finally:
        p.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert code == 2 and "cannot read" in out


def test_compose_variables_from_dotenv_are_checked_others_noted(tmp_path: Path) -> None:
    write(tmp_path, ".env", "OT=exps=CPU,\n")
    p = write(tmp_path, "compose.yml", (
        "services:\n  a:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
        "    command: [-m, /m.gguf, -fit, 'off', -ot, '${OT}']\n"
        "  b:\n    image: ghcr.io/ggml-org/llama.cpp:server\n"
        "    environment:\n      LLAMA_ARG_OVERRIDE_TENSOR: ${UNSET}=CPU\n"))
    found = {(f.line, f.code) for f in lint([str(p)]).findings}
    assert (4, "MOE003") in found and (8, "MOE092") in found, found


def test_sarif_names_the_input_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    write(tmp_path, "a.yml", "services: [\n")
    code, out, _ = run_lint(capsys, "--format", "sarif", str(tmp_path))
    run = json.loads(out)["runs"][0]
    result = run["results"][0]
    assert code == 2 and result["ruleId"] == "MOE090"
    assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "MOE090"


def test_commands_with_too_many_words_are_noted_not_kept(tmp_path: Path) -> None:
    from moeconf.linting.shell import MAX_WORDS

    p = write(tmp_path, "run.sh", "llama-server -m /m.gguf " + "-c 1 " * MAX_WORDS + "'x y'\n"
                                   "llama-server -m /m.gguf -fit off -ot 'blk.1.=CPU'\n")
    src = read_source(str(p))
    assert src is not None and [la.line for la in src.launches] == [2]
    assert any(n.kind == "cannot-check" and f"{MAX_WORDS:,} words" in n.message for n in src.notes)


def test_overlong_items_are_noted_not_checked(tmp_path: Path) -> None:
    from moeconf.linting.linter import MAX_ITEM_CHARS

    long_item = "a" * MAX_ITEM_CHARS + "=CPU"
    p = write(tmp_path, "run.sh", f"llama-server -m /m.gguf -fit off -ot 'blk.1.=CPU,{long_item}'\n")
    found = [f for f in lint([str(p)]).findings if f.code in ("MOE009", "MOE092")]
    assert [(f.code, f.line, f.column) for f in found] == [("MOE092", 1, 50)]


def test_unreadable_file_is_a_user_error_even_as_root(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from moeconf.linting import sources

    def denied(path: str, limit: int | None = None, *, newline: str | None = None) -> str:
        raise PermissionError(13, "Permission denied")

    write(tmp_path, "run.sh", "llama-server -m /m.gguf\n")
    monkeypatch.setattr(sources, "read_regular", denied)
    code, out, _ = run_lint(capsys, str(tmp_path / "run.sh"))
    assert code == 2 and "MOE090" in out and "Permission denied" in out


def test_inline_ignore_cannot_hide_broken_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "run.sh", "# moeconf: engine=banana\n# moeconf: ignore[all]\nllama-server -m /m.gguf\n")
    code, out, _ = run_lint(capsys, str(tmp_path))
    assert code == 2 and "MOE090" in out


@pytest.mark.parametrize(("config", "words"), [("gpus = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
                                               ("select = " + "9" * 5000 + "\n", "4300 digits")])
def test_config_that_python_cannot_read_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        config: str, words: str) -> None:
    write(tmp_path, ".moeconf.toml", config)
    write(tmp_path, "run.sh", "llama-server -m /m.gguf\n")
    code, _, err = run_lint(capsys, str(tmp_path))
    assert code == 2 and words in err


def test_oversized_files_are_skipped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moeconf.linting import sources

    monkeypatch.setattr(sources, "MAX_FILE_BYTES", 100)
    p = write(tmp_path, "run.sh", "llama-server -m /m.gguf -ot 'blk.1.=CPU'\n" * 5)
    found = lint([str(p)]).findings
    assert [(f.code, f.severity) for f in found] == [("MOE091", "info")] and "larger than" in found[0].message


@pytest.mark.parametrize(("directive", "words"), [
    ("engine=ik_llama.cpp version=3.x", "ik_llama.cpp version '3.x'"),
    ("version=banana", "llama.cpp version 'banana': write a build number"),
    ("engine=ik_llama.cpp version=2025-13-01", "YYYY-MM-DD"),
])
def test_a_version_directive_moeconf_cannot_read_is_input_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  directive: str, words: str) -> None:
    """Before, an unreadable `version=` was taken silently as the newest code read."""
    write(tmp_path, "run.sh", f"# moeconf: {directive}\nllama-server -m m.gguf -ngl 99 -ot exps=CPU\n")
    code, out, _ = run_lint(capsys, str(tmp_path / "run.sh"))
    assert code == 2 and "MOE090 input-invalid" in out and "`# moeconf: version=` directive" in out and words in out


def test_the_config_version_belongs_to_the_config_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mainline build number in the config is not read as the ik_llama.cpp version of a launch
    that a directive or its binary names as ik."""
    write(tmp_path, ".moeconf.toml", 'engine = "llama.cpp"\nengine_version = "b7600"\n')
    write(tmp_path, "a.sh", "# moeconf: engine=ik_llama.cpp\nllama-server -m m.gguf -ngl 99 -ot exps=CPU\n")
    write(tmp_path, "b.sh", "/opt/ik_llama.cpp/build/bin/llama-server -m m.gguf -ngl 99 -ot exps=CPU\n")
    code, out, _ = run_lint(capsys, str(tmp_path))
    assert code == 0 and "MOE090" not in out
    found = lint([str(tmp_path)]).findings
    assert {f.code for f in found} == {"MOE000"}


def _bash_argv(tmp_path: Path, script: Path) -> list[str]:
    """What bash passes to llama-server when it runs `script` (a stand-in that prints its argv)."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "llama-server"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done\n')
    fake.chmod(0o755)
    run = subprocess.run(["bash", str(script)], capture_output=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                         cwd=tmp_path, timeout=30)
    return run.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize(("body", "where", "says"), [
    ("#!/usr/bin/env bash\r\nllama-server -m m.gguf -fit off \\\r\n  -ot 'blk\\.1\\.=CPU' \\\r\n  -c 8192\r\n",
     ":2:33:", "not as a line continuation"),
    ("llama-server -m m.gguf -fit off -ot exps=CPU\r\n", ":1:37:", "'exps=CPU\\r'"),
])
def test_crlf_script_is_an_error_as_bash_runs_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
                                                 where: str, says: str) -> None:
    script = tmp_path / "serve.sh"
    script.write_bytes(body.encode())
    argv = _bash_argv(tmp_path, script)  # the claim, checked against bash itself
    assert "exps=CPU" not in argv and "blk\\.1\\.=CPU" not in argv, argv
    assert cli.main(["lint", str(script)]) == 2
    out = capsys.readouterr().out
    assert f"serve.sh{where} MOE090 input-invalid" in out and says in out, out
    # the advice works: LF endings give the engine the flags, and lint no longer objects
    script.write_bytes(body.replace("\r\n", "\n").encode())
    argv = _bash_argv(tmp_path, script)
    assert "exps=CPU" in argv or "blk\\.1\\.=CPU" in argv, argv
    cli.main(["lint", str(script)])
    assert "MOE090" not in capsys.readouterr().out
