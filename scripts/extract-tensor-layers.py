#!/usr/bin/env python3
"""Regenerate moeconf/model/layertable.py: which layer (input, repeating, output) each tensor
kind belongs to, which block holds the tensors outside `blk.N` that a loader creates on a
block's buffers (rope_freqs, token_embd_norm, ...) and whether it copies them into later blocks,
and which GGUF keys the loaders read as arrays.

    python scripts/extract-tensor-layers.py MAINLINE_LLAMA_CPP_DIR IK_LLAMA_CPP_DIR [--out FILE]

mainline (llama.cpp):
  src/llama-arch.cpp   LLM_TENSOR_INFOS: kind -> LLM_TENSOR_LAYER_INPUT / _REPEATING / _OUTPUT
                       (src/llama-model-loader.cpp create_tensor picks the input, output or the
                       block's buffer list by it; a `token_embd` created with TENSOR_DUPLICATED,
                       the tied output, counts as LLM_TENSOR_OUTPUT); LLM_KV_NAMES
  src/models/*.cpp     per architecture, each create_tensor of a repeating kind whose name has
                       no block number: its block argument (a number, or the loop's index under
                       the conditions around the call) and whether its flags carry
                       TENSOR_DUPLICATED (a copy on a later block's buffer)
  src/llama-model.cpp, src/models/*.cpp  get_key_or_arr / get_arr / get_arr_n calls: the keys
                       read as arrays, per layer (length n_layer) or of other lengths
ik_llama.cpp:
  src/llama-load-tensors.cpp  per architecture (create_tensors' dispatch), each create_tensor of a
                       kind whose name has no block number: the context it is created in
                       (ctx_input: the input layer; ctx_output, ctx_output_split: the output
                       layer; a block's context: that block)
  src/llama-model.cpp  the per-architecture LLM_TENSOR_NAMES (which names have a block number)
  src/*.cpp            get_key_or_arr / get_arr calls
Only enum names, key names and flags are kept: facts, not code.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cparse import arch_names, case_targets, factory_classes, function_body, kv_names
from _cparse import matching as _matching
from _pinned import describe, take_out

_spec = importlib.util.spec_from_file_location("_names", Path(__file__).resolve().parent / "extract-engine-names.py")
assert _spec is not None and _spec.loader is not None
_names = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_names)

# the per-block conditions a call may sit under, in the form the table names them
# (moeconf/model/homes.py evaluates them from the file's metadata)
_GUARDS = {
    r"!\s*hparams\.is_swa\s*\(\s*i\s*\)": "full_attention",  # llama.cpp
    r"!\s*hparams\.swa_layers\s*\[\s*i\s*\]": "full_attention",  # ik_llama.cpp
    r"i\s*==\s*0": "block0",
}


def tensor_layers(arch_cpp: str) -> dict[str, str]:
    src = _names._strip_comments(arch_cpp)
    start = src.index("LLM_TENSOR_INFOS")
    brace = src.index("{", start)
    block = src[brace: _matching(src, brace, "{", "}")]
    out: dict[str, str] = {}
    for kind, layer in re.findall(r"\{\s*LLM_TENSOR_(\w+)\s*,\s*\{\s*LLM_TENSOR_LAYER_(\w+)", block):
        out.setdefault(kind, layer.lower())
    return out


def array_keys(sources: list[str], names: dict[str, str]) -> dict[str, str]:
    """Key (after `{arch}.`) -> `per_layer` (get_key_or_arr with n_layer entries: a number or an
    array of one per layer) or `array` (an array of any other length, or get_arr)."""
    out: dict[str, str] = {}
    for text in sources:
        src = _names._strip_comments(text)
        for m in re.finditer(r"\b(get_key_or_arr|get_arr|get_arr_n)\s*\(\s*LLM_KV_(\w+)\s*,", src):
            key = names.get(m.group(2))
            if key is None:
                continue
            call = src[m.start(): _matching(src, src.index("(", m.start()))]
            per_layer = m.group(1) == "get_key_or_arr" and re.search(r"\bn_layer(?:_all)?\b", call)
            kind = "per_layer" if per_layer else "array"
            if out.get(key) != "array":  # read as a free-length array anywhere: no length check
                out[key] = kind
    return dict(sorted(out.items()))


def _guard(body: str, pos: int) -> str:
    """The per-block condition around body[pos] ('' when none depends on the block), in the
    table's words. A condition on the block index that the table cannot name stops the run."""
    guards: list[str] = []
    for s, _e in _names._blocks_around(body, pos):
        kind, cond = _names._head(body, s)
        if kind != "if":
            continue
        if not re.search(r"\bi\b", cond):
            continue  # a condition on the file (which tensors exist), not on the block
        for rx, word in _GUARDS.items():
            if re.fullmatch(rx, cond.strip()):
                guards.append(word)
                break
        else:
            raise SystemExit(f"a block-dependent condition the table cannot name: if ({cond.strip()})")
    return " ".join(sorted(set(guards)))


