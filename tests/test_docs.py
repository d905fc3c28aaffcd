"""The README is a newcomer's page (what it is, install, then fit, explain, lint and compile with
an example each, in about 200 lines); the reference lives in docs/*.md, whose examples, tables and
doctests the same tests check (test_readme.py, test_readme_outputs.py, test_lint_rules.py). Every
relative link between them resolves, and `moeconf rule CODE` prints a rule's page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.linting.rules import ALL
from tests.conftest import REPO, doc_pages

# pages other branches of issue 18 add; the README links them before they land
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE = re.compile(r"`[^`\n]*`")  # inline code: a regex like `[-.]([A-Z0-9_]+)` is no link


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def test_readme_is_a_newcomers_page() -> None:
    text = (REPO / "README.md").read_text()
    assert text.count("\n") <= 240, "the README grew past about 200 lines: move reference text to docs/"
    heads = re.findall(r"^## (.*)$", _FENCE.sub("", text), re.M)
    order = [next(i for i, h in enumerate(heads) if key in h)
             for key in ("Install", "moeconf fit", "moeconf explain", "moeconf lint", "moeconf compile")]
    assert order == sorted(order), heads
    # each command's section runs an example whose output test_readme_outputs checks
    sections = re.split(r"^## ", text, flags=re.M)
    for cmd in ("fit", "explain", "lint", "compile"):
        body = next(s for s in sections if s.startswith(f"`moeconf {cmd}`"))
        assert re.search(rf"```sh\n[^`]*moeconf {cmd} [^`]*```\n\n```\n", body) or cmd == "compile", cmd
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text or f"(docs/{page.name}#" in text, f"README does not link {page.name}"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    text = _CODE.sub("", _FENCE.sub("", page.read_text()))
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        assert dest.exists(), f"{page.name}: link to {target} names no file"
        if anchor:
            assert anchor in _anchors(dest), f"{page.name}: link to {target}: no such heading in {rel}"


def test_rule_page_is_the_modules_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    for mod in ALL:
        for name in (mod.CODE, mod.NAME):
            assert main(["rule", name]) == 0
            out = capsys.readouterr().out
            assert out.startswith(f"{mod.CODE} {mod.NAME} [{mod.SEVERITY}]")
            assert (mod.__doc__ or "").strip() in out
    assert main(["rule"]) == 0
    listing = capsys.readouterr().out
    assert all(f"{mod.CODE} {mod.NAME}" in listing for mod in ALL)


def test_rule_page_of_an_unknown_rule_names_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rule", "prefix-colision"]) == 2
    err = capsys.readouterr().err
    assert "unknown rule 'prefix-colision'" in err and "prefix-collision" in err


def test_architecture_table_is_current() -> None:
    """docs/memory-architectures.md's table of every routed-expert architecture is what
    scripts/gen-arch-table.py makes from today's code and data."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gen_arch_table", root / "scripts" / "gen-arch-table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (root / "docs" / "memory-architectures.md").read_text()
    assert mod.render(text) == text, "stale: run scripts/gen-arch-table.py"
    table = text.split(mod.BEGIN)[1].split(mod.END)[0]
    assert table.count("\n| `") == 67
