#!/usr/bin/env python3
"""Regenerate moeconf/engines/benchtable.py: every option llama-bench's own argument parser knows
(it does not use the engines' common parser: engines/flagtable.py is not its table), how many
values each takes, whether the value is a list (one test per item), the setting it fills, and
llama-bench's defaults for those settings.

    python scripts/extract-bench-flags.py MAINLINE IK [--out FILE]

MAINLINE and IK are the pinned engines' source trees (as for scripts/extract-engine-flags.py):
llama.cpp tools/llama-bench/llama-bench.cpp and ik_llama.cpp examples/llama-bench/llama-bench.cpp.
Both read argv in parse_cmd_params as a chain of `if (arg == "-x" || arg == "--y")` blocks; every
`++i >= argc` in a block consumes one value. A value is a list where the block splits it on
llama-bench's `split_delim` (`,`), reads it as an int range list (parse_int_range), or splits
-ot's sets on `,` (llama.cpp's strcspn loop). The setting is the first `params.<field>` the block
fills; the defaults are cmd_params_defaults' entries, as written (`/* field */ value`). Only
names, counts and default values are kept: facts, not code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _cparse.py, also when loaded by path
from _cparse import matching as _matching
from _pinned import describe, take_out, wrapped

_VALUE = re.compile(r"\+\+i\s*>=\s*argc")
_LIST = re.compile(r"\bsplit_delim\b|parse_int_range\(|string_split_pairs<[^>]*>\(\s*argv\[i\]\s*,\s*split_delim"
                   r"|strcspn\(\s*value\s*,\s*\",\"\s*\)")


def options(src: str) -> tuple[dict[str, int], list[str], dict[str, str], list[str], list[str]]:
    """(flag -> values it takes, the flags whose value is a `,` list, flag -> the setting it fills,
    the lists read as int ranges (parse_int_range: `first[-last[+|*step]]`), the lists of 0/1
    (string_split<bool>: an istream reads each item as 0 or 1))."""
    start = src.index("parse_cmd_params(int argc")
    body = src[start: _matching(src, src.index("{", start), "{", "}")]
    blocks = list(re.finditer(
        r'if \(\s*(?:[\w:()]+\s*&&\s*)?\(?(arg == "[^"]+"(?:\s*\|\|\s*arg == "[^"]+")*)\)?\s*\)\s*\{', body))
    values: dict[str, int] = {}
    lists: list[str] = []
    fields: dict[str, str] = {}
    ranges: list[str] = []
    bools: list[str] = []
    for k, m in enumerate(blocks):
        end = blocks[k + 1].start() if k + 1 < len(blocks) else len(body)
        block = body[m.end(): end]
        n = len(_VALUE.findall(block))
        field = re.search(r"\bparams\.(\w+)", block)
        for name in re.findall(r'arg == "([^"]+)"', m.group(1)):
            values[name] = max(values.get(name, 0), n)
            if n and _LIST.search(block):
                lists.append(name)
            if field is not None:
                fields[name] = field.group(1)
            if re.search(r"parse_int_range\(\s*argv\[i\]", block):
                ranges.append(name)
            if re.search(r"string_split<bool>\(\s*argv\[i\]", block):
                bools.append(name)
    return values, sorted(set(lists)), fields, sorted(set(ranges)), sorted(set(bools))


def ncmoe_pattern(src: str) -> tuple[str, str] | None:
    """The regex a `--n-cpu-moe` of llama-bench adds per block, where the source writes it out
    (ik_llama.cpp: `"<before>" + std::to_string(l) + "<after>"`): (before, after) as C strings
    read; None where it calls the common code (llama.cpp: llm_ffn_block_regex, as the server does)."""
    m = re.search(r'std::string\s+pattern\s*=\s*"((?:[^"\\]|\\.)*)"\s*\+\s*std::to_string\(\s*\w+\s*\)\s*\+\s*'
                  r'"((?:[^"\\]|\\.)*)"', src)
    if m is None:
        return None
    return m.group(1).replace("\\\\", "\\"), m.group(2).replace("\\\\", "\\")


def defaults(src: str) -> dict[str, str]:
    """cmd_params_defaults' entries: field -> its value as written (whitespace collapsed)."""
    start = src.index("cmd_params_defaults = {")
    body = src[start + len("cmd_params_defaults = "): _matching(src, src.index("{", start), "{", "}")]
    out: dict[str, str] = {}
    marks = list(re.finditer(r"/\*\s*(\w+)\s*\*/", body))
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(body) - 1
        out[m.group(1)] = re.sub(r"\s+", " ", body[m.end(): end].strip().rstrip(",")).strip()
    return out


def _dict(name: str, d: dict[str, object], kind: str) -> str:
    body = wrapped([f" {k!r}: {v!r}," for k, v in sorted(d.items())])
    return f"{name}: Final[dict[str, {kind}]] = {{\n" + body + "\n}\n"


def _set(name: str, items: list[str]) -> str:
    if not items:
        return f"{name}: Final[frozenset[str]] = frozenset()\n"
    return f"{name}: Final[frozenset[str]] = frozenset({{\n" + wrapped([f" {k!r}," for k in items]) + "\n})\n"


def render(ml_src: str, ik_src: str, rev_ml: str, rev_ik: str) -> str:
    out = ['"""Every option llama-bench\'s own argument parser knows, per engine: how many values it takes,\n'
           "the options whose value is a `,` list (llama-bench runs one test per item, over every\n"
           "combination), the setting each fills, and llama-bench's defaults (cmd_params_defaults, as written).\n\n"
           "Generated by scripts/extract-bench-flags.py from llama.cpp tools/llama-bench/llama-bench.cpp\n"
           f"({rev_ml})\nand ik_llama.cpp examples/llama-bench/llama-bench.cpp ({rev_ik}).\n"
           'Do not edit by hand.\n"""\n\nfrom __future__ import annotations\n\nfrom typing import Final\n\n'
           f"SOURCES: Final[dict[str, str]] = {{\n    'llama.cpp': {rev_ml!r},\n    'ik_llama.cpp': {rev_ik!r},\n}}\n"]
    for prefix, src in (("MAINLINE", ml_src), ("IK", ik_src)):
        values, lists, fields, ranges, bools = options(src)
        out += ["\n", _dict(f"{prefix}_FLAGS", dict(values), "int"), "\n", _set(f"{prefix}_LISTS", lists), "\n",
                _set(f"{prefix}_RANGES", ranges), "\n", _set(f"{prefix}_BOOLS", bools), "\n",
                f"{prefix}_NCMOE_PATTERN: Final[tuple[str, str] | None] = {ncmoe_pattern(src)!r}\n", "\n",
                _dict(f"{prefix}_FIELDS", dict(fields), "str"), "\n",
                _dict(f"{prefix}_DEFAULTS", dict(defaults(src)), "str")]
    return "".join(out)


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent.parent / "moeconf" / "engines"
    argv, out = take_out(argv)
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    ml_root, ik_root = Path(argv[0]), Path(argv[1])
    text = render((ml_root / "tools" / "llama-bench" / "llama-bench.cpp").read_text(),
                  (ik_root / "examples" / "llama-bench" / "llama-bench.cpp").read_text(),
                  describe(ml_root), describe(ik_root))
    out = out or here / "benchtable.py"
    out.write_text(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