def _always_duplicated(flags: str) -> bool:
    return bool(re.search(r"\bTENSOR_DUPLICATED\b", flags)) and "?" not in flags


def _mainline_bodies(root: Path, archs: dict[str, str]) -> dict[str, str]:
    """arch -> the body of its loader's load_arch_tensors (the factory's class, or the nearest
    base class that defines one)."""
    model_cpp = _names._strip_comments((root / "src" / "llama-model.cpp").read_text())
    sources = {p: _names._strip_comments(p.read_text()) for p in sorted((root / "src" / "models").glob("*.cpp"))}
    headers = _names._strip_comments((root / "src" / "models" / "models.h").read_text())
    cls_of = factory_classes(model_cpp)
    out: dict[str, str] = {}
    for enum, name in archs.items():
        cls = cls_of.get(enum)
        seen: set[str] = set()
        body = None
        while cls and cls not in seen and body is None:
            seen.add(cls)
            for src in sources.values():
                body = function_body(src, rf"\b{cls}::load_arch_tensors\s*\(")
                if body:
                    break
            base = re.search(rf"struct\s+{cls}\s*:\s*public\s+(\w+)", headers)
            cls = base.group(1) if base else None
        if body:
            out[name] = body
    return out


def mainline_block_homes(root: Path, archs: dict[str, str], layers: dict[str, str],
                         templates: dict[str, str]) -> dict[str, dict[str, tuple[int, str, bool]]]:
    """arch -> kind -> (block, guard, copied): the tensors of a repeating kind whose name has no
    block number. `block`: the literal block argument, or -1 for the loop's first block where
    `guard` holds; `copied`: the loader also creates it (TENSOR_DUPLICATED) on later blocks."""
    homed = {k for k, v in layers.items() if v == "repeating" and k in templates
             and not templates[k].startswith("blk.%d.") and "%d" not in templates[k]}
    out: dict[str, dict[str, tuple[int, str, bool]]] = {}
    for name, body in _mainline_bodies(root, archs).items():
        found: dict[str, tuple[int, str, bool]] = {}
        for m in re.finditer(r"\bcreate_tensor\s*\(", body):
            paren = m.end() - 1
            inner = body[paren + 1: _matching(body, paren) - 1]
            tn = re.match(r"\s*tn\s*\(\s*LLM_TENSOR_(\w+)\s*(?:,([^)]*))?\)", inner)
            if not tn or tn.group(1) not in homed:
                continue
            kind = tn.group(1)
            tn_args = _names._split_args(tn.group(2) or "")
            bid = tn_args[-1] if tn_args and not tn_args[-1].startswith('"') else ""
            args = _names._split_args(inner)
            flags = args[-1] if len(args) >= 3 else ""
            if _always_duplicated(flags):
                continue  # only ever a copy (an MTP block's view of the trunk's tensor)
            guard = _guard(body, m.start())
            copied = "TENSOR_DUPLICATED" in flags or bool(re.search(r"\b\w+_flag\b", flags))
            block = int(bid) if bid.isdigit() else -1
            if guard == "block0":  # `if (i == 0)`: the first block alone
                block, guard, copied = 0, "", False
            prev = found.get(kind)
            if prev is not None and prev != (block, guard, copied):
                raise SystemExit(f"{name}: {kind} created on two different blocks: {prev} and {(block, guard, copied)}")
            found[kind] = (block, guard, copied)
        if found:
            out[name] = found
    return out


