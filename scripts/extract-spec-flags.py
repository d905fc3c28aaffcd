#!/usr/bin/env python3
"""Regenerate moeconf/engines/specflags.py: the flags and environment variables through which each
engine turns speculative decoding on, and the speculative parameters that change nothing alone.

    python scripts/extract-spec-flags.py MAINLINE IK [--out FILE]

MAINLINE and IK are the engines' source roots (the pinned ones: llama.cpp vendored by
llama-cpp-python 0.3.36, ik_llama.cpp vendored by ik-llama-cpp-python 0.1.5); the header names
each package version and the engine commit it vendors (scripts/_pinned.py).

llama.cpp, common/arg.cpp (common_params_parser_init): each `common_arg({names}, ..., handler)`
whose handler writes `params.speculative`:
- it sets the draft model (`params.speculative.draft.mparams.path`, `.hf_repo` or `.url`): a
  draft model is loaded (`common_params_speculative::has_dft`, common/common.h);
- it pushes a constant type (`params.speculative.types.push_back(COMMON_SPECULATIVE_TYPE_X)`):
  speculation of type x;
- it appends the types named by its value (`common_speculative_types_from_names`): `--spec-type`;
- anything else (n_max, p_min, threads, the draft's cache types and devices, n-gram sizes):
  read only by a speculative type or a draft model, so it changes nothing alone.
The type names come from common/speculative.cpp's name table. `.set_env("X")` gives the
variable that stands for the flag.
ik_llama.cpp, common/common.cpp (gpt_params_find_arg): each `if (arg == ...)` block that writes
`params.speculative.model` or `.params` (a draft model: server-context.cpp, `has_draft_model`),
`params.speculative.type` (the value's names read from the block), `params.has_mtp` (MTP from
the model's own NextN layers), or any other `params.speculative.*` field (a parameter).
Only names are kept: facts, not code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _cparse.py, also when loaded by path
from _cparse import matching as _matching
from _pinned import describe, take_out, wrapped

_TYPE = re.compile(r"COMMON_SPECULATIVE_TYPE_([A-Z0-9_]+)")


def _type_name(enum: str) -> str:
    return enum.lower().replace("_", "-")


def _uncomment(src: str) -> str:
    """Line comments dropped (an apostrophe in one would open a char literal for the matcher); a `//`
    followed by a quote on its line is inside a string (a URL) and stays."""
    return re.sub(r'(?m)//[^"\n]*$', "", src)


def mainline(src: str, spec_src: str) -> dict[str, object]:
    src = _uncomment(src)
    names_table = re.findall(r'\{\s*"([a-z0-9-]+)"\s*,\s*COMMON_SPECULATIVE_TYPE_([A-Z0-9_]+)\s*\}', spec_src)
    types = [n for n, _ in names_table]
    assert all(_type_name(e) == n for n, e in names_table), "type names no longer follow the enum"
    draft: set[str] = set()
    typed: dict[str, tuple[str, ...]] = {}
    valued: set[str] = set()
    params: set[str] = set()
    env: dict[str, str] = {}
    env_examples: dict[str, tuple[str, ...]] = {}
    for m in re.finditer(r"common_arg\s*\(", src):
        end = _matching(src, m.end() - 1)
        body = src[m.end(): end - 1]
        tail = src[end: end + 400].split(";", 1)[0]  # .set_spec().set_examples(...).set_env("X")
        if "params.speculative" not in body:
            continue
        rest = body.lstrip()
        if not rest.startswith("{"):
            continue
        names = re.findall(r'"([^"]+)"', rest[1: _matching(rest, 0, "{", "}") - 1])
        if re.search(r"params\.speculative\.draft\.mparams\.(path|hf_repo|url)\s*=", body):
            kind = "draft"
            draft.update(names)
        elif "common_speculative_types_from_names" in body:
            kind = "types"
            valued.update(names)
        elif re.search(r"params\.speculative\.types\.push_back\(", body):
            kind = "types"
            pushed = tuple(_type_name(t) for t in _TYPE.findall(body.split("push_back(", 1)[1].split(")")[0]))
            for n in names:
                typed[n] = pushed
        elif "arg_removed(" in body:
            continue  # a removed flag: the engine refuses it
        else:
            kind = "param"
            params.update(names)
        e = re.search(r'set_env\("([A-Z0-9_]+)"\)', tail)
        if e:
            env[e.group(1)] = kind
            ex = re.search(r"set_examples\(\{([^}]*)\}\)", tail)
            # no set_examples: LLAMA_EXAMPLE_COMMON, every binary (common/arg.h)
            env_examples[e.group(1)] = (tuple(sorted(re.findall(r"LLAMA_EXAMPLE_([A-Z_]+)", ex.group(1))))
                                        if ex else ("COMMON",))
    return {"types": tuple(types), "draft": draft, "typed": typed, "valued": valued, "params": params, "env": env,
            "env_examples": env_examples}


def binaries(root: Path) -> dict[str, str]:
    """Each binary's example (its options): the `common_params_parse(..., LLAMA_EXAMPLE_X)` of each
    program under tools/ and examples/, named `llama-<file stem>` as their CMakeLists name them."""
    out: dict[str, str] = {}
    for sub in ("tools", "examples"):
        for f in sorted((root / sub).rglob("*.cpp")):
            m = re.search(r"common_params_parse\([^;]*?LLAMA_EXAMPLE_([A-Z_]+)", f.read_text(errors="replace"))
            if m:
                out[f"llama-{f.stem}"] = m.group(1)
    return out


def ik(src: str) -> dict[str, object]:
    src = _uncomment(src)
    start = src.index("bool gpt_params_find_arg(")
    body = src[start: _matching(src, src.index("{", start), "{", "}")]
    blocks = list(re.finditer(
        r'\n\s+(?:else\s+)?if \((?:params\.\w+\s*&&\s*)?(arg == "[^"]+"(?:\s*\|\|\s*arg == "[^"]+")*)\s*\)\s*\{',
        body))
    draft: set[str] = set()
    valued: dict[str, tuple[str, ...]] = {}
    mtp_on: set[str] = set()
    mtp_off: set[str] = set()
    params: set[str] = set()
    for k, m in enumerate(blocks):
        text = body[m.end(): blocks[k + 1].start() if k + 1 < len(blocks) else len(body)]
        names = re.findall(r'arg == "([^"]+)"', m.group(1))
        if re.search(r"params\.speculative\.(model|params)\s*=", text):
            draft.update(names)
        elif re.search(r"params\.speculative\.type\s*=", text):
            accepted = tuple(re.findall(r'value == "([a-z0-9-]+)"', text))
            for n in names:
                valued[n] = accepted
        elif re.search(r"params\.has_mtp\s*=\s*true", text):
            mtp_on.update(names)
        elif re.search(r"params\.has_mtp\s*=\s*false", text):
            mtp_off.update(names)
        elif "params.speculative." in text:
            params.update(names)
    return {"draft": draft, "valued": valued, "mtp_on": mtp_on, "mtp_off": mtp_off, "params": params}


def _set(name: str, items: set[str]) -> str:
    return f"{name}: Final[frozenset[str]] = frozenset({{\n" + _wrap([repr(s) for s in sorted(items)]) + "\n})\n"


def _wrap(pieces: list[str]) -> str:
    return wrapped([f" {p}," for p in pieces])


def _dict(name: str, typ: str, d: dict[str, object]) -> str:
    return (f"{name}: Final[dict[str, {typ}]] = {{\n" + _wrap([f"{k!r}: {v!r}" for k, v in sorted(d.items())])
            + "\n}\n")


def render(ml: dict[str, object], ikd: dict[str, object], rev_ml: str, rev_ik: str) -> str:
    def s(d: dict[str, object], k: str) -> set[str]:
        v = d[k]
        assert isinstance(v, set)
        return v

    def dd(d: dict[str, object], k: str) -> dict[str, object]:
        v = d[k]
        assert isinstance(v, dict)
        return v

    return (
        '"""How each engine turns speculative decoding on: the flags and variables that load a draft model\n'
        "or name a speculative type, and the speculative parameters that change nothing alone.\n\n"
        "Generated by scripts/extract-spec-flags.py from llama.cpp common/arg.cpp and common/speculative.cpp\n"
        f"({rev_ml})\nand ik_llama.cpp common/common.cpp ({rev_ik}).\nDo not edit by hand.\n"
        '"""\n\nfrom __future__ import annotations\n\nfrom typing import Final\n\n'
        "# llama.cpp: the speculative types `--spec-type` names (`none` is the default: off)\n"
        "MAINLINE_TYPES: Final[tuple[str, ...]] = (\n" + _wrap([repr(t) for t in ml["types"]]) + "\n)\n"
        "# llama.cpp: flags that load a draft model (a file, a Hugging Face repo, a URL, or a preset with one)\n"
        + _set("MAINLINE_DRAFT", s(ml, "draft"))
        + "# llama.cpp: flags that append the types their value names (comma-separated)\n"
        + _set("MAINLINE_TYPE_VALUE", s(ml, "valued"))
        + "# llama.cpp: flags that append fixed types\n"
        + _dict("MAINLINE_TYPE_SET", "tuple[str, ...]", dd(ml, "typed"))
        + "# llama.cpp: speculative parameters, read only by a speculative type or a draft model\n"
        + _set("MAINLINE_PARAMS", s(ml, "params"))
        + "# llama.cpp: LLAMA_ARG_* variables of these flags: draft, types or param\n"
        + _dict("MAINLINE_ENV", "str", dd(ml, "env"))
        + "# llama.cpp: the examples (binaries' option sets) that read each variable; COMMON: every one\n"
        + _dict("MAINLINE_ENV_EXAMPLES", "tuple[str, ...]", dd(ml, "env_examples"))
        + "# llama.cpp: each binary's example (tools/ and examples/: common_params_parse)\n"
        + _dict("MAINLINE_BINARIES", "str", dd(ml, "binaries"))
        + "# ik_llama.cpp: flags that load a draft model (a file, or the draft's own parameters)\n"
        + _set("IK_DRAFT", s(ikd, "draft"))
        + "# ik_llama.cpp: flags that set the type of speculation without a draft model, and the names accepted\n"
        + _dict("IK_TYPE_VALUE", "tuple[str, ...]", dd(ikd, "valued"))
        + "# ik_llama.cpp: multi-token prediction from the model's own NextN layers, on and off\n"
        + _set("IK_MTP_ON", s(ikd, "mtp_on"))
        + _set("IK_MTP_OFF", s(ikd, "mtp_off"))
        + "# ik_llama.cpp: speculative parameters, read only with a draft model or a speculative type\n"
        + _set("IK_PARAMS", s(ikd, "params"))
    )


def main(argv: list[str]) -> int:
    argv, out_arg = take_out(argv)
    ml_root, ik_root = Path(argv[0]), Path(argv[1])
    rev_ml, rev_ik = describe(ml_root), describe(ik_root)
    ml = mainline((ml_root / "common" / "arg.cpp").read_text(), (ml_root / "common" / "speculative.cpp").read_text())
    ml["binaries"] = binaries(ml_root)
    ikd = ik((ik_root / "common" / "common.cpp").read_text())
    out = out_arg or Path(__file__).resolve().parent.parent / "moeconf" / "engines" / "specflags.py"
    out.write_text(render(ml, ikd, rev_ml, rev_ik))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
