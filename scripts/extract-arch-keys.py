#!/usr/bin/env python3
"""Regenerate moeconf/engines/archkeys.py: which `{arch}.*` GGUF keys each architecture's loader
reads in the pinned engines, and into which hparams field.

    python scripts/extract-arch-keys.py MAINLINE_LLAMA_CPP_DIR [IK_LLAMA_CPP_DIR] [--out FILE]

The directories are the pinned packages' vendored trees (scripts/build-engines.sh unpacks them);
the header names each package version and the engine commit it vendors (scripts/_pinned.py).

mainline (llama.cpp):
  src/llama-arch.cpp   LLM_ARCH_NAMES (arch enum -> name), LLM_KV_NAMES (key enum -> "%s.<key>";
                       only the `%s.` keys, those under the architecture's name, are kept)
  src/llama-model.cpp  llama_model_base::load_hparams: the keys read for every architecture (a
                       block under `if (arch == LLM_ARCH_X ...)` counts for those architectures
                       only); the `case LLM_ARCH_X: return new llama_model_Y(params)` factory
  src/models/models.h  `struct llama_model_Y : public llama_model_Z`: an architecture whose class
                       has no load_arch_hparams of its own uses its base's
  src/models/*.cpp     llama_model_Y::load_arch_hparams: every LLM_KV_* it names, and those of the
                       llama_model_base / base-class methods it calls (load_swa_pattern, ...)
  src/llama-vocab.cpp  the `%s.` keys the vocabulary loader reads (every architecture)
ik_llama.cpp:
  src/llama-arch.cpp   LLM_ARCH_NAMES; src/llama-arch.cpp or src/llama.cpp LLM_KV_NAMES
  src/llama-hparams.cpp (or src/llama-model.cpp)  llm_load_hparams: the keys read before its
                       `switch (model.arch)` for every architecture, then per `case LLM_ARCH_X:`
  src/llama-vocab.cpp  as mainline
A key counts as read where its LLM_KV_* name appears in the code that reads it (`get_key`,
`get_key_or_arr`, `get_arr`, or an array of names a loop reads): a superset of what one file
makes the loader read, never less. Only names and fields are kept: facts, not code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _cparse.py, also when loaded by path
from _cparse import arch_names, factory_classes, function_body, kv_names
from _cparse import matching as _matching
from _pinned import DOC_END_AND_IMPORTS, describe, take_out

_KV = re.compile(r"\bLLM_KV_(\w+)")
# `get_key(LLM_KV_X, hparams.field` / `get_key_or_arr(LLM_KV_X, hparams.field_arr, ...`
_READ = re.compile(r"\b(?:get_key|get_key_or_arr|get_arr|get_arr_n)\s*\(\s*LLM_KV_(\w+)\s*,\s*([\w.\[\]>-]+)")


_TOKENS = re.compile(r"""'(?:\\.|[^'\\\n])'|"(?:\\.|[^"\\\n])*"|/\*.*?\*/|//[^\n]*""", re.S)


def _strip_comments(src: str) -> str:
    """The source without comments, string literals kept (a `//` inside one is not a comment)."""
    def keep(m: re.Match[str]) -> str:
        t = m.group()
        if t[0] in "'\"":
            return t
        return re.sub(r"[^\n]", " ", t) if t.startswith("/*") else ""
    return _TOKENS.sub(keep, src)