def mainline_optional_router(root: Path, archs: dict[str, str]) -> list[str]:
    """Architectures whose loader creates `ffn_gate_inp` with TENSOR_NOT_REQUIRED: which blocks
    are MoE is the file's tensors' to say (Jamba, Gemma 4, ...), not a metadata key's."""
    out = []
    for name, body in _mainline_bodies(root, archs).items():
        for m in re.finditer(r"\bcreate_tensor\s*\(", body):
            paren = m.end() - 1
            inner = body[paren + 1: _matching(body, paren) - 1]
            if re.match(r"\s*tn\s*\(\s*LLM_TENSOR_FFN_GATE_INP\s*,", inner):
                args = _names._split_args(inner)
                if len(args) >= 3 and "TENSOR_NOT_REQUIRED" in args[-1]:
                    out.append(name)
                    break
    return sorted(out)


def _loop_head(body: str, start: int) -> str | None:
    """The header of the `for` loop whose brace block opens at body[start] (None: not a for loop)."""
    j = start - 1
    while body[j].isspace():
        j -= 1
    if body[j] != ")":
        return None
    o = _names._open_paren_before(body, j)
    return body[o + 1: j] if re.search(r"\bfor\s*$", body[:o].rstrip()) else None


_MTP_ONLY_PROBE = "blk.0.attn_norm.weight"


def _trunk_flags(body: str, loop_start: int, call: int, flag: str) -> str | None:
    """What the flag variable `flag` of a call at body[call] is in a trunk block of the loop whose brace
    block opens at body[loop_start]: "0" (required), "unless_mtp_only" (required unless the file holds
    only the MTP blocks: `trunk_flags = mtp_only ? TENSOR_NOT_REQUIRED : 0`, mtp_only being the file's
    lack of blk.0.attn_norm.weight), or None (anything else: not read)."""
    if flag == "0":
        return "0"
    seg = body[loop_start:call]
    mtp = {v for v in re.findall(r"\bconst\s+bool\s+(\w+)\s*=\s*i\s*>=\s*n_layer\s*;", seg)}
    is_mtp = "|".join(["i\\s*>=\\s*n_layer", *mtp])
    # `int flags = 0; if (i >= n_layer) { flags |= TENSOR_SKIP; }` (the MTP blocks skipped): 0 in a trunk block
    # where every change of the variable before the call sits in such a guard
    zero = list(re.finditer(rf"(?<!const )\bint\s+{flag}\s*=\s*0\s*;", seg))
    if len(zero) == 1 and not re.search(rf"\bconst\s+int\s+{flag}\b", seg):
        rest = seg[zero[0].end():]
        guards = [g.span() for g in re.finditer(
            rf"\bif\s*\(\s*(?:{is_mtp})\s*\)\s*\{{\s*{flag}\s*\|=\s*\w+\s*;\s*\}}", rest)]
        changes = [c.start() for c in re.finditer(rf"\b{flag}\s*(?:[|&+\-*/^]?=(?!=)|\+\+|--)", rest)]
        return "0" if all(any(a <= c < b for a, b in guards) for c in changes) else None
    decl = list(re.finditer(rf"\bconst\s+int\s+{flag}\s*=\s*([^;]+);", seg))
    if len(decl) != 1 or re.search(rf"\b{flag}\s*[|&+-]?=(?!=)", seg[decl[0].end():]):
        return None
    expr = decl[0].group(1).strip()
    m = (re.fullmatch(r"\(?\s*i\s*<\s*n_layer\s*\)?\s*\?\s*(\w+)\s*:\s*[^:?]+", expr)
         or re.fullmatch(rf"\(?\s*(?:{is_mtp})\s*\)?\s*\?\s*[^:?]+:\s*(\w+)", expr))
    if not m:
        return None
    trunk = m.group(1)
    if trunk == "0":
        return "0"
    top = re.search(rf"\bconst\s+int\s+{trunk}\s*=\s*(\w+)\s*\?\s*TENSOR_NOT_REQUIRED\s*:\s*0\s*;", body[:loop_start])
    if top is None:
        return None
    probe = re.search(rf"\bconst\s+bool\s+{top.group(1)}\s*=\s*\(?[^;]*get_weight\s*\(\s*"
                      rf"\"{re.escape(_MTP_ONLY_PROBE)}\"\s*\)\s*==\s*nullptr\s*\)?\s*;", body[:loop_start])
    return "unless_mtp_only" if probe else None


