"""The package's layers, read from every import statement (function-level imports included):
`model/`, `engines/` and `plan/` know nothing above them, and nothing that returns data (rules,
compiler, memory, fill, fit, emitting) imports the reports or the CLI; formatting helpers live in
the leaf `moeconf.units` and `moeconf.textsafe`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "moeconf"
LEAVES = {"errors", "textsafe", "units", "atomic"}
ALLOWED = {
    "model": {"model"} | LEAVES,
    "engines": {"engines", "model"} | LEAVES,
    "plan": {"plan", "model", "engines"} | LEAVES,
    "units": set(),
    "textsafe": set(),
}
PRESENTATION = {"report", "cli", "__main__"}


def _imports(path: Path) -> set[str]:
    """The moeconf subpackages or modules `path` imports."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "moeconf" and len(parts) > 1 and (
                    (PKG / parts[1]).with_suffix(".py").exists() or (PKG / parts[1]).is_dir()):
                out.add(parts[1])
    return out


def _modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(PKG).parts[0].removesuffix(".py"), p) for p in sorted(PKG.rglob("*.py"))]


@pytest.mark.parametrize(("layer", "path"), [(la, p) for la, p in _modules() if la in ALLOWED],
                         ids=lambda v: str(v.relative_to(PKG)) if isinstance(v, Path) else v)
def test_lower_layers_know_nothing_above_them(layer: str, path: Path) -> None:
    above = _imports(path) - ALLOWED[layer] - {layer}
    assert not above, f"{path.relative_to(PKG)} imports {sorted(above)}"


@pytest.mark.parametrize(("layer", "path"), [(la, p) for la, p in _modules() if la not in PRESENTATION | {"check"}],
                         ids=lambda v: str(v.relative_to(PKG)) if isinstance(v, Path) else v)
def test_data_layers_never_import_reports_or_the_cli(layer: str, path: Path) -> None:
    assert not _imports(path) & PRESENTATION, f"{path.relative_to(PKG)} imports {sorted(_imports(path) & PRESENTATION)}"


def test_the_import_reader_sees_function_level_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from moeconf.report.inventory import gib\n    import moeconf.cli\n")
    assert _imports(f) == {"report", "cli"}
