"""The pre-commit hooks through the real `pre-commit try-repo`, in a temporary git repository.

pre-commit installs moeconf into a virtualenv of its own; tests never reach the network, so it
installs from a local wheelhouse (`MOECONF_WHEELHOUSE`, built by `.ci/run` with `pip wheel`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO

WHEELHOUSE = os.environ.get("MOECONF_WHEELHOUSE")
pytestmark = pytest.mark.skipif(
    not WHEELHOUSE or not Path(WHEELHOUSE).is_dir() or shutil.which("pre-commit") is None,
    reason="needs MOECONF_WHEELHOUSE (a pip wheelhouse of moeconf and its dependencies; .ci/run builds it) "
    "and pre-commit",
)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def try_repo(cwd: Path, hook: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE), "PRE_COMMIT_HOME": str(home),
           "NO_COLOR": "1"}
    return subprocess.run(["pre-commit", "try-repo", str(REPO), hook, "--all-files", "--verbose"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def test_hooks_in_a_deployment_repo(tmp_path: Path) -> None:
    repo = tmp_path / "deploy-repo"
    shutil.copytree(EXAMPLES / "deploy", repo / "deploy")
    shutil.copytree(EXAMPLES / "models", repo / "models")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "deploy")
    home = tmp_path / "pre-commit-home"

    lint = try_repo(repo, "moeconf-lint", home)
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "MOE002 space-in-list" in lint.stdout
    assert "deploy/run-glm-air.sh:8:25" in lint.stdout

    check = try_repo(repo, "moeconf-check", home)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 generated file(s), 0 stale" in check.stdout

    plan = repo / "deploy" / "plans" / "qwen3-30b.toml"
    plan.write_text(plan.read_text().replace("layers 14..47", "layers 20..47"))
    stale = try_repo(repo, "moeconf-check", home)
    assert stale.returncode == 1
    assert "launch-qwen3-30b.sh: stale" in stale.stdout