def _fields(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for enum, target in _READ.findall(text):
        field = target.removeprefix("hparams.").removeprefix("model.hparams.")
        out.setdefault(enum, set()).add(field)
    return out


def _split_by_arch(body: str) -> tuple[str, dict[str, str]]:
    """(the text read for every architecture, {arch enum: text read for it only}): each
    `if (arch == LLM_ARCH_X || ...) { ... }` block belongs to the architectures it names."""
    only: dict[str, str] = {}
    common: list[str] = []
    i = 0
    for m in re.finditer(r"\bif\s*\(", body):
        if m.start() < i:
            continue
        cond_end = _matching(body, m.end() - 1)
        cond = body[m.end() - 1: cond_end]
        rest = body[cond_end:].lstrip()
        if not rest.startswith("{") or not re.fullmatch(r"\(\s*(?:arch\s*==\s*LLM_ARCH_\w+\s*(?:\|\|\s*)?)+\)", cond):
            continue
        brace = body.index("{", cond_end)
        end = _matching(body, brace, "{", "}")
        common.append(body[i: m.start()])
        for enum in re.findall(r"LLM_ARCH_(\w+)", cond):
            only[enum] = only.get(enum, "") + body[brace:end]
        i = end
    common.append(body[i:])
    return "".join(common), only


def _method_texts(sources: list[str], cls: str, method: str) -> str | None:
    for src in sources:
        body = function_body(src, rf"\b{cls}::{method}\s*\(\s*llama_model_loader\s*&")
        if body is not None:
            return body
    return None


def _with_calls(body: str, sources: list[str], classes: list[str], depth: int = 0) -> str:
    """`body` plus the bodies of the methods it calls on `ml` (`load_swa_pattern(ml, 4)`,
    `llama_model_X::load_arch_hparams(ml)`) of its own class chain and llama_model_base."""
    text = body
    if depth > 3:
        return text
    for m in re.finditer(r"\b(?:(llama_model_\w+)::)?(\w+)\s*\(\s*ml\b", body):
        owner, name = m.group(1), m.group(2)
        if name.startswith("get_") or name in ("create_tensor",):
            continue
        for cls in ([owner] if owner else [*classes, "llama_model_base"]):
            callee = _method_texts(sources, cls, name)
            if callee is not None:
                text += _with_calls(callee, sources, classes, depth + 1)
                break
    return text


def mainline(root: Path) -> tuple[dict[str, str], dict[str, tuple[set[str], dict[str, set[str]]]]]:
    """(key names, {arch name: (keys read, {key: fields})})."""
    src = root / "src"
    names = arch_names(_strip_comments((src / "llama-arch.cpp").read_text()))
    keys = kv_names(_strip_comments((src / "llama-arch.cpp").read_text()))
    model_cpp = _strip_comments((src / "llama-model.cpp").read_text())
    headers = _strip_comments((src / "models" / "models.h").read_text())
    sources = [model_cpp] + [_strip_comments(p.read_text()) for p in sorted((src / "models").glob("*.cpp"))]
    base = function_body(model_cpp, r"\bllama_model_base::load_hparams\s*\(\s*llama_model_loader\s*&") or ""
    base = base.split("load_arch_hparams(ml)")[0]  # the per-arch part follows
    common, only = _split_by_arch(base)
    vocab = _strip_comments((src / "llama-vocab.cpp").read_text())
    common += "\n".join(m.group() for m in _READ.finditer(vocab))
    cls_of = factory_classes(model_cpp)
    out: dict[str, tuple[set[str], dict[str, set[str]]]] = {}
    for enum, name in names.items():
        cls = cls_of.get(enum)
        chain: list[str] = []
        while cls and cls not in chain:
            chain.append(cls)
            parent = re.search(rf"struct\s+{cls}\s*:\s*public\s+(\w+)", headers)
            cls = parent.group(1) if parent and parent.group(1) != "llama_model_base" else None
        if not chain:
            continue  # no loader (an architecture the factory does not build)
        own = ""
        for c in chain:
            body = _method_texts(sources, c, "load_arch_hparams")
            if body is not None:
                own = _with_calls(body, sources, chain)
                break
        text = common + only.get(enum, "") + own
        read = {k for k in _KV.findall(text) if k in keys}
        fields = {keys[k]: f for k, f in _fields(text).items() if k in keys}
        out[name] = ({keys[k] for k in read}, fields)
    return keys, out


def ik(root: Path) -> tuple[dict[str, tuple[set[str], dict[str, set[str]]]], dict[str, set[str]]]:
    """({arch name: (keys read, {key: fields})}, {arch name: the keys its own case requires whatever the file})."""
    src = root / "src"
    names = arch_names(_strip_comments((src / "llama-arch.cpp").read_text()))
    keys: dict[str, str] = {}
    for f in ("llama-arch.cpp", "llama.cpp"):
        text = (src / f).read_text()
        if "LLM_KV_NAMES" in text:
            keys = kv_names(_strip_comments(text))
            break
    loader = None
    for f in ("llama-hparams.cpp", "llama-model.cpp", "llama.cpp"):
        p = src / f
        if p.is_file():
            loader = function_body(_strip_comments(p.read_text()), r"\bvoid\s+llm_load_hparams\s*\(")
            if loader:
                break
    if loader is None:
        raise SystemExit(f"{root}: no llm_load_hparams found")
    sw = re.search(r"switch\s*\(\s*model\.arch\s*\)\s*\{", loader)
    if sw is None:
        raise SystemExit(f"{root}: llm_load_hparams has no switch (model.arch)")
    brace = sw.end() - 1
    block = loader[brace: _matching(loader, brace, "{", "}")]
    head, tail = loader[: sw.start()], loader[brace + len(block):]
    common_text, only = _split_by_arch(head + tail)
    vocab = _strip_comments((src / "llama-vocab.cpp").read_text())
    common_text += "\n".join(m.group() for m in _READ.finditer(vocab))
    per: dict[str, str] = {}
    pending: list[str] = []
    pos = 0
    for m in re.finditer(r"\bcase\s+LLM_ARCH_(\w+)\s*:", block):
        if pending:
            text = block[pos: m.start()]
            if text.strip():
                for e in pending:
                    per[e] = text
                pending = []
        pending.append(m.group(1))
        pos = m.end()
    for e in pending:
        per[e] = block[pos:]
    out: dict[str, tuple[set[str], dict[str, set[str]]]] = {}
    required: dict[str, set[str]] = {}
    for enum, name in names.items():
        text = common_text + only.get(enum, "") + per.get(enum, "")
        read = {k for k in _KV.findall(text) if k in keys}
        fields = {keys[k]: f for k, f in _fields(text).items() if k in keys}
        out[name] = ({keys[k] for k in read}, fields)
        if (req := {keys[k] for k in surely_required(per.get(enum, "")) if k in keys}):
            required[name] = req
    return out, required


# the calls whose last argument says whether the key is required (default: it is), by their arguments before it
_REQUIRED_ARGS = {"get_key": 2, "get_arr": 2, "get_key_or_arr": 3}


def _args(text: str, open_paren: int) -> list[str]:
    """The top-level arguments of the call whose `(` is at `open_paren`."""
    end = _matching(text, open_paren)
    out, depth, start = [], 0, open_paren + 1
    for i in range(open_paren + 1, end - 1):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:end - 1].strip())
    return out


