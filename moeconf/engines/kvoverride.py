"""`--override-kv KEY=TYPE:VALUE` as each engine reads it: the items of a launch, and the malformed
ones the engine stops on (llama.cpp common/arg.cpp, ik_llama.cpp common/common.cpp,
string_parse_kv_override). Which overrides memory refuses: memory/families.py (docs/memory-architectures.md,
"`--override-kv`")."""

from __future__ import annotations

from collections.abc import Sequence

from moeconf.engines import Engine

_TYPES = ("int:", "float:", "bool:", "str:")

Override = tuple[str, str]  # (the key, the flag and item as written)


def read_kv_overrides(words: Sequence[str], engine: Engine) -> tuple[tuple[Override, ...], tuple[str, ...]]:
    """Each `--override-kv` item of argv (binary first or not), and the items the engine refuses."""
    from moeconf.engines.argvread import option_values

    ik = engine.name == "ik_llama.cpp"
    found: list[Override] = []
    problems: list[str] = []
    for name, value in option_values(words, engine):
        if name == "--override-kv" and value is not None:
            for item in ([value] if ik else value.split(",")):
                problem = _malformed(item)
                if problem:
                    problems.append(f"{engine.label} stops on --override-kv {item!r}: {problem}")
                else:
                    found.append((item.split("=", 1)[0], f"--override-kv {item}"))
    return tuple(found), tuple(problems)


def _malformed(item: str) -> str:
    key, sep, value = item.partition("=")
    if not sep or len(key) >= 128:
        return "expected KEY=TYPE:VALUE (a key under 128 characters)"
    if not value.startswith(_TYPES):
        return "the type must be int:, float:, bool: or str:"
    if value.startswith("bool:") and value[5:] not in ("true", "false"):
        return "a bool is true or false"
    if value.startswith("str:") and len(value) - 4 > 127:
        return "a string value is at most 127 characters"
    return ""
