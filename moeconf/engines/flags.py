"""The options a plan sets through its own keys (so `[flags] extra` may not repeat them), and a
reader of `extra` as the engine reads it. Which options each engine knows comes from the
tables read from the engines' argument parsers (engines/flagtable.py: the pinned packages;
engines/flagtable_iknewest.py: the newest ik_llama.cpp code read). Both engines refuse an
argument they do not know, and both read a long option with `_` as `-`.
"""

from __future__ import annotations

import re
from typing import Final

from moeconf.engines import IK_OLDEST_DATE, Engine

_FIT = "[flags] fit (moeconf plans place tensors themselves; fit would choose at load time)"
_RULES_CPU = "rules (\"experts -> cpu\", \"experts first N -> cpu\", ...)"
_GPUS = "[engine] gpus (the devices the plan places on)"
# the option-table rows of fit's own tuning (llama.cpp's target and context, ik_llama.cpp's margin)
FIT_TUNING: Final = ("-fitt", "-fitc", "--fit-margin", "-gfm")


def _plan_keys() -> dict[str, str]:
    from moeconf.engines.options import options, row

    # the plan's own fields, every spelling, from the one option table (engines/options.py)
    keys = {n: f"[{o.section}] {o.field}" for o in options() if o.field is not None for n in o.names}
    # the options a plan writes as rules, devices or its own fit, every spelling from the table
    for flag, key in (("-ot", "rules"), ("-cmoe", _RULES_CPU), ("-ncmoe", _RULES_CPU), ("-ncffn", "rules"),
                      ("-dev", _GPUS), ("--max-gpu", _GPUS), *((f, _FIT) for f in ("-fit", *FIT_TUNING)),
                      ("--kv-unified-per-slot", "[flags] ctx_size (the KV pool: slots x context per slot)"),
                      ("-lm", "[flags] no_mmap and mlock")):
        keys.update(dict.fromkeys(row(flag).names, key))
    keys["--mmap"] = "[flags] no_mmap"  # mainline before b10108 (in no table: the newest code has -lm)
    return keys


# Options a plan sets through its own keys, in every spelling: placement, the devices, memory.
# In `[flags] extra` they would be a second, unsimulated copy that the engine reads last.
PLAN_KEYS: Final[dict[str, str]] = _plan_keys()


def flag_table(engine: Engine) -> dict[str, int]:
    """Every flag `engine`'s argument parser knows -> how many values it takes.

    llama.cpp: the pinned llama-cpp-python's parser (the newest mainline code read; flags it no
    longer has are in cmdline.REMOVED_FLAGS with the builds that still take them). ik_llama.cpp:
    the pinned ik-llama-cpp-python 0.1.5's parser for 0.1.5 and anything dated no later than its
    commit (IK_OLDEST_DATE); for a newer ik, the newest ik code read (flagtable_iknewest: it
    knows every flag of 0.1.5, so between the two a flag added after the named build is not
    caught)."""
    if engine.name == "ik_llama.cpp":
        if engine.date is not None and engine.date <= IK_OLDEST_DATE:
            from moeconf.engines.flagtable import IK

            return IK
        from moeconf.engines.flagtable_iknewest import IK_NEWEST

        return IK_NEWEST
    from moeconf.engines.flagtable import MAINLINE

    return MAINLINE


def is_number(word: str) -> bool:
    """A word the engines read as a number (a negative value, not an option)."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def value_kinds(engine: Engine) -> dict[str, str]:
    """Flag -> how `engine` reads its value as a number (flagtable MAINLINE_VALUES / IK_VALUES:
    `int`, `uint`, `float`, `floats`, with the words taken before it after `|`). ik_llama.cpp
    newer than its package: the package's table (the newest ik code was read for names only)."""
    from moeconf.engines.flagtable import IK_VALUES, MAINLINE_VALUES

    return IK_VALUES if engine.name == "ik_llama.cpp" else MAINLINE_VALUES


_INT_MAX = 2**31 - 1
_ULONG_MAX = 2**64 - 1
_FLT_OVERFLOW = 3.4028235677973366e38  # FLT_MAX and half its last place: strtof rounds above it to inf
_C_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?)(\d+)")
_C_FLOAT = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))",
                      re.I)