def surely_required(case: str) -> set[str]:
    """The LLM_KV_* names a `case LLM_ARCH_X:` body of llm_load_hparams reads as required whatever the file: a
    `get_key`/`get_arr`/`get_key_or_arr` call without `false` for `required`, a statement of the case's own block
    (not inside a nested block, and not under an `if`, `else`, loop or `?:`)."""
    body = case[case.index("{") + 1: _matching(case, case.index("{"), "{", "}") - 1] if "{" in case else case
    flat, i = [], 0
    while i < len(body):  # nested blocks become `;`: what follows one is a statement of its own
        if body[i] == "{":
            i = _matching(body, i, "{", "}")
            flat.append(";")
            continue
        flat.append(body[i])
        i += 1
    out: set[str] = set()
    for stmt in "".join(flat).split(";"):
        stmt = stmt.strip()
        m = re.fullmatch(r"ml\.(get_key|get_arr|get_key_or_arr)\s*(\(.*\))", stmt, re.S)
        if m is None:
            continue
        args = _args(stmt, m.start(2))
        kid = re.fullmatch(r"LLM_KV_(\w+)", args[0])
        if kid and (len(args) == _REQUIRED_ARGS[m.group(1)] or args[-1] == "true"):
            out.add(kid.group(1))
    return out


