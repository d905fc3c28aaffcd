"""The example outputs of the README and docs/*.md are what the commands print today: every ```sh
block running `moeconf` that is followed by an output block is run (in-process) and compared line
by line; a line `...` in the page stands for lines left out."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest

from moeconf.cli import main
from tests.conftest import REPO, doc_pages

_BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _examples() -> list[tuple[str, str]]:
    blocks = [b for page in doc_pages() for b in _BLOCK.findall(page.read_text())]
    out = []
    for (lang, body), (next_lang, printed) in itertools.pairwise(blocks):
        if lang != "sh" or next_lang != "":
            continue
        cmd = body.strip().split(" && ")[-1]
        words = shlex.split(cmd)
        paths = [w for w in words[2:] if w.endswith((".json", ".toml", ".gguf"))]
        if Path(words[0]).name != "moeconf" or not all((REPO / w).exists() for w in paths):
            continue  # a command on the reader's own files
        out.append((body.strip(), printed))
    return out


EXAMPLES = _examples()


def _matches(want: list[str], got: list[str]) -> bool:
    """`want` with `...` lines standing for any run of lines."""
    if not want:
        return not got
    if want[0].strip() == "...":
        return any(_matches(want[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and want[0].rstrip() == got[0].rstrip() and _matches(want[1:], got[1:])


def test_the_readme_has_examples_to_check() -> None:
    assert len(EXAMPLES) >= 7, [c for c, _ in EXAMPLES]


@pytest.mark.parametrize(("command", "printed"), EXAMPLES, ids=[c[:60] for c, _ in EXAMPLES])
def test_readme_output_is_what_the_command_prints(command: str, printed: str, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("NO_COLOR", "1")
    *setup, cmd = command.split(" && ")
    for step in setup:
        words = shlex.split(step)
        if words[0] == "cd":
            monkeypatch.chdir(words[1])
    main(shlex.split(cmd)[1:])
    out, err = capsys.readouterr()
    got = (out + err).splitlines()
    want = printed.splitlines()
    assert _matches(want, got), "README shows:\n" + printed + "\nthe command prints:\n" + "\n".join(got)
