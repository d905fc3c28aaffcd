"""What an architecture's name decides lives in its composition module (moeconf/memory/graph/archs/,
`Traits`): no other module of moeconf compares an architecture's name against a literal, directly
(`inv.arch == "grok"`, `arch in ("a", "b")`) or through a set of names it or another module spells out
(`X = frozenset({"a", "b"})`, then `arch in X`). The loader's own tables (moeconf/model/, moeconf/engines/,
generated from the engines' sources) and the test layouts (moeconf/fixtures/) are outside the rule.
Tables keyed by the architecture that record what was measured on it (dicts) are data, not tests."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "moeconf"
OUTSIDE = ("memory/graph/archs/", "model/", "engines/", "fixtures/")

# whole modules allowed to name architectures, each with why
ALLOWED_FILES: dict[str, str] = {
    # Grok-2's dense FFN beside the experts, refused for llama.cpp and ik_llama.cpp alike (support.py reads it
    # on both paths): to move into grok's module once the ik path reads the modules' refusals
    "memory/archgraph.py": "grok's layer-structure refusal, read by the llama.cpp and the ik_llama.cpp paths",
}
# (file, what the architecture is compared against) -> why it stays
ALLOWED: dict[tuple[str, str], str] = {
    ("iksplit.py", "_MLA_ARCHS"): "ik_llama.cpp's get_layer_sizes tests these names itself (src/llama.cpp)",
    ("memory/ikarchs.py", "KV_ONLY"): ("ik_llama.cpp is a table over the compositions: the architectures whose "
                                       "weights and KV were measured against ik's logs (test_ik_newer.py)"),
    ("memory/support.py", "MODELLED_IN_FULL"): ("ik_llama.cpp's table over the compositions: the architectures whose "
                                                "memory on ik equals its logged buffers in full (docs/memory.md)"),
}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(OUTSIDE):
            out.append((rel, ast.parse(path.read_text(), str(path))))
    return out


def _is_names(node: ast.expr, named: set[str]) -> bool:
    """Whether `node` spells out architecture names: a string, a collection of strings, frozenset/set of
    one, a union of such, or a module-level name bound to one (`named`)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_names(e, named) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set"):
        return len(node.args) == 1 and _is_names(node.args[0], named)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_names(node.left, named) and _is_names(node.right, named)
    if isinstance(node, ast.Name):
        return node.id in named
    if isinstance(node, ast.Attribute):
        return node.attr in named
    return False


def _named_sets(modules: list[tuple[str, ast.Module]]) -> set[str]:
    """Module-level names bound to spelled-out names, in any module (repeated until no more are found:
    one may be a union of others)."""
    named: set[str] = set()
    while True:
        before = len(named)
        for _, tree in modules:
            for stmt in tree.body:
                target, value = None, None
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                elif isinstance(stmt, ast.AnnAssign):
                    target, value = stmt.target, stmt.value
                if isinstance(target, ast.Name) and value is not None and not isinstance(value, ast.Constant) \
                        and _is_names(value, named):
                    named.add(target.id)
        if len(named) == before:
            return named


def _is_arch(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "arch") or (isinstance(node, ast.Name)
                                                                          and node.id == "arch")


def _label(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return repr(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ast.unparse(node)


def arch_tests() -> list[tuple[str, int, str, str]]:
    """(file, line, what the architecture is compared against, the line) of every comparison outside
    the registry."""
    modules = _modules()
    named = _named_sets(modules)
    out = []
    for rel, tree in modules:
        lines = (PACKAGE / rel).read_text().splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for op, (a, b) in zip(node.ops, pairwise(operands), strict=True):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                for arch, other in ((a, b), (b, a)):
                    if _is_arch(arch) and _is_names(other, named):
                        out.append((rel, node.lineno, _label(other), lines[node.lineno - 1].strip()))
    return out


def test_no_architecture_name_tested_outside_the_registry() -> None:
    found = [f"moeconf/{rel}:{line}: {text}  (against {what})" for rel, line, what, text in arch_tests()
             if rel not in ALLOWED_FILES and (rel, what) not in ALLOWED]
    assert not found, ("an architecture's name tested outside its composition module: declare the fact in "
                       "the module's TRAITS (memory/graph/archs/common.py Traits) and read archs.traits(arch), or "
                       "derive it from the GGUF's keys or tensors:\n" + "\n".join(found))


def test_the_scan_finds_a_test() -> None:
    """The scan sees the forms it forbids (a literal, a tuple, a named set, another module's named set)."""
    src = ('X = frozenset({"a", "b"})\nY = X | frozenset({"c"})\n'
           'def f(inv, arch, rec):\n    return inv.arch == "a" or arch in ("a", "b") or inv.arch in Y '
           'or arch not in rec.X or inv.arch in Z\n')
    tree = ast.parse(src)
    named = _named_sets([("x.py", tree)])
    assert named == {"X", "Y"}
    hits = [_label(n.comparators[0]) for n in ast.walk(tree) if isinstance(n, ast.Compare)
            and _is_arch(n.left) and _is_names(n.comparators[0], named)]
    assert hits == ["'a'", "('a', 'b')", "Y", "X"]


def test_every_allowance_is_still_needed() -> None:
    """An allowance whose test is gone is removed with it."""
    found = {(rel, what) for rel, _, what, _ in arch_tests()}
    files = {rel for rel, _, _, _ in arch_tests()}
    stale = [k for k in ALLOWED if k not in found and k[0] not in ALLOWED_FILES]
    stale += [f for f in ALLOWED_FILES if (PACKAGE / f).exists() and f not in files]
    assert not stale, f"allowances no longer needed (remove them): {stale}"
