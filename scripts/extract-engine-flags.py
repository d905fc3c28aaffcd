#!/usr/bin/env python3
"""Regenerate moeconf/engines/flagtable.py: every command-line flag the engines' common argument
parsers know, and how many values each takes.

    python scripts/extract-engine-flags.py MAINLINE IK [--out FILE]
    python scripts/extract-engine-flags.py --ik-repo IK_REPO REV [--out FILE]

MAINLINE and IK are the pinned engines' source trees (scripts/build-engines.sh unpacks them:
~/.cache/moeconf/engines/llama-cpp-python-0.3.36/src/vendor/llama.cpp and
~/.cache/moeconf/engines/ik-llama-cpp-python-0.1.5/src/vendor/ik_llama.cpp); the first form
writes moeconf/engines/flagtable.py, naming the package versions and the engine commits they
vendor (scripts/_pinned.py). ik_llama.cpp newer than its package: the second form reads
common/common.cpp at commit REV of an ik_llama.cpp clone and writes
moeconf/engines/flagtable_iknewest.py (the flags of the newest ik code moeconf models,
moeconf.engines.IK_NEWEST_COMMIT).

mainline (common/arg.cpp): each `common_arg({names}, [{negated names},] [hints,] help, handler)`;
the handler's parameters say how many values it takes (`(params)` and `(params, bool)`: none,
`(params, value)`: one, `(params, value, value)`: two).
ik_llama.cpp (common/common.cpp, gpt_params_find_arg): each `if (arg == "-x" || arg == "--y")`
block; every CHECK_ARG, `argv[++i]` and `if (++i >= argc)` in it consumes one value.
Only names, value counts and how a value is read as a number (std::stoi, std::stoul, std::stof:
the handler's parameter type or the conversion it calls) are kept: facts, not code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _cparse.py, also when loaded by path
from _cparse import matching as _matching
from _pinned import describe, describe_commit, git_show, take_out, wrapped

_IK_VALUE = re.compile(r"\bCHECK_ARG\b|argv\[\+\+i\]|\(\s*\+\+i\s*>=\s*argc\s*\)")


_STO = {"stoi": "int", "stoul": "uint", "stof": "float"}


def _kind(param: str, body: str, var: str) -> str | None:
    """How a handler reads its one value: `int` (the int handler: std::stoi), `uint` (std::stoul),
    `float` (std::stof), `floats` (std::stof on each piece of a list split on , and /), with the
    words it takes before the number (`int|auto|all`); None: a string it reads otherwise."""
    if re.search(r"\bint\b", param) and "string" not in param:
        return "int"
    m = re.search(rf"std::(stoi|stoul|stof)\(\s*{var}\s*\)", body)
    if m is None:
        return "floats" if re.search(r"std::stof\(\s*split_arg\[i\]\s*\)", body) else None
    words = re.findall(rf'\b{var}\s*==\s*"([^"]+)"', body[: m.start()])
    return "|".join([_STO[m.group(1)], *dict.fromkeys(words)])


def mainline(src: str, values: dict[str, str] | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in re.finditer(r"common_arg\s*\(", src):
        end = _matching(src, m.end() - 1)
        body = re.sub(r"^\s*//[^\n]*\n", "", src[m.end(): end - 1], flags=re.M)  # comment lines
        lists = []
        rest = body.lstrip()
        while rest.startswith("{"):
            close = _matching(rest, 0, "{", "}")
            lists.append(re.findall(r'"([^"]+)"', rest[1: close - 1]))
            rest = rest[close:].lstrip().lstrip(",").lstrip()
        if not lists:
            continue
        lam = re.search(r"\[\]\s*\(([^)]*)\)", body)
        if not lam:
            continue
        params = [p for p in lam.group(1).split(",") if p.strip()]
        n_values = 0 if len(params) <= 1 or "bool" in params[1] else len(params) - 1
        kind = _kind(params[1], body[lam.end():], "value") if n_values == 1 else None
        for name in lists[0]:
            out[name] = max(out.get(name, 0), n_values)
            if kind is not None and values is not None:
                values[name] = kind
        for extra in lists[1:]:
            for name in extra:
                out.setdefault(name, 0)
    return out


def ik(src: str, values: dict[str, str] | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    start = src.index("bool gpt_params_find_arg(")
    body = src[start: _matching(src, src.index("{", start), "{", "}")]
    blocks = list(re.finditer(
        r'\n\s+(?:else\s+)?if \((?:params\.\w+\s*&&\s*)?(arg == "[^"]+"(?:\s*\|\|\s*arg == "[^"]+")*)\s*\)\s*\{',
        body))
    for k, m in enumerate(blocks):
        block_end = blocks[k + 1].start() if k + 1 < len(blocks) else len(body)
        n_values = len(_IK_VALUE.findall(body[m.end(): block_end]))
        kind = _kind("std::string", body[m.end(): block_end], r"argv\[i\]") if n_values == 1 else None
        for name in re.findall(r'arg == "([^"]+)"', m.group(1)):
            out[name] = max(out.get(name, 0), n_values)
            if kind is not None and values is not None:
                values[name] = kind
    return out


def _table(name: str, d: dict[str, int] | dict[str, str], kind: str = "int") -> str:
    body = wrapped([f" {k!r}: {v!r}," for k, v in sorted(d.items())])
    return f"{name}: Final[dict[str, {kind}]] = {{\n" + body + "\n}\n"


_PRELUDE = '\n\nfrom __future__ import annotations\n\nfrom typing import Final\n\n'


def render(ml: dict[str, int], ikf: dict[str, int], rev_ml: str, rev_ik: str,
           ml_values: dict[str, str], ik_values: dict[str, str]) -> str:
    return (
        '"""Every flag the pinned engines\' common argument parsers know, and how many values it takes.\n\n'
        "Generated by scripts/extract-engine-flags.py from llama.cpp common/arg.cpp\n"
        f"({rev_ml})\nand ik_llama.cpp common/common.cpp ({rev_ik}).\n"
        "Do not edit by hand.\n"
        '"""' + _PRELUDE
        + "# the engine versions read\n"
        f"SOURCES: Final[dict[str, str]] = {{\n    'llama.cpp': {rev_ml!r},\n    'ik_llama.cpp': {rev_ik!r},\n}}\n\n"
        + _table("MAINLINE", ml) + "\n" + _table("IK", ikf)
        + "\n# how each engine reads a flag's one value, where it reads a number: `int` (std::stoi: an int, the\n"
        "# digits after optional blanks and sign, the rest ignored), `uint` (std::stoul), `float` (std::stof),\n"
        "# `floats` (std::stof on each piece split on , and /), after `|`: words taken before the number\n"
        + _table("MAINLINE_VALUES", ml_values, "str") + "\n" + _table("IK_VALUES", ik_values, "str")
    )