def _wrap(items: list[str], indent: str, width: int = 116) -> list[str]:
    lines, line = [], indent
    for it in items:
        piece = repr(it) + ", "
        if len(line) + len(piece.rstrip()) > width and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += piece
    if line.strip():
        lines.append(line.rstrip())
    return lines


def _table(name: str, doc: str, per: dict[str, tuple[set[str], dict[str, set[str]]]]) -> list[str]:
    common = set.intersection(*(r for r, _ in per.values())) if per else set()
    out = [f"# {doc}", f"{name}: Final[dict[str, frozenset[str]]] = {{"]
    for arch in sorted(per):
        extra = sorted(per[arch][0] - common)
        out.append(f"    {arch!r}: _COMMON_{name} | frozenset({{")
        out.extend(_wrap(extra, "        "))
        out.append("    }),")
    out.append("}")
    head = [f"_COMMON_{name}: Final = frozenset({{", *_wrap(sorted(common), "    "), "})"]
    return [*head, "", *out]


def render(ml_root: Path, ik_root: Path | None) -> str:
    _, ml = mainline(ml_root)
    fields: dict[str, set[str]] = {}
    for _, f in ml.values():
        for k, v in f.items():
            fields.setdefault(k, set()).update(v)
    tags = [describe(ml_root)] + ([describe(ik_root)] if ik_root else [])
    lines = [
        '"""Which `{arch}.*` GGUF keys (after `{arch}.`) each architecture\'s loader reads in the pinned',
        "engines, and the hparams field each is read into: a key an architecture's loader does not read",
        "cannot change what the engine allocates for it.",
        "",
        f"Generated by scripts/extract-arch-keys.py from {tags[0]}" + (";" if len(tags) > 1 else ""),
        *[f"{t}" for t in tags[1:]],
        "(src/llama-arch.cpp LLM_KV_NAMES; llama.cpp src/llama-model.cpp load_hparams and",
        "src/models/*.cpp load_arch_hparams; ik_llama.cpp llm_load_hparams). Do not edit by hand.",
        *DOC_END_AND_IMPORTS,
    ]
    lines += _table("MAINLINE", "llama.cpp: architecture -> the keys its loader reads", ml)
    lines += ["", "# llama.cpp: key -> the hparams fields a loader reads it into",
              "FIELDS: Final[dict[str, tuple[str, ...]]] = {"]
    for k in sorted(fields):
        lines.append(f"    {k!r}: {tuple(sorted(fields[k]))!r},")
    lines.append("}")
    if ik_root is not None:
        ik_read, ik_required = ik(ik_root)
        lines += ["", *_table("IK", "ik_llama.cpp: architecture -> the keys its loader reads", ik_read)]
        lines += ["",
                  "# ik_llama.cpp: architecture -> the keys its own case of llm_load_hparams requires whatever the",
                  "# file (get_key, get_arr, get_key_or_arr without `false`, outside any condition): a file without",
                  "# one fails to load (\"key not found in model\")",
                  "IK_REQUIRED: Final[dict[str, frozenset[str]]] = {"]
        for arch in sorted(ik_required):
            lines.append(f"    {arch!r}: frozenset({{")
            lines.extend(_wrap(sorted(ik_required[arch]), "        "))
            lines.append("    }),")
        lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    argv, out_arg = take_out(argv)
    if len(argv) not in (1, 2):
        raise SystemExit("usage: extract-arch-keys.py MAINLINE_LLAMA_CPP_DIR [IK_LLAMA_CPP_DIR] [--out FILE]")
    ml_root = Path(argv[0])
    ik_root = Path(argv[1]) if len(argv) == 2 else None
    out = out_arg or Path(__file__).resolve().parent.parent / "moeconf" / "engines" / "archkeys.py"
    out.write_text(render(ml_root, ik_root))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