def mainline_required(root: Path, archs: dict[str, str], templates: dict[str, str]) -> tuple[
        dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], list[str],
        dict[str, tuple[tuple[str, ...], tuple[str, ...]]]]:
    """The tensors each architecture's loader requires whatever the file holds: ({arch: names outside
    the blocks}, {arch: `blk.%d.` names required in every trunk block}, [archs whose trunk tensors are
    required unless the file holds only MTP blocks]). A create_tensor call counts when nothing makes it
    conditional: its flags the literal 0, outside every brace block for a name without a block number;
    for a block tensor, directly in the body of `for (int i = 0; i < n_layer; ++i)` with block argument
    `i` (the trunk: hparams.n_layer()), or of the loop over n_layer_all whose flag variable is 0 in the
    trunk (`flags = i < n_layer ? trunk_flags : mtp_flags`, `trunk_flags = mtp_only ? TENSOR_NOT_REQUIRED
    : 0`: required unless the file lacks blk.0.attn_norm.weight and has MTP blocks, `_trunk_flags`), with no
    `continue` or `break` before it in the loop and no `return` before it in the function (a path that
    skips it). One condition is read, MLA's form: a block tensor as above but inside `if (is_mla) {...}` or its
    `else {...}` directly in the loop, `is_mla` being `const bool is_mla = hparams.is_mla();` (the file's
    key_length_mla and value_length_mla both non-zero), goes to the fourth table, {arch: (required with MLA,
    required without)}. Anything else (another condition, another flag expression, a helper such as
    create_tensor_qkv) is left out: the tables say what the loader surely requires, not all it may."""
    glob: dict[str, tuple[str, ...]] = {}
    block: dict[str, tuple[str, ...]] = {}
    by_mla: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    unless_mtp_only: set[str] = set()
    for name, body in _mainline_bodies(root, archs).items():
        g: list[str] = []
        b: list[str] = []
        forms: dict[str, list[str]] = {"if": [], "else": []}
        reads_mla = re.search(r"\bconst\s+bool\s+is_mla\s*=\s*hparams\.is_mla\s*\(\s*\)\s*;", body) is not None
        for m in re.finditer(r"\bcreate_tensor\s*\(", body):
            paren = m.end() - 1
            inner = body[paren + 1: _matching(body, paren) - 1]
            tn = re.match(r"\s*tn\s*\(\s*LLM_TENSOR_(\w+)\s*,\s*\"(\w+)\"\s*(?:,\s*(\w+)\s*)?\)", inner)
            args = _names._split_args(inner)
            if not tn or len(args) < 3 or re.search(r"\breturn\b", body[:m.start()]):
                continue
            kind, suffix, bid = tn.groups()
            template = f"{templates[kind]}.{suffix}"
            flag = args[-1].strip()
            around = _names._blocks_around(body, m.start())
            if not around:
                if flag == "0" and bid is None and "%d" not in template:
                    g.append(template)
                continue
            form = ""
            if len(around) == 2 and reads_mla:
                form, cond = _names._head(body, around[0][0])
                if cond != "is_mla" or form not in forms:
                    continue
                around = around[1:]
            if len(around) != 1 or bid is None or not template.startswith("blk.%d."):
                continue
            s, _e = around[0]
            head = _loop_head(body, s) or ""
            loop = re.fullmatch(rf"\s*int\s+{bid}\s*=\s*0\s*;\s*{bid}\s*<\s*(n_layer|n_layer_all)\s*;\s*\+\+{bid}\s*",
                                head)
            if not loop or re.search(r"\b(continue|break)\b", body[s: m.start()]):
                continue
            trunk = "0" if loop.group(1) == "n_layer" and flag == "0" else (
                _trunk_flags(body, s, m.start(), flag) if bid == "i" and re.fullmatch(r"\w+", flag) else None)
            if trunk is None or (loop.group(1) == "n_layer" and flag != "0"):
                continue
            if form:
                forms[form].append(template)
                continue
            b.append(template)
            if trunk == "unless_mtp_only":
                unless_mtp_only.add(name)
        if g:
            glob[name] = tuple(dict.fromkeys(g))
        if b:
            block[name] = tuple(dict.fromkeys(b))
        if forms["if"] or forms["else"]:
            by_mla[name] = (tuple(dict.fromkeys(forms["if"])), tuple(dict.fromkeys(forms["else"])))
    return glob, block, sorted(unless_mtp_only), by_mla


