#!/usr/bin/env python3
"""Regenerate moeconf/model/nametable.py: the architectures and tensor names the engines know,
which tensor kinds each architecture's loader creates, and which tensors of an MTP/nextn block
the loader still creates (and so places) when MTP is not loaded.

    python scripts/extract-engine-names.py MAINLINE_LLAMA_CPP_DIR [IK_LLAMA_CPP_DIR] [--out FILE]

The directories are the pinned packages' vendored trees (scripts/build-engines.sh unpacks them);
the header names each package version and the engine commit it vendors (scripts/_pinned.py).

mainline (llama.cpp):
  src/llama-arch.cpp   LLM_ARCH_NAMES (arch enum -> name), LLM_TENSOR_NAMES (tensor enum -> name
                       template; a duplicate key keeps its first entry, as std::map does)
  src/llama-model.cpp  the `case LLM_ARCH_X: return new llama_model_Y(params)` factory; the
                       llama_model_base::create_tensor_* helpers
  src/models/*.cpp     llama_model_Y::load_arch_tensors: the tensor kinds it creates; the flag
                       variable that carries TENSOR_SKIP for MTP/nextn blocks, and the
                       create_tensor calls in an MTP block whose flags do not carry it
ik_llama.cpp:
  src/llama-arch.cpp   LLM_ARCH_NAMES
  src/llama-model.cpp  LLM_TENSOR_NAMES: per architecture, tensor enum -> name
  src/llama-load-tensors.cpp  create_tensors(): `case LLM_ARCH_X: ... create_Y_tensors(`; and in
                       create_Y_tensors the same TENSOR_SKIP reading as mainline
Only names, enum names and flags are kept: facts, not code.

The MTP reading is static: a block-level create_tensor call counts as "in an MTP block" when a
brace block around it (inside the loader function) mentions a variable that carries TENSOR_SKIP;
it is "created without the skip" when its flags argument mentions none of those variables.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _cparse.py, also when loaded by path
from _cparse import arch_names, case_targets, factory_classes, function_body
from _cparse import matching as _matching
from _pinned import describe, take_out


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def _split_args(args: str) -> list[str]:
    """Top-level comma-separated arguments of a call's argument text."""
    out, depth, cur = [], 0, []
    for c in args:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _name_entries(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for enum, name in re.findall(r'\{\s*LLM_TENSOR_(\w+)\s*,\s*"([^"]+)"\s*\}', block):
        out.setdefault(enum, name)  # std::map initializer: the first of two equal keys stays
    return out


def mainline_unused_kinds(arch_cpp: str) -> set[str]:
    """Kinds whose LLM_TENSOR_INFOS op is GGML_OP_NONE: the loader creates them as unused
    ("model has unused tensor ... -- ignoring", llama-model-loader.cpp create_tensor)."""
    src = _strip_comments(arch_cpp)
    start = src.index("LLM_TENSOR_INFOS")
    brace = src.index("{", start)
    block = src[brace: _matching(src, brace, "{", "}")]
    return set(re.findall(r"\{\s*LLM_TENSOR_(\w+)\s*,\s*\{[^}]*\bGGML_OP_NONE\s*\}", block))


def mainline_tensor_names(arch_cpp: str) -> dict[str, str]:
    src = _strip_comments(arch_cpp)
    start = src.index("LLM_TENSOR_NAMES")
    brace = src.index("{", start)
    return _name_entries(src[brace: _matching(src, brace, "{", "}")])


# --- which kinds a loader function creates, and what its MTP blocks keep ----------------------

_TN = re.compile(r"\btn\s*\(\s*LLM_TENSOR_(\w+)\s*(?:,\s*\"(\w+)\")?\s*(?:,\s*(\w+))?")


def _blocks_around(body: str, pos: int) -> list[tuple[int, int]]:
    """The brace blocks of `body` that contain `pos`, innermost first (the outermost, the
    function body itself, left out)."""
    stack: list[int] = []
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c in "\"'":
            j = i + 1
            while j < len(body) and body[j] != c:
                j += 2 if body[j] == "\\" else 1
            i = j + 1
            continue
        if c == "{":
            stack.append(i)
        elif c == "}":
            s = stack.pop()
            if s < pos < i and s != 0:
                spans.append((s, i + 1))
        i += 1
    return sorted(spans, key=lambda sp: sp[1] - sp[0])


def _skip_vars(body: str) -> set[str]:
    """Variables that carry TENSOR_SKIP (`mtp_flags |= TENSOR_SKIP`, `mtp_flags = x ? 0 : TENSOR_SKIP`),
    and those assigned from them (`flags = (i >= n_layer) ? mtp_flags : trunk_flags`)."""
    out: set[str] = set()
    for m in re.finditer(r"\b(\w+)\s*(\|?=)\s*([^;]*)", body):
        if re.search(r"\bTENSOR_SKIP\b(?!_)", m.group(3)) and m.group(1) not in ("skip",):
            out.add(m.group(1))
    changed = True
    while changed:
        changed = False
        for m in re.finditer(r"\b(?:int|auto)\s+(\w+)\s*=\s*([^;]*)", body):
            if m.group(1) not in out and any(re.search(rf"\b{re.escape(v)}\b", m.group(2)) for v in out):
                out.add(m.group(1))
                changed = True
    return out


def _calls(body: str, helpers: dict[str, set[tuple[str, str]]]) -> list[tuple[int, set[tuple[str, str]], str, bool]]:
    """(position, {(kind, suffix)}, flags text, has block id) of each tensor-creating call in `body`:
    create_tensor(... tn(LLM_TENSOR_X, "suffix", i) ..., flags) and helper calls (their kinds,
    the flags they are passed)."""
    out = []
    names = "create_tensor" + "".join(f"|{re.escape(h)}" for h in helpers)
    for m in re.finditer(rf"\b({names})\s*\(", body):
        end = _matching(body, m.end() - 1)
        args = _split_args(body[m.end(): end - 1])
        if not args:
            continue
        if m.group(1) == "create_tensor":
            tn = _TN.search(body, m.end(), end)
            if not tn:
                continue
            kinds = {(tn.group(1), tn.group(2) or "")}
            has_bid = tn.group(3) is not None or (tn.group(2) is None and bool(re.search(
                r"tn\s*\(\s*LLM_TENSOR_\w+\s*,\s*\w+\s*\)", body[m.end(): end])))
            out.append((m.start(), kinds, args[-1], has_bid))
        else:
            out.append((m.start(), helpers[m.group(1)], args[-1], True))
    return out


def _open_paren_before(body: str, close: int) -> int:
    """Index of the '(' matching the ')' at body[close], scanning backwards."""
    depth = 0
    for i in range(close, -1, -1):
        if body[i] == ")":
            depth += 1
        elif body[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


# Conditions that are false in an MTP/nextn block (the last nextn_predict_layers blocks, MoE
# blocks with attention in every loader read): `i < n_layer`, `i < n_layer_dense_lead`,
# `hparams.is_recr(i)`; `i >= n_layer` is true there.
_FALSE_IN_MTP = re.compile(r"\b\w+\s*<\s*(?:\(int\)\s*)?(?:hparams\.)?n_layer(?:_dense_lead)?(?:\(\))?\s*$"
                           r"|is_recr\s*\(")
_TRUE_IN_MTP = re.compile(r"\b\w+\s*>=\s*(?:\(int\)\s*)?(?:hparams\.)?n_layer\s*$")


def _head(body: str, start: int) -> tuple[str, str]:
    """What introduces the brace block at body[start]: ("if", cond), ("else", cond of its if),
    ("lambda", name), or ("", "")."""
    j = start - 1
    while j >= 0 and body[j].isspace():
        j -= 1
    if body[j - 3: j + 1] == "else":
        k = j - 4
        while k >= 0 and body[k].isspace():
            k -= 1
        if body[k] == "}":  # the if block's closing brace: find its head
            depth = 0
            for m in range(k, -1, -1):
                if body[m] == "}":
                    depth += 1
                elif body[m] == "{":
                    depth -= 1
                    if depth == 0:
                        kind, cond = _head(body, m)
                        return ("else", cond) if kind == "if" else ("", "")
        return "", ""
    if body[j] == ")":
        o = _open_paren_before(body, j)
        before = body[:o].rstrip()
        lam = re.search(r"\bauto\s+(\w+)\s*=\s*\[[^\]]*\]\s*$", before)
        if lam:
            return "lambda", lam.group(1) + "|" + body[o + 1: j]
        if re.search(r"\bif\s*$", before):
            return "if", body[o + 1: j].strip()
    return "", ""


def loader_facts(body: str, helpers: dict[str, set[tuple[str, str]]]) -> tuple[set[str], set[str], bool]:
    """(tensor kinds created, "kind.suffix" created in an MTP block without the skip flag,
    whether the function skips MTP blocks at all)."""
    kinds = set(re.findall(r"\bLLM_TENSOR_(\w+)", body))
    for h, hk in helpers.items():
        if re.search(rf"\b{re.escape(h)}\s*\(", body):
            kinds |= {k for k, _ in hk}
    skip = _skip_vars(body)
    loaded: set[str] = set()
    if not skip:
        return kinds, loaded, False

    def mentions(names: set[str], text: str) -> bool:
        return any(re.search(rf"\b{re.escape(v)}\b", text) for v in names)

    for pos, ks, flags, has_bid in _calls(body, helpers):
        if not has_bid:
            continue
        carried = set(skip)
        in_mtp = False
        for s, e in _blocks_around(body, pos):
            kind, cond = _head(body, s)
            neg = re.fullmatch(r"!\s*(\w+)", cond.strip()) if kind == "if" else None
            if kind == "if" and (_FALSE_IN_MTP.search(cond) or (neg and neg.group(1) in carried)):
                in_mtp = False  # `if (!flags)`: only where the skip flag is not set
                break
            if kind == "else" and _TRUE_IN_MTP.search(cond):
                in_mtp = False
                break
            if kind == "lambda":
                name, params = cond.split("|", 1)
                pnames = [p.split()[-1] for p in _split_args(params) if p.split()]
                # the lambda's parameters that some call passes a skip-carrying variable
                for call in re.finditer(rf"\b{re.escape(name)}\s*\(", body):
                    args = _split_args(body[call.end(): _matching(body, call.end() - 1) - 1])
                    for p, a in zip(pnames, args, strict=False):
                        if mentions(skip, a):
                            carried.add(p)
                            in_mtp = True
            if mentions(skip, body[s:e]):
                in_mtp = True
        if in_mtp and not mentions(carried, flags):
            loaded |= {f"{k}.{suf}" if suf else k for k, suf in ks}
    return kinds, loaded, True


def _helpers(src: str, cls: str) -> dict[str, set[tuple[str, str]]]:
    """`cls::create_tensor_*` helpers (not create_tensor itself) -> the (kind, suffix) they create."""
    out: dict[str, set[tuple[str, str]]] = {}
    for m in re.finditer(rf"\b{cls}::(create_tensor_\w+)\s*\(", src):
        body = function_body(src[m.start():], re.escape(m.group()))
        if body:
            out[m.group(1)] = {(k, s or "") for k, s, _ in _TN.findall(body)}
    return out


def mainline_arch_loaders(root: Path, archs: dict[str, str]) -> dict[str, tuple[set[str], set[str], bool]]:
    model_cpp = _strip_comments((root / "src" / "llama-model.cpp").read_text())
    helpers = _helpers(model_cpp, "llama_model_base")
    sources = {p: _strip_comments(p.read_text()) for p in sorted((root / "src" / "models").glob("*.cpp"))}
    headers = _strip_comments((root / "src" / "models" / "models.h").read_text())
    cls_of = factory_classes(model_cpp)
    out: dict[str, tuple[set[str], set[str], bool]] = {}
    for enum, name in archs.items():
        cls = cls_of.get(enum)
        seen: set[str] = set()
        while cls and cls not in seen:
            seen.add(cls)
            body = None
            for src in sources.values():
                body = function_body(src, rf"\b{cls}::load_arch_tensors\s*\(")
                if body:
                    break
            if body:
                out[name] = loader_facts(body, helpers)
                break
            base = re.search(rf"struct\s+{cls}\s*:\s*public\s+(\w+)", headers)
            cls = base.group(1) if base else None
    return out


def ik_tensor_names(model_cpp: str, archs: dict[str, str]) -> dict[str, dict[str, str]]:
    """Per architecture name: tensor enum -> name template (ik's per-arch LLM_TENSOR_NAMES)."""
    src = _strip_comments(model_cpp)
    start = src.index("LLM_TENSOR_NAMES")
    brace = src.index("{", start)
    table = src[brace + 1: _matching(src, brace, "{", "}") - 1]
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"\{\s*LLM_ARCH_(\w+)\s*,\s*\{", table):
        inner = m.end() - 1
        names = _name_entries(table[inner: _matching(table, inner, "{", "}")])
        if m.group(1) in archs:
            out.setdefault(archs[m.group(1)], names)
    return out


def ik_arch_loaders(load_cpp: str, archs: dict[str, str]) -> dict[str, tuple[set[str], set[str], bool]]:
    src = _strip_comments(load_cpp)
    helpers: dict[str, set[tuple[str, str]]] = {}
    for m in re.finditer(r"\bcreate_tensors_helper::((?:create_std_\w+|merge_\w+|create_\w*embd_output))\s*\(", src):
        body = function_body(src[m.start():], re.escape(m.group()))
        if body:
            helpers[m.group(1)] = {(k, s or "") for k, s, _ in _TN.findall(body)}
    # create_embd_output(tn, n_embd, n_vocab, has_norm = true, ...): called with has_norm false (olmo) it creates
    # no output_norm
    if "create_embd_output" in helpers:
        helpers["create_embd_output_without_norm"] = {k for k in helpers["create_embd_output"] if k[0] != "OUTPUT_NORM"}
        src = re.sub(r"\bcreate_embd_output(\s*\(\s*tn\s*,[^,()]+,[^,()]+,\s*false\b)",
                     r"create_embd_output_without_norm\1", src)
    dispatch = function_body(src, r"\bcreate_tensors_helper::create_tensors\s*\(\s*\)") or ""
    fn_of = case_targets(dispatch, r"\b(create_\w+_tensors)\s*\(")
    out: dict[str, tuple[set[str], set[str], bool]] = {}
    for enum, name in archs.items():
        fn = fn_of.get(enum)
        if not fn:
            continue
        body = function_body(src, rf"\bcreate_tensors_helper::{fn}\s*\(")
        if body:
            out[name] = loader_facts(body, helpers)
    return out


# --- output --------------------------------------------------------------------------------------

def _wrap(items: list[str], indent: str = "    ", width: int = 112) -> list[str]:
    lines: list[str] = []
    line = indent
    for piece in items:
        if len(line) + len(piece) + 1 > width and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += piece + " "
    if line.strip():
        lines.append(line.rstrip())
    return lines


def _tuple_map(name: str, annot: str, d: dict[str, list[str]]) -> str:
    out = [f"{name}: Final[{annot}] = {{"]
    for key in sorted(d):
        vals = sorted(d[key])
        items = [f"{v!r}," for v in vals]
        head = f"    {key!r}: ("
        if len(head) + sum(len(i) + 1 for i in items) + 2 <= 112:
            out.append(head + " ".join(items) + "),")
        else:
            out.append(head)
            out += _wrap(items, "        ")
            out.append("    ),")
    out.append("}")
    return "\n".join(out) + "\n"


def render(ml_root: Path, ik_root: Path | None, rev_ml: str, rev_ik: str) -> str:
    ml_archs = arch_names(_strip_comments((ml_root / "src" / "llama-arch.cpp").read_text()))
    ml_names = mainline_tensor_names((ml_root / "src" / "llama-arch.cpp").read_text())
    ml_loaders = mainline_arch_loaders(ml_root, ml_archs)
    engines: dict[str, tuple[dict[str, str], dict[str, dict[str, str]], dict[str, tuple[set[str], set[str], bool]]]] = {
        "llama.cpp": (ml_archs, {a: ml_names for a in ml_archs.values()}, ml_loaders),
    }
    if ik_root is not None:
        ik_archs = arch_names(_strip_comments((ik_root / "src" / "llama-arch.cpp").read_text()))
        ik_names = ik_tensor_names((ik_root / "src" / "llama-model.cpp").read_text(), ik_archs)
        ik_loaders = ik_arch_loaders((ik_root / "src" / "llama-load-tensors.cpp").read_text(), ik_archs)
        engines["ik_llama.cpp"] = (ik_archs, ik_names, ik_loaders)

    # name template -> kinds, over both engines (block-level names without their `blk.%d.`)
    block: dict[str, set[str]] = {}
    top: dict[str, set[str]] = {}
    towers = re.compile(r"(?:V|A|ENC|DEC|POS_NET|CONVNEXT|CLS)_|CLS$|VISEXP_")
    for _, per_arch, _ in engines.values():
        for names in per_arch.values():
            for kind, template in names.items():
                if template.startswith("blk.%d."):
                    block.setdefault(template[len("blk.%d."):].replace("%d", "{xid}"), set()).add(kind)
                elif "%d" not in template or towers.match(kind):
                    top.setdefault(template.replace("%d", "{bid}"), set()).add(kind)
    parts = [
        '"""The architectures and tensor names the engines know, which tensor kinds each\n'
        "architecture's loader creates, and the tensors of an MTP/nextn block its loader still creates\n"
        "when MTP is not loaded.\n\n"
        "Generated by scripts/extract-engine-names.py from llama.cpp src/llama-arch.cpp, src/llama-model.cpp and\n"
        f"src/models/*.cpp ({rev_ml})\n"
        + (f"and ik_llama.cpp src/llama-arch.cpp, src/llama-model.cpp and src/llama-load-tensors.cpp\n({rev_ik}).\n"
           if ik_root is not None else "")
        + "Do not edit by hand.\n"
        '"""\n\nfrom __future__ import annotations\n\nfrom typing import Final\n\n'
        "# the engine versions read\n"
        f"SOURCES: Final[dict[str, str]] = {{\n    'llama.cpp': {rev_ml!r},\n"
        + (f"    'ik_llama.cpp': {rev_ik!r},\n" if ik_root is not None else "")
        + "}\n\n",
        "# every architecture name each engine knows\n",
        _tuple_map("ARCHS", "dict[str, tuple[str, ...]]",
                   {e: list(v[0].values()) for e, v in engines.items()}),
        "\n# block-level tensor names (after `blk.N.`, before `.weight`/`.bias`; `{xid}`: an expert\n"
        "# index) -> the engines' enum kinds (LLM_TENSOR_...)\n",
        _tuple_map("BLOCK_TENSORS", "dict[str, tuple[str, ...]]", {k: list(v) for k, v in block.items()}),
        "\n# tensor names outside blocks (`{bid}`: an index) -> enum kinds\n",
        _tuple_map("GLOBAL_TENSORS", "dict[str, tuple[str, ...]]", {k: list(v) for k, v in top.items()}),
    ]
    unused = sorted(mainline_unused_kinds((ml_root / "src" / "llama-arch.cpp").read_text()))
    parts.append("\n# llama.cpp: kinds its loader never loads (LLM_TENSOR_INFOS op GGML_OP_NONE: \"model has unused\n"
                 "# tensor ... -- ignoring\")\n")
    parts.append("ML_UNUSED_KINDS: Final[tuple[str, ...]] = (\n" + "\n".join(_wrap([f"{k!r}," for k in unused]))
                 + "\n)\n")
    for e, (_, _, loaders) in engines.items():
        tag = "ML" if e == "llama.cpp" else "IK"
        parts.append(f"\n# {e}: per architecture, the tensor kinds its loader creates\n")
        parts.append(_tuple_map(f"{tag}_ARCH_TENSORS", "dict[str, tuple[str, ...]]",
                                {a: list(v[0]) for a, v in loaders.items()}))
        parts.append(f"\n# {e}: architectures whose loader creates the tensors of MTP/nextn blocks with\n"
                     "# TENSOR_SKIP unless MTP is loaded (not loaded, not placed)\n")
        skips = sorted(a for a, v in loaders.items() if v[2])
        parts.append(f"{tag}_MTP_SKIPPED: Final[tuple[str, ...]] = (\n" + "\n".join(_wrap([f"{a!r}," for a in skips]))
                     + "\n)\n")
        parts.append(f"\n# {e}: tensors (names after `blk.N.`) its loader creates in an MTP/nextn block WITHOUT\n"
                     "# the skip flag: loaded on their layer's device even when MTP is not\n")
        per_arch = engines[e][1]
        mtp_loaded: dict[str, list[str]] = {}
        for a, v in loaders.items():
            names = []
            for ks in v[1]:
                kind, _, suffix = ks.partition(".")
                template = per_arch.get(a, {}).get(kind, "")
                if template.startswith("blk.%d.") and "%d" not in template[len("blk.%d."):]:
                    names.append(template[len("blk.%d."):] + (f".{suffix}" if suffix else ""))
            if names:
                mtp_loaded[a] = names
        parts.append(_tuple_map(f"{tag}_MTP_LOADED", "dict[str, tuple[str, ...]]", mtp_loaded))
    return "".join(parts)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    argv, out = take_out(argv)
    ml_root = Path(argv[0])
    ik_root = Path(argv[1]) if len(argv) >= 2 and argv[1] != "-" else None
    rev_ml = describe(ml_root)
    rev_ik = describe(ik_root) if ik_root is not None else ""
    out = out or Path(__file__).resolve().parent.parent / "moeconf" / "model" / "nametable.py"
    out.write_text(render(ml_root, ik_root, rev_ml, rev_ik))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