def render_newest(ikf: dict[str, int], rev: str) -> str:
    return (
        '"""Every flag ik_llama.cpp\'s argument parser knows at the newest ik code moeconf models\n'
        "(moeconf.engines.IK_NEWEST_COMMIT), and how many values it takes; the pinned package's own\n"
        "table is flagtable.IK.\n\n"
        f"Generated by scripts/extract-engine-flags.py --ik-repo from common/common.cpp of\n{rev}.\n"
        "Do not edit by hand.\n"
        '"""' + _PRELUDE
        + f"SOURCE: Final = {rev!r}\n\n"
        + _table("IK_NEWEST", ikf)
    )


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent.parent / "moeconf" / "engines"
    argv, out = take_out(argv)
    if len(argv) == 3 and argv[0] == "--ik-repo":
        repo, rev = Path(argv[1]), argv[2]
        text = render_newest(ik(git_show(repo, rev, "common/common.cpp")), describe_commit(repo, rev))
        out = out or here / "flagtable_iknewest.py"
    elif len(argv) == 2:
        ml_root, ik_root = Path(argv[0]), Path(argv[1])
        ml_values: dict[str, str] = {}
        ik_values: dict[str, str] = {}
        text = render(mainline((ml_root / "common" / "arg.cpp").read_text(), ml_values),
                      ik((ik_root / "common" / "common.cpp").read_text(), ik_values), describe(ml_root),
                      describe(ik_root), ml_values, ik_values)
        out = out or here / "flagtable.py"
    else:
        print(__doc__, file=sys.stderr)
        return 2
    out.write_text(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
