"""Files a launch loads beside the model (multimodal projector, LoRA adapters, control vectors), as
each engine reads its command line and environment. Memory refuses them (memory/families.py; fit.py
refuses the same flags up front). The flags, what each costs and the sources: docs/memory-
architectures.md, "Files loaded beside the model"; options that load nothing alone are not refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from moeconf.engines import Engine
from moeconf.engines.flagtable import IK
from moeconf.engines.llamaconfig import FALSE_WORDS
from moeconf.engines.specflags import MAINLINE_BINARIES

MMPROJ = "mmproj"
LORA = "lora"
CVEC = "control-vector"

_MAINLINE: dict[str, str] = {"-mm": MMPROJ, "--mmproj": MMPROJ, "-mmu": MMPROJ, "--mmproj-url": MMPROJ,
                             "--lora": LORA, "--lora-scaled": LORA,
                             "--control-vector": CVEC, "--control-vector-scaled": CVEC}
_IK = {name: kind for name, kind in _MAINLINE.items() if name in IK}  # the spellings ik's parser has
# llama.cpp reads these variables in the binaries whose option set has the projector's options
_MAINLINE_ENV = ("LLAMA_ARG_MMPROJ", "LLAMA_ARG_MMPROJ_URL")
_MMPROJ_EXAMPLES = frozenset({"MTMD", "SERVER", "CLI", "TTS"})
# keep the projector in host memory (llama.cpp; ik_llama.cpp has --no-mmproj-offload alone)
_MMPROJ_ON_HOST = ("--no-mmproj-offload",)

ExtraFiles = tuple[tuple[str, str], ...]  # (kind, the flag and value or the variable)


def read_extra_files(words: Sequence[str], engine: Engine, env: Mapping[str, str] | None,
                     binary: str | None) -> ExtraFiles:
    """What this launch loads beside the model: argv (binary first or not) and the environment,
    read as the engine reads them (a command-line value replaces its variable's)."""
    from moeconf.engines.argvread import option_values

    ik = engine.name == "ik_llama.cpp"
    flags = _IK if ik else _MAINLINE
    found: dict[str, tuple[str, str]] = {}  # the projector: the last one given wins
    listed: list[tuple[str, str]] = []
    on_host = False
    if not ik and (binary is None or MAINLINE_BINARIES.get(binary) in _MMPROJ_EXAMPLES):
        for var in _MAINLINE_ENV:
            value = (env or {}).get(var, "")
            if value:
                found[MMPROJ] = (MMPROJ, f"{var}={value}")
        if (env or {}).get("LLAMA_ARG_MMPROJ_OFFLOAD", "") in FALSE_WORDS:
            on_host = True
    for name, given in option_values(words, engine):
        value = given or ""
        kind = flags.get(name)
        if kind == MMPROJ and value:
            found[MMPROJ] = (MMPROJ, f"{name} {value}")
        elif kind is not None and value:
            listed.append((kind, f"{name} {value}"))
        elif name in _MMPROJ_ON_HOST or (not ik and name in ("-mmdev", "--mmproj-device") and value == "none"):
            on_host = True
        elif not ik and name == "--mmproj-offload":
            on_host = False
    out = list(found.values()) + listed
    if on_host and MMPROJ in found:
        out = [(MMPROJ + "-host", where) if kind == MMPROJ else (kind, where) for kind, where in out]
    return tuple(out)
