"""`--override-kv KEY=TYPE:VALUE`: the engine reads the model's metadata with the given values in
place of the file's, so an override of a key that sizes anything makes moeconf's figures wrong:
memory is then incomplete with a note naming the override, `explain` prints "?" and `fit` refuses.
Keys with no effect on any buffer stay modelled, and a malformed item is an error the engine stops
on (llama.cpp common/arg.cpp, ik_llama.cpp common/common.cpp, string_parse_kv_override):
docs/memory-architectures.md, "`--override-kv`"."""

from __future__ import annotations

from collections.abc import Sequence

from moeconf.engines import Engine
from moeconf.memory.keys import SCALARS_ONLY, read_by_loader

# scalars whose value adds or removes ops (the routing's gating, normalisation and scale, the
# embedding, logit and residual scales) change the graph: they are refused like sizes
_GRAPH_SCALARS = frozenset(k for k in SCALARS_ONLY
                           if k.startswith("expert_") or k in ("logit_scale", "embedding_scale", "residual_scale"))
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


def unmodelled_overrides(overrides: Sequence[Override], arch: str, engine: str | None = None) -> list[str]:
    """Why memory is not modelled under these overrides (empty: none sizes anything). With the
    engine named, an `{arch}.*` key its loader does not read for `arch` (moeconf/engines/archkeys.py)
    changes nothing."""
    why: list[str] = []
    read = read_by_loader(arch, engine) if engine is not None else None
    for key, where in dict.fromkeys(overrides):
        if key.startswith("tokenizer.") or (key.startswith("general.") and key != "general.architecture"):
            continue
        sub = key[len(arch) + 1:] if key.startswith(arch + ".") else None
        if sub is not None and sub in SCALARS_ONLY and sub not in _GRAPH_SCALARS:
            continue
        if sub is not None and read is not None and sub not in read:
            continue
        why.append(f"memory is not modelled with {where}: moeconf reads the file's {key}, which the engine "
                   "replaces, and that value may size the KV cache, the compute buffers or the layers")
    return why