_IK_CTX = {"ctx_input": "input", "ctx_output": "output", "ctx_output_split": "output", "out_ctx": "output"}


def ik_global_homes(load_cpp: str, archs: dict[str, str],
                    names: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """arch -> kind -> `input`, `output` or `block` (the block of the loop that creates it;
    its first, the later ones get copies) for ik's tensors whose name has no block number."""
    src = _names._strip_comments(load_cpp)
    helpers: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"\bcreate_tensors_helper::(create_\w+)\s*\(", src):
        body = function_body(src[m.start():], re.escape(m.group()))
        if body and not re.search(r"\bcreate_\w+_tensors\b", m.group(1)):
            helpers[m.group(1)] = _ik_calls(body)
    dispatch = function_body(src, r"\bcreate_tensors_helper::create_tensors\s*\(\s*\)") or ""
    fn_of = case_targets(dispatch, r"\b(create_\w+_tensors)\s*\(")
    out: dict[str, dict[str, str]] = {}
    for enum, name in archs.items():
        fn = fn_of.get(enum)
        body = function_body(src, rf"\bcreate_tensors_helper::{fn}\s*\(") if fn else None
        if not body:
            continue
        per_arch = names.get(name, {})
        globals_ = {k for k, t in per_arch.items() if not t.startswith("blk.%d.") and "%d" not in t}
        calls = _ik_calls(body, globals_)
        for h, hc in helpers.items():
            if re.search(rf"\b{re.escape(h)}\s*\(", body):
                for k, v in hc.items():
                    calls.setdefault(k, v)
        found = {k: v for k, v in calls.items()
                 if k in per_arch and not per_arch[k].startswith("blk.%d.") and "%d" not in per_arch[k]}
        if found:
            out[name] = dict(sorted(found.items()))
    return out


def _ik_calls(body: str, globals_: set[str] | None = None) -> dict[str, str]:
    """kind -> where its first create_tensor call in `body` puts it; the block guard is read for
    the kinds in `globals_` (names without a block number) only."""
    out: dict[str, str] = {}
    for m in re.finditer(r"\bcreate_tensor\s*\(\s*(\w+)\s*,\s*tn\s*\(\s*LLM_TENSOR_(\w+)\s*[,)]", body):
        end = _matching(body, m.start() + m.group().index("("))
        args = _names._split_args(body[m.start() + m.group().index("(") + 1: end - 1])
        if m.group(2) == "TOKEN_EMBD" and "TENSOR_DUPLICATED" in (args[-1] if len(args) > 3 else ""):
            continue  # the tied output's copy (the output layer's, like mainline's)
        home = _IK_CTX.get(m.group(1), "block")
        if home == "block" and globals_ is not None and m.group(2) in globals_:
            guard = _guard(body, m.start())
            home = "block" if guard in ("", "block0") else f"block {guard}"
        out.setdefault(m.group(2), home)
    return out


