"""The modules moeconf generates from the engines' sources, how to regenerate each, and the two
guards that keep them from drifting from the pinned engines:

- `stale_message`: a module regenerated now (scripts/..., into a temporary folder) differs from
  the committed one (the engine suite, tests/engine/test_generated_tables.py, where the pinned
  sources are unpacked);
- `header_problems`: a module's header names a package version other than the one
  scripts/build-engines.sh pins, or another engine commit than the one that version vendors
  (scripts/_pinned.py); the default suite (tests/test_generated_headers.py).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from moeconf.engines import IK_NEWEST_COMMIT, IK_NEWEST_DATE

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "scripts" / "build-engines.sh"

# where each pinned package vendors its engine (scripts/build-engines.sh unpacks it to
# $CACHE/<package>-<version>/src)
VENDOR_DIRS = {"llama-cpp-python": "vendor/llama.cpp", "ik-llama-cpp-python": "vendor/ik_llama.cpp"}


@dataclass(frozen=True)
class Generated:
    """A generated module: its path, the script that writes it, and the script's arguments
    (`{ml}`, `{ik}`: the pinned llama.cpp / ik_llama.cpp trees; `{ik_repo}`: an ik_llama.cpp clone)."""

    module: str
    script: str
    args: tuple[str, ...]

    @property
    def needs_ik_repo(self) -> bool:
        return "{ik_repo}" in self.args

    def command(self, sources: dict[str, str], out: Path | None = None) -> list[str]:
        words = [a.format(**sources) for a in self.args]
        return [sys.executable, self.script, *words, *(["--out", str(out)] if out is not None else [])]


GENERATED: tuple[Generated, ...] = (
    Generated("moeconf/engines/flagtable.py", "scripts/extract-engine-flags.py", ("{ml}", "{ik}")),
    Generated("moeconf/engines/benchtable.py", "scripts/extract-bench-flags.py", ("{ml}", "{ik}")),
    Generated("moeconf/model/nametable.py", "scripts/extract-engine-names.py", ("{ml}", "{ik}")),
    Generated("moeconf/model/layertable.py", "scripts/extract-tensor-layers.py", ("{ml}", "{ik}")),
    Generated("moeconf/engines/specflags.py", "scripts/extract-spec-flags.py", ("{ml}", "{ik}")),
    Generated("moeconf/engines/tied.py", "scripts/gen-tied-output.py", ("{ml}",)),
    Generated("moeconf/engines/configtable.py", "scripts/extract-config-keys.py", ("{ml}",)),
    Generated("moeconf/engines/archkeys.py", "scripts/extract-arch-keys.py", ("{ml}", "{ik}")),
    # from the newest ik_llama.cpp code moeconf models, not the pinned package (see the scripts)
    Generated("moeconf/engines/flagtable_iknewest.py", "scripts/extract-engine-flags.py",
              ("--ik-repo", "{ik_repo}", IK_NEWEST_COMMIT)),
    Generated("moeconf/engines/ikbuilds.py", "scripts/extract-ik-builds.py", ("{ik_repo}", IK_NEWEST_COMMIT)),
)


def pinned_packages(build_script: str | None = None) -> dict[str, str]:
    """package -> version, as scripts/build-engines.sh pins them (`LLAMA_PKG="llama-cpp-python==0.3.36"`)."""
    text = BUILD_SCRIPT.read_text() if build_script is None else build_script
    pins = dict(re.findall(r'^\w+_PKG="([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)"', text, re.M))
    assert pins, "no PKG=\"name==version\" pins in scripts/build-engines.sh"
    return pins


def source_dirs(cache: Path, pins: dict[str, str] | None = None) -> dict[str, Path]:
    """{"ml": ..., "ik": ...}: the pinned packages' vendored engine trees under the engine cache."""
    pins = pinned_packages() if pins is None else pins
    key = {"llama-cpp-python": "ml", "ik-llama-cpp-python": "ik"}
    return {key[p]: cache / f"{p}-{v}" / "src" / VENDOR_DIRS[p] for p, v in pins.items() if p in key}


