"""The lint hook's `files:` pattern (.pre-commit-hooks.yaml) passes every file `moeconf lint` reads:
pre-commit filters by name before lint sees a file, so a name the pattern misses is never checked
(an extensionless `#!/usr/bin/env bash` script was). Runs without pre-commit."""

from __future__ import annotations

import re

import pytest
import yaml

from moeconf.linting.sources import kind_of
from tests.conftest import REPO


def _lint_hook() -> dict[str, str]:
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    return next(h for h in hooks if h["id"] == "moeconf-lint")


def _passed(path: str) -> bool:
    hook = _lint_hook()
    return bool(re.search(hook["files"], path)) and not re.search(hook.get("exclude", "^$"), path)


SHEBANG = "#!/usr/bin/env bash\nllama-server -m m.gguf -ot exps=CPU\n"


@pytest.mark.parametrize(("path", "text"), [
    ("deploy/serve", SHEBANG),
    ("start-glm", "#!/bin/sh\nexec llama-server -m m.gguf\n"),
    ("deploy/run.sh", ""), ("run.bash", ""), ("run.zsh", ""),
    ("compose.yaml", ""), ("deploy/docker-compose.yml", ""), ("llama-swap.yaml", ""),
    (".env", ""), ("deploy/.env", ""), ("prod.env", ""), (".env.local", ""),
    ("llama.service", ""), ("plans/qwen3.toml", ""),
])
def test_every_file_lint_reads_reaches_the_hook(path: str, text: str) -> None:
    assert kind_of(path, text) is not None, f"{path}: lint no longer reads it; update this test"
    assert _passed(path), f"{path}: lint reads it, but the hook's files pattern never passes it to lint"


@pytest.mark.parametrize("path", ["pyproject.toml", ".moeconf.toml", "sub/pyproject.toml"])
def test_config_files_are_not_linted_as_plans(path: str) -> None:
    assert not _passed(path)
