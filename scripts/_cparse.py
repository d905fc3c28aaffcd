"""What the engine-source extractors (extract-engine-flags.py, extract-engine-names.py,
extract-arch-keys.py, extract-tensor-layers.py, ...) share for reading C/C++ text: the bracket
matcher, a function's body, the architecture and key name tables, a switch's `case LLM_ARCH_X:`
targets. Facts are read from the sources, nothing is copied. The readers of tables take the text
without its comments (each script strips them its own way)."""

from __future__ import annotations

import re


def matching(text: str, start: int, open_: str = "(", close: str = ")") -> int:
    """Index just past the bracket matching text[start] (strings and chars skipped)."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced")


def function_body(src: str, header: str) -> str | None:
    """The body (between braces) of the first function whose definition matches `header` (a regex)."""
    m = re.search(header, src)
    if not m:
        return None
    brace = src.index("{", m.end())
    return src[brace: matching(src, brace, "{", "}")]


def arch_names(src: str) -> dict[str, str]:
    """LLM_ARCH_NAMES: arch enum (without the prefix) -> architecture name."""
    start = src.index("LLM_ARCH_NAMES")
    block = src[start: src.index("};", start)]
    out: dict[str, str] = {}
    for enum, name in re.findall(r'\{\s*LLM_ARCH_(\w+)\s*,\s*"([^"]+)"\s*\}', block):
        if enum != "UNKNOWN":
            out.setdefault(enum, name)
    return out


def kv_names(src: str) -> dict[str, str]:
    """LLM_KV_NAMES: key enum (without the prefix) -> the key after `{arch}.`, for the `%s.` keys only."""
    start = src.index("LLM_KV_NAMES")
    block = src[start: src.index("};", start)]
    return {e: k for e, k in re.findall(r'\{\s*LLM_KV_(\w+)\s*,\s*"%s\.([^"]+)"\s*\}', block)}


def case_targets(switch: str, target: str) -> dict[str, str]:
    """Arch enum -> group 1 of the first match of `target` (a regex) after its `case LLM_ARCH_X:`
    labels in a switch's text (the labels falling through to it share it)."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for m in re.finditer(rf"case\s+LLM_ARCH_(\w+)\s*:|{target}", switch):
        if m.group(1):
            pending.append(m.group(1))
        else:
            for enum in pending:
                out.setdefault(enum, m.group(2))
            pending = []
    return out


def factory_classes(model_cpp: str) -> dict[str, str]:
    """llama.cpp's model factory (the switch around the first `return new llama_model_...` of
    src/llama-model.cpp): arch enum -> the class it builds."""
    first = model_cpp.index("return new llama_model_")
    brace = model_cpp.index("{", model_cpp.rindex("switch", 0, first))
    factory = model_cpp[brace: matching(model_cpp, brace, "{", "}")]
    return case_targets(factory, r"return\s+new\s+(llama_model_\w+)\s*\(")