def vendored() -> dict[tuple[str, str], str]:
    """scripts/_pinned.py VENDORED: (package, version) -> the engine commit it vendors."""
    spec = importlib.util.spec_from_file_location("_pinned_for_tests", REPO / "scripts" / "_pinned.py")
    assert spec and spec.loader
    mod: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = mod.VENDORED
    assert isinstance(table, dict)
    return table


def regenerate(g: Generated, sources: dict[str, str], out_dir: Path) -> tuple[str, str]:
    """Run g's script into `out_dir`: (the text it wrote, the command, for messages)."""
    out = out_dir / Path(g.module).name
    cmd = g.command(sources, out)
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    shown = shlex.join(["python", *cmd[1:-2]])
    if r.returncode != 0:
        raise AssertionError(f"{shown} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return out.read_text(), shown


def stale_message(module: str, committed: str, fresh: str, command: str) -> str | None:
    """Why the committed module is stale (the start of the diff and the command that regenerates
    it), or None when it is byte for byte what the script writes now."""
    if committed == fresh:
        return None
    diff = difflib.unified_diff(committed.splitlines(), fresh.splitlines(), f"{module} (committed)",
                                f"{module} (from the pinned sources)", lineterm="", n=1)
    head = "\n".join(list(diff)[:40])
    return (f"{module} is stale: it is not what the pinned engine sources give now. Regenerate it with\n"
            f"    {command}\nand review the change (docs/engines.md, Generated tables).\n{head}")


_TAG = re.compile(r"\b(llama-cpp-python|ik-llama-cpp-python) ([0-9][A-Za-z0-9.+-]*?)(?=[:),\s]|$)"
                  r"(?::\s*([\w./-]+ [0-9a-f]{7,40}))?")


def header_problems(name: str, text: str, pins: dict[str, str], commits: dict[tuple[str, str], str]) -> list[str]:
    """What is wrong with a generated module's header: it must say it is generated, and every
    package it names must be the pinned version with the engine commit that version vendors;
    a module read from ik_llama.cpp's own history must name moeconf's newest ik commit."""
    try:
        doc = ast.get_docstring(ast.parse(text), clean=False) or ""
    except SyntaxError as e:
        return [f"{name}: not Python ({e})"]
    problems = []
    if "Generated by scripts/" not in doc:
        problems.append(f"{name}: the header does not say which script generated it")
    tags = _TAG.findall(doc)
    for pkg, version, commit in tags:
        if pins.get(pkg) != version:
            problems.append(f"{name}: read from {pkg} {version}, but scripts/build-engines.sh pins "
                            f"{pkg} {pins.get(pkg, '(none)')}")
        elif not commit:
            problems.append(f"{name}: names {pkg} {version} without the engine commit it vendors")
        elif commits.get((pkg, version)) != commit:
            problems.append(f"{name}: names {pkg} {version} as {commit}; scripts/_pinned.py records "
                            f"{commits.get((pkg, version), 'no commit')}")
    newest = re.search(r"ikawrakow/ik_llama\.cpp ([0-9a-f]{7,40}) \((\d{4}-\d{2}-\d{2})\)", doc)
    if newest and (newest.group(1)[:9] != IK_NEWEST_COMMIT or newest.group(2) != IK_NEWEST_DATE):
        problems.append(f"{name}: read from ik_llama.cpp {newest.group(1)} ({newest.group(2)}), but moeconf's newest "
                        f"ik code is {IK_NEWEST_COMMIT} ({IK_NEWEST_DATE}, moeconf.engines.IK_NEWEST_COMMIT)")
    if not tags and not newest:
        problems.append(f"{name}: the header names no engine package version or commit it was read from")
    return problems


def generated_modules() -> list[str]:
    """Every module under moeconf/ whose docstring says a script generated it."""
    out = []
    for p in sorted((REPO / "moeconf").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        if re.search(r"Generated by scripts/", doc):
            out.append(p.relative_to(REPO).as_posix())
    return out
