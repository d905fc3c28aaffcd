"""What the engine-source extractors write in their headers: which package (and the engine
commit it vendors) a source tree came from. The pinned packages are those scripts/build-engines.sh
fetches; a generated module names them so a test can hold it to the pinned versions
(tests/generated.py, tests/test_generated_headers.py).

The source packages carry no git metadata, so each vendored commit is recorded here:
- llama-cpp-python 0.3.36: its CHANGELOG.md ("update llama.cpp to ggml-org/llama.cpp@0c1e57098"),
  and the build's own build-info (`LLAMA_COMMIT = "0c1e570"`);
- ik-llama-cpp-python 0.1.5: every file of its vendor/ik_llama.cpp equals ik_llama.cpp commit
  55d3c05bf (2026-04-13) apart from the spm-headers links (compared blob by blob with the ik history).
A source tree of another version is refused until its commit is added here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

VENDORED = {
    ("llama-cpp-python", "0.3.36"): "ggml-org/llama.cpp 0c1e57098",
    ("ik-llama-cpp-python", "0.1.5"): "ikawrakow/ik_llama.cpp 55d3c05bf",
}

# the lines that close a generated module's docstring and open its code (a `Final` table follows)
DOC_END_AND_IMPORTS = ['"""', "", "from __future__ import annotations", "", "from typing import Final", ""]


def package_of(root: Path) -> tuple[str, str]:
    """(package name, version) of the source package that vendors the engine tree `root`
    (`<package>/vendor/<engine>`: the package's PKG-INFO two levels up)."""
    info = root.resolve().parent.parent / "PKG-INFO"
    if not info.is_file():
        raise SystemExit(f"{root}: not inside an unpacked source package (no {info}); "
                         "scripts/build-engines.sh unpacks the pinned ones")
    text = info.read_text(errors="replace")
    name = re.search(r"^Name:\s*(\S+)", text, re.M)
    version = re.search(r"^Version:\s*(\S+)", text, re.M)
    if not name or not version:
        raise SystemExit(f"{info}: no Name/Version")
    return name.group(1).lower().replace("_", "-"), version.group(1)


def describe(root: Path) -> str:
    """`llama-cpp-python 0.3.36: ggml-org/llama.cpp 0c1e57098`, the tag a header names."""
    pkg = package_of(root)
    commit = VENDORED.get(pkg)
    if commit is None:
        raise SystemExit(f"{root}: {pkg[0]} {pkg[1]} is not in scripts/_pinned.py VENDORED: add the engine "
                         "commit it vendors")
    return f"{pkg[0]} {pkg[1]}: {commit}"


def describe_commit(repo: Path, rev: str) -> str:
    """`ikawrakow/ik_llama.cpp 8337e4cd3 (2026-08-15)` for a commit of a git checkout."""
    out = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%H %cs", rev],
                         check=True, capture_output=True, text=True).stdout.split()
    return f"ikawrakow/ik_llama.cpp {out[0][:9]} ({out[1]})"


def git_show(repo: Path, rev: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def take_out(argv: list[str]) -> tuple[list[str], Path | None]:
    """`--out FILE` taken from the arguments: (the rest, FILE or None for the module in the checkout)."""
    if "--out" not in argv:
        return argv, None
    k = argv.index("--out")
    if k + 1 >= len(argv):
        raise SystemExit("--out needs a file")
    return argv[:k] + argv[k + 2:], Path(argv[k + 1])


def wrapped(pieces: list[str], width: int = 112) -> str:
    """A generated table's items (" 'k': v," each) laid out in lines of at most `width` characters,
    each indented by three spaces (the extractors' one layout)."""
    lines, line = [], "   "
    for piece in pieces:
        if len(line) + len(piece) > width:
            lines.append(line)
            line = "   "
        line += piece
    lines.append(line)
    return "\n".join(lines)