# the C++ conversion each kind of value goes through
_FN = {"int": "std::stoi", "uint": "std::stoul", "float": "std::stof", "floats": "std::stof"}


def _pieces(base: str, text: str) -> list[str]:
    """What one conversion reads: the whole word, or each piece of a `,`/`/` list (-ts)."""
    return [p for p in re.split(r"[,/]+", text) if p] if base == "floats" else [text]


def _c_read(base: str, piece: str) -> tuple[re.Match[str] | None, str | None]:
    """`piece` as the C++ conversion of `base` reads it: (the number it matched, why it throws: "none"
    where no number starts the piece, "range" where the number is out of the type's range; None)."""
    if base in ("int", "uint"):
        m = _C_INT.match(piece)
        if m is None:
            return None, "none"
        n = int(m.group(1) + m.group(2))
        out = (n > _INT_MAX or n < -_INT_MAX - 1) if base == "int" else abs(n) > _ULONG_MAX
        return m, "range" if out else None
    m = _C_FLOAT.match(piece)
    if m is None:
        return None, "none"
    literal = m.group(1).lstrip("+-")[:1].lower() in ("i", "n")
    return m, "range" if not literal and abs(float(m.group(1))) >= _FLT_OVERFLOW else None


def c_int(text: str) -> int | None:
    """`text` as std::stoi reads it (the digits after optional blanks and sign; the rest ignored),
    None where it finds no number or the number is out of an int's range."""
    m, why = _c_read("int", text)
    return int(m.group(1) + m.group(2)) if m is not None and why is None else None


def c_floats(text: str) -> list[float] | None:
    """A `,`/`/`-separated list as the engines read -ts (std::stof on each piece), None where a
    piece is no number or beyond a float's range."""
    out = []
    for piece in _pieces("floats", text):
        m, why = _c_read("float", piece)
        if m is None or why is not None:
            return None
        out.append(float(m.group(1)))
    return out


def value_problem(engine: Engine, name: str, text: str, shown: str | None = None) -> str | None:
    """Why `engine` refuses `text` as the value of `name` where it converts it to a number (the
    C++ std::stoi / std::stoul / std::stof it calls throws: no number at the start, or out of the
    type's range; the engine then stops before loading), None where it takes it. What follows the
    number is ignored, as those functions do (`-c 4096k` is 4096). Hexadecimal floats are not
    read (none seen in launch lines)."""
    kind = value_kinds(engine).get(name)
    if kind is None:
        return None
    name = shown or name
    base, *words = kind.split("|")
    if text in words:
        return None
    fn = _FN[base]
    for piece in _pieces(base, text):
        _, why = _c_read(base if base != "floats" else "float", piece)
        if why == "none":
            return f"{name} {text!r}: {engine.label} reads it with {fn}, which finds no number there and stops"
        if why == "range" and base in ("int", "uint"):
            top = _INT_MAX if base == "int" else _ULONG_MAX
            return (f"{name} {text!r}: {engine.label} reads it with {fn}, which stops on a number out of its "
                    f"range ({-_INT_MAX - 1 if base == 'int' else -top:,} to {top:,})")
        if why == "range":
            return (f"{name} {text!r}: {engine.label} reads it with std::stof, which stops on a number beyond "
                    f"a float's range (about 3.4e38)")
    return None


def value_misread(engine: Engine, name: str, text: str) -> str | None:
    """Where `engine` reads `text` as a number it takes only the start of (std::stoi / std::stof stop at
    the first character that is not part of it, and the rest is dropped in silence: `-c 32k` is a
    context of 32), what it reads; None where it reads the whole word or stops on it (value_problem)."""
    kind = value_kinds(engine).get(name)
    if kind is None or value_problem(engine, name, text) is not None:
        return None
    base, *words = kind.split("|")
    if text in words:
        return None
    for piece in _pieces(base, text):
        m, _ = _c_read(base if base != "floats" else "float", piece)
        if m is not None and piece[m.end():].strip():
            return (f"{name} {text!r}: {engine.label} reads {m.group(0).strip()} ({_FN[base]} stops at "
                    f"{piece[m.end():]!r} and drops the rest in silence); write the number in full")
    return None