# --- output --------------------------------------------------------------------------------------

def _dict(name: str, annot: str, d: dict[str, object]) -> str:
    lines = [f"{name}: Final[{annot}] = {{"]
    for k in sorted(d):
        v = d[k]
        line = f"    {k!r}: {v!r},"
        if len(line) > 112 and isinstance(v, dict):
            lines.append(f"    {k!r}: {{")
            lines += [f"        {ik!r}: {iv!r}," for ik, iv in v.items()]
            lines.append("    },")
        elif len(line) > 112 and isinstance(v, tuple):
            lines.append(f"    {k!r}: (")
            row = "       "
            for item in v:
                if len(row) + len(repr(item)) + 2 > 112:
                    lines.append(row)
                    row = "       "
                row += f" {item!r},"
            lines += [row, "    ),"]
        else:
            lines.append(line)
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(ml_root: Path, ik_root: Path, rev_ml: str, rev_ik: str) -> str:
    arch_cpp = (ml_root / "src" / "llama-arch.cpp").read_text()
    ml_archs = arch_names(_names._strip_comments(arch_cpp))
    layers = tensor_layers(arch_cpp)
    templates = _names.mainline_tensor_names(arch_cpp)
    homes = mainline_block_homes(ml_root, ml_archs, layers, templates)
    required = mainline_required(ml_root, ml_archs, templates)
    kvs = kv_names(_names._strip_comments(arch_cpp))
    ml_sources = [(ml_root / "src" / "llama-model.cpp").read_text()] + [
        p.read_text() for p in sorted((ml_root / "src" / "models").glob("*.cpp"))]
    ik_arch_cpp = (ik_root / "src" / "llama-arch.cpp").read_text()
    ik_archs = arch_names(_names._strip_comments(ik_arch_cpp))
    ik_names = _names.ik_tensor_names((ik_root / "src" / "llama-model.cpp").read_text(), ik_archs)
    ik_homes = ik_global_homes((ik_root / "src" / "llama-load-tensors.cpp").read_text(), ik_archs, ik_names)
    ik_kvs = kv_names(_names._strip_comments(ik_arch_cpp))
    ik_sources = [p.read_text() for p in sorted((ik_root / "src").glob("*.cpp"))]
    keys = array_keys(ml_sources, kvs)
    for k, v in array_keys(ik_sources, ik_kvs).items():
        keys.setdefault(k, v)  # mainline's reading first: its length check is the stricter
    parts = [
        '"""Which layer each tensor belongs to, as the engines\' loaders decide where it goes: the\n'
        "input layer (always host memory), a block (its `-ngl` device), or the output layer; the\n"
        "tensors outside `blk.N` that a loader puts on a block's buffers; and the GGUF keys the\n"
        "loaders read as arrays.\n\n"
        "Generated by scripts/extract-tensor-layers.py from llama.cpp src/llama-arch.cpp, src/llama-model.cpp and\n"
        f"src/models/*.cpp ({rev_ml})\n"
        f"and ik_llama.cpp src/llama-arch.cpp, src/llama-model.cpp, src/llama-load-tensors.cpp and src/*.cpp\n"
        f"({rev_ik}).\n"
        "Do not edit by hand.\n"
        '"""\n\nfrom __future__ import annotations\n\nfrom typing import Final\n\n'
        "# the engine versions read\n"
        f"SOURCES: Final[dict[str, str]] = {{\n    'llama.cpp': {rev_ml!r},\n    'ik_llama.cpp': {rev_ik!r},\n}}\n\n",
        "# llama.cpp: each tensor kind's layer (LLM_TENSOR_INFOS): 'input' (host memory), 'repeating' (its\n"
        "# block's device), 'output' (the output layer's device; also the tied output's copy of token_embd)\n",
        _dict("ML_TENSOR_LAYERS", "dict[str, str]", dict(layers)),
        "\n# llama.cpp: per architecture, the repeating kinds whose name has no block number -> (block, guard,\n"
        "# copied): the block whose device holds the tensor (-1: the first block of the loader's loop where\n"
        "# `guard` holds; '': every block; 'full_attention': a block without a sliding window), and whether\n"
        "# the loader also makes a copy on each later such block's buffer (TENSOR_DUPLICATED)\n",
        _dict("ML_BLOCK_HOMES", "dict[str, dict[str, tuple[int, str, bool]]]",
              {a: dict(sorted(v.items())) for a, v in homes.items()}),
        "\n# ik_llama.cpp: per architecture, the kinds whose name has no block number -> the context its\n"
        "# loader creates them in: 'input' (host memory), 'output' (the output layer), 'block' (the first\n"
        "# block of its loop; copies on the later ones)\n",
        _dict("IK_GLOBAL_HOMES", "dict[str, dict[str, str]]", dict(ik_homes)),
        "\n# keys (after `{arch}.`) some loader reads as an array: 'per_layer' (get_key_or_arr over the\n"
        "# layers: a number for every layer, or an array of one per layer, bool, int32 or uint32), 'array'\n"
        "# (get_arr: an array of any length; bool arrays read as 0/1)\n",
        _dict("ARRAY_KEYS", "dict[str, str]", dict(keys)),
        "\n# llama.cpp: the tensors each architecture's loader surely requires (create_tensor without\n"
        "# TENSOR_NOT_REQUIRED, under no condition: `mainline_required` in the script says which calls count); a\n"
        "# file without one is refused (check_tensor_dims: tensor 'NAME' not found). Outside the blocks:\n",
        _dict("ML_REQUIRED_GLOBAL", "dict[str, tuple[str, ...]]", dict(required[0])),
        "# and in every trunk block (blk.0 to blk.{n_layer()-1}, the blocks before the MTP ones):\n",
        _dict("ML_REQUIRED_BLOCK", "dict[str, tuple[str, ...]]", dict(required[1])),
        "# whose loaders require the trunk blocks' tensors unless the file holds only its MTP blocks (it has MTP\n"
        f"# blocks and lacks {_MTP_ONLY_PROBE}: `mtp_only`, the trunk's flags TENSOR_NOT_REQUIRED)\n",
        "ML_REQUIRED_UNLESS_MTP_ONLY: Final[tuple[str, ...]] = (\n"
        + "".join(f"    {a!r},\n" for a in required[2]) + ")\n",
        f"ML_MTP_ONLY_PROBE: Final = {_MTP_ONLY_PROBE!r}\n",
        "# and in every trunk block as above by MLA's form (the loader's `is_mla`: the file's\n"
        "# attention.key_length_mla and value_length_mla both non-zero): (required with MLA, required without)\n",
        _dict("ML_REQUIRED_BLOCK_BY_MLA", "dict[str, tuple[tuple[str, ...], tuple[str, ...]]]", dict(required[3])),
        "\n# llama.cpp: architectures whose loader creates ffn_gate_inp with TENSOR_NOT_REQUIRED: the file's\n"
        "# tensors, not a metadata key, say which blocks are MoE\n",
        "ML_OPTIONAL_ROUTER: Final[tuple[str, ...]] = (\n"
        + "".join(f"    {a!r},\n" for a in mainline_optional_router(ml_root, ml_archs)) + ")\n",
    ]
    return "".join(parts)


def main(argv: list[str]) -> int:
    argv, out = take_out(argv)
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    ml_root, ik_root = Path(argv[0]).expanduser(), Path(argv[1]).expanduser()
    out = out or Path(__file__).resolve().parent.parent / "moeconf" / "model" / "layertable.py"
    out.write_text(render(ml_root, ik_root, describe(ml_root), describe(ik_root)))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
