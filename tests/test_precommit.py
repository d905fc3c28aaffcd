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
    serve = repo / "deploy" / "serve"  # no extension: lint knows it by its shebang
    serve.write_text("#!/usr/bin/env bash\nllama-server -m m.gguf -ngl 99 -fit off -ot 'blk\\.1\\.=CPU, exps=CPU'\n")
    serve.chmod(0o755)
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "deploy")
    home = tmp_path / "pre-commit-home"

    lint = try_repo(repo, "moeconf-lint", home)
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "MOE002 space-in-list" in lint.stdout
    assert "deploy/run-glm-air.sh:8:25" in lint.stdout
    assert "deploy/serve:2:" in lint.stdout, lint.stdout  # the extensionless script reached the hook

    check = try_repo(repo, "moeconf-check", home)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 generated file(s), 0 stale" in check.stdout

    plan = repo / "deploy" / "plans" / "qwen3-30b.toml"
    plan.write_text(plan.read_text().replace("layers 14..47", "layers 20..47"))
    stale = try_repo(repo, "moeconf-check", home)
    assert stale.returncode == 1
    assert "launch-qwen3-30b.sh: stale" in stale.stdout


def _readme_clone_config() -> str:
    """The README's pre-commit configuration for a clone (a path and a commit), as written there."""
    import re

    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    found = [b for b in blocks if "repo: /path/to/moeconf" in b]
    assert len(found) == 1, "the README lost its pre-commit configuration for a clone"
    return found[0]


def test_readme_clone_config_works(tmp_path: Path) -> None:
    """The README's configuration from a clone, with the path and commit filled in, runs both hooks
    through `pre-commit run` in a deployment repository."""
    import re

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()
    config = _readme_clone_config()
    config = config.replace("/path/to/moeconf", str(REPO))
    config = re.sub(r"rev: [0-9a-f]{40}", f"rev: {head}", config)
    repo = tmp_path / "deploy-repo"
    shutil.copytree(EXAMPLES / "deploy", repo / "deploy")
    shutil.copytree(EXAMPLES / "models", repo / "models")
    (repo / ".pre-commit-config.yaml").write_text(config)
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "deploy")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE),
           "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}
    run = subprocess.run(["pre-commit", "run", "--all-files", "--verbose"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, run.stdout + run.stderr  # the deliberate mistakes of examples/deploy
    assert "deploy/run-glm-air.sh:8:25" in run.stdout and "MOE002 space-in-list" in run.stdout
    assert "1 generated file(s), 0 stale" in run.stdout
