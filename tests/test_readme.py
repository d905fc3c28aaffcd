"""The library examples of the README and docs/*.md run as doctests (```pycon blocks; ```python
blocks are executed), so the docs cannot drift from the library; `moeconf.emit()` works in every
import order."""

from __future__ import annotations

import doctest
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO, doc_pages

_BLOCK = re.compile(r"^```(?P<lang>pycon|python)\n(?P<code>.*?)^```$", re.M | re.S)


def blocks(lang: str) -> list[tuple[Path, int, str]]:
    out = []
    for page in doc_pages():
        text = page.read_text()
        out += [(page, text.count("\n", 0, m.start("code")) + 1, m.group("code"))
                for m in _BLOCK.finditer(text) if m.group("lang") == lang]
    return out


@pytest.fixture
def readme_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding `examples/` (a link to the shipped ones), so relative paths work and
    whatever the examples write lands in the temporary folder."""
    (tmp_path / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_library_doctest(readme_dir: Path) -> None:
    found = blocks("pycon")
    assert found, "the library page lost its doctest"
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    tried = 0
    for page, line, code in found:
        name = str(page.relative_to(REPO))
        test = parser.get_doctest(code, {}, f"{name}:{line}", str(page), line - 1)
        runner.run(test, out=out.write)
        tried += len(test.examples)
    assert runner.failures == 0, out.getvalue()
    assert tried >= 20
    assert (readme_dir / "deepseek-v3.manifest.json").is_file()  # write_manifest wrote here, not in the checkout
    for page, line, code in blocks("python"):  # plain code examples, if any: they must at least run
        exec(compile(code, f"{page.relative_to(REPO)}:{line}", "exec"), {})


@pytest.mark.parametrize("first", ["import moeconf.emitting.targets", "import moeconf.emitting",
                                   "from moeconf.emitting.targets import emit",
                                   "from moeconf.cli import main; main(['compile', 'examples/plans/glm-4.5-air.toml', "
                                   "'-q', '--target', 'ot'])",
                                   "import moeconf.check; import moeconf.compile"])
def test_emit_function_survives_every_import_order(first: str) -> None:
    code = (f"{first}\nimport moeconf\n"
            "c = moeconf.compile_plan('examples/plans/glm-4.5-air.toml')\n"
            "print(moeconf.emit(c, 'ot'), end='')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n").endswith("=CPU")
