"""The package's layers, read from every import statement (function-level and `TYPE_CHECKING`
imports included): `model/`, `engines/` and `plan/` know nothing above them, nothing that returns
data (rules, compiler, memory, fill, fit, emitting) imports the reports or the CLI, `memory/`
reads a Placement and settings and never an Explanation, and no two modules import each other,
directly or through others (formatting helpers live in the leaf `moeconf.units` and
`moeconf.textsafe`).

The import graph is one of modules (`moeconf.memory` is the package's `__init__`):
`import moeconf.a.b` depends on `moeconf.a.b`; `from moeconf.a import x` depends on `moeconf.a`
(the name is read from the package's namespace, so its `__init__` runs first) and on `moeconf.a.x`
when that is a module. The parents every submodule import runs implicitly are not edges (else
every package whose `__init__` re-exports a submodule would be a circle). A deferred import inside
a function still counts: it closes the circle at run time all the same."""

from __future__ import annotations

import ast
from collections.abc import Mapping
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
# what sits above `memory/`: an Explanation, the glue that joins it to memory, and every command
MEMORY_NEVER = {"explanation", "sizing", "compile", "compiled", "fit", "fitquants", "check", "decompile",
                "linting", "emitting"} | PRESENTATION


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package at `root`, by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for p in sorted(root.rglob("*.py")):
        parts = (root.name, *p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The package's modules that `name` (at `path`) imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                src = ".".join([*base, *([node.module] if node.module else [])])
            else:
                src = node.module or ""
            if src in modules:
                out.add(src)
            out.update(f"{src}.{a.name}" for a in node.names if f"{src}.{a.name}" in modules)
    out.discard(name)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(group: list[str], graph: Mapping[str, set[str]]) -> str:
    members = set(group)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in group)


def layer(name: str) -> str:
    """`moeconf.memory.estimate` -> `memory`; the package itself -> `moeconf`."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import that breaks the standards' layers, as 'module imports module (why)'."""
    out: list[str] = []
    for mod, deps in sorted(graph.items()):
        la = layer(mod)
        for dep in sorted(deps):
            lb = layer(dep)
            if lb == la:
                continue
            if la in ALLOWED and lb not in ALLOWED[la]:
                out.append(f"{mod} imports {dep} (`{la}/` knows nothing above it)")
            if la not in PRESENTATION | {"check"} and lb in PRESENTATION:
                out.append(f"{mod} imports {dep} (data layers never import the reports or the CLI)")
            if la == "memory" and lb in MEMORY_NEVER:
                out.append(f"{mod} imports {dep} (`memory/` reads a Placement and settings, never what sits above it)")
    return out


GRAPH = import_graph(PKG)


def test_the_package_has_no_import_cycle() -> None:
    found = cycles(GRAPH)
    assert not found, "import circles:\n" + "\n".join(describe(g, GRAPH) for g in found)


def test_every_layer_rule_holds() -> None:
    bad = layer_violations(GRAPH)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer_name", sorted(ALLOWED))
def test_lower_layers_know_nothing_above_them(layer_name: str) -> None:
    assert any(layer(m) == layer_name for m in GRAPH), f"no module in layer {layer_name}: the check reads nothing"
    above = {f"{m} -> {d}" for m, ds in GRAPH.items() if layer(m) == layer_name
             for d in ds if layer(d) not in ALLOWED[layer_name] | {layer_name}}
    assert not above, sorted(above)


def test_data_layers_never_import_reports_or_the_cli() -> None:
    bad = {f"{m} -> {d}" for m, ds in GRAPH.items() if layer(m) not in PRESENTATION | {"check"}
           for d in ds if layer(d) in PRESENTATION}
    assert not bad, sorted(bad)


def test_memory_never_reads_an_explanation() -> None:
    bad = {f"{m} -> {d}" for m, ds in GRAPH.items() if layer(m) == "memory" for d in ds if layer(d) in MEMORY_NEVER}
    assert not bad, sorted(bad)


def test_the_graph_reads_the_whole_package() -> None:
    """The checks above are only as good as the graph: it holds every module and real edges."""
    assert len(GRAPH) == len(list(PKG.rglob("*.py")))
    assert "moeconf.memory.estimate" in GRAPH["moeconf.memory"]
    assert "moeconf.sizing" in GRAPH["moeconf.compiled"]  # a function-level import
    assert "moeconf.linting.rules._patterns" in GRAPH["moeconf.linting.rules.prefix_collision"]  # relative


# -- the checks themselves, fed wrong answers -------------------------------------------------------

def test_the_cycle_finder_finds_a_circle_and_only_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}, "f": {"g"}, "g": {"f"}}
    assert cycles(graph) == [["a", "b", "c"], ["f", "g"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    assert "c -> a" in describe(["a", "b", "c"], graph)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_deferred_import_that_closes_a_circle_is_found(tmp_path: Path) -> None:
    root = tmp_path / "moeconf"
    _write(root, {
        "__init__.py": "",
        "fill.py": "from moeconf.resolve import gpu_devices\n",
        "resolve.py": "def resolve():\n    from moeconf.fill import fill\n",
        "memory/__init__.py": "from moeconf.memory.estimate import estimate\n",
        "memory/estimate.py": "from moeconf.memory import recurrent as rec\n",
        "memory/recurrent.py": "",
        "memory/ok.py": "import moeconf.memory.recurrent as rec\nfrom . import recurrent\n",
    })
    graph = import_graph(root)
    assert graph["moeconf.memory.ok"] == {"moeconf.memory", "moeconf.memory.recurrent"}  # `from . import`
    assert cycles(graph) == [["moeconf.fill", "moeconf.resolve"], ["moeconf.memory", "moeconf.memory.estimate"]]


def test_the_layer_check_refuses_each_kind_of_violation(tmp_path: Path) -> None:
    root = tmp_path / "moeconf"
    _write(root, {
        "__init__.py": "",
        "model/__init__.py": "def f():\n    from moeconf.plan import Plan\n",
        "plan/__init__.py": "",
        "report/__init__.py": "",
        "linting/rules/x.py": "from moeconf.report.lint import render\n",
        "report/lint.py": "",
        "compile.py": "import moeconf.cli\n",
        "cli.py": "",
        "explanation.py": "",
        "memory/__init__.py": "from moeconf.explanation import Explanation\n",
    })
    bad = layer_violations(import_graph(root))
    assert any(b.startswith("moeconf.model imports moeconf.plan") for b in bad)
    assert any(b.startswith("moeconf.linting.rules.x imports moeconf.report.lint") for b in bad)
    assert any(b.startswith("moeconf.compile imports moeconf.cli") for b in bad)
    assert any(b.startswith("moeconf.memory imports moeconf.explanation") for b in bad)
    assert len(bad) == 4, bad


def test_the_import_reader_sees_function_level_imports(tmp_path: Path) -> None:
    root = tmp_path / "moeconf"
    _write(root, {"__init__.py": "", "cli.py": "", "report/__init__.py": "", "report/inventory.py": "",
                  "m.py": "def f():\n    from moeconf.report.inventory import gib\n    import moeconf.cli\n"})
    assert import_graph(root)["moeconf.m"] == {"moeconf.report.inventory", "moeconf.cli"}
