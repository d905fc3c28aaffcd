"""Files a launch loads beside the model, a setting family moeconf does not model: where the
command line (or the environment) loads one, the estimate is incomplete with a note naming the
flag, `explain` prints "?", and `fit` refuses (fit.py refuses the same flags up front). What each
costs, from the pinned sources:

- a multimodal projector (llama.cpp `-mm/--mmproj FILE`, `-mmu/--mmproj-url URL`,
  `LLAMA_ARG_MMPROJ`, `LLAMA_ARG_MMPROJ_URL`, read by the binaries of `mmproj_examples`:
  llama-mtmd-cli, llama-server, llama-cli, llama-tts; ik_llama.cpp `--mmproj`, `--mmproj-url`;
  common/arg.cpp, ik common/common.cpp gpt_params_find_arg): the vision or audio encoder's weights
  and its compute buffer, on the GPU unless `--no-mmproj-offload` or `-mmdev none` keep them in
  host memory (tools/mtmd/clip.cpp). A remote `-hf` model's projector is noted where the Hub
  listing shows one (hub/remote.py);
- LoRA adapters (`--lora FNAME`, `--lora-scaled FNAME:SCALE`, both engines): each adapter's
  tensors in the buffer type of the model tensor they modify (src/llama-adapter.cpp), of a size
  only the adapter file tells;
- control vectors (`--control-vector`, `--control-vector-scaled`, both engines): one n_embd row
  per layer, on that layer's device (llama-adapter.cpp llama_adapter_cvec).

`--lora-init-without-apply`, `--mmproj-offload`, `--no-mmproj` and the other options of these
files load nothing alone and are not refused."""

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


def unmodelled_extra_files(extra: ExtraFiles) -> list[str]:
    """Why memory is not modelled for the files this launch loads beside the model (empty: none)."""
    why: list[str] = []
    head = "memory is not modelled with files loaded beside the model: "
    for kind, where in dict.fromkeys(extra):
        if kind == MMPROJ:
            why.append(f"{head}the multimodal projector's weights and compute buffer ({where}, on the GPU unless "
                       "--no-mmproj-offload) are not counted")
        elif kind == MMPROJ + "-host":
            why.append(f"{head}the multimodal projector's weights and compute buffer ({where}, in host memory: "
                       "--no-mmproj-offload) are not counted")
        elif kind == LORA:
            why.append(f"{head}the LoRA adapter's tensors ({where}, beside each tensor they modify) are not counted")
        elif kind == CVEC:
            why.append(f"{head}the control vector ({where}, a row per layer on its device) is not counted")
    return why
