"""The reserved graph of the pinned llama.cpp, node by node: tests/engine/graphdump.cpp compiled against
the pinned build (as tests/engine/outputs.cpp is), run with a command line read as llama-fit-params
reads it (the model loaded with no_alloc: nothing allocated), its JSON read by
moeconf.memory.enginegraph.

The scheduler's split records have no accessor in ggml: the build step writes a header with their
definitions, taken from the pinned ggml-backend.cpp at build time (not copied into this repository),
and the tool checks the split count it reads against ggml_backend_sched_get_n_splits."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from moeconf.engines import NEWEST_MAINLINE_BUILD
from tests.engine.harness import MAINLINE

SRC = Path(__file__).parent / "graphdump.cpp"
ROOT = MAINLINE.cli.parent.parent.parent  # .../llama-cpp-python-0.3.36
TREE = ROOT / "src" / "vendor" / "llama.cpp"
LIB = MAINLINE.cli.parent


def sched_header(tree: Path = TREE) -> str:
    """The scheduler's limits and its split and scheduler records, from the pinned ggml-backend.cpp."""
    text = (tree / "ggml" / "src" / "ggml-backend.cpp").read_text()
    parts = ["#pragma once", '#include "ggml-alloc.h"', '#include "ggml-backend.h"', '#include "ggml-impl.h"']
    for name in ("GGML_SCHED_MAX_BACKENDS", "GGML_SCHED_MAX_SPLIT_INPUTS", "GGML_SCHED_MAX_COPIES"):
        m = re.search(rf"^#ifndef {name}\n#define {name} \d+\n#endif\n", text, re.M)
        if m is None:
            raise RuntimeError(f"ggml-backend.cpp no longer defines {name} as graphdump expects")
        parts.append(m.group(0))
    for struct in ("ggml_backend_sched_split", "ggml_backend_sched"):
        m = re.search(rf"^struct {struct} \{{\n.*?^\}};\n", text, re.M | re.S)
        if m is None:
            raise RuntimeError(f"ggml-backend.cpp no longer defines struct {struct} as graphdump expects")
        parts.append(m.group(0))
    return "\n".join(parts) + "\n"


def sched_defines(build: Path = ROOT / "build") -> list[str]:
    """The GGML_SCHED_* definitions ggml-backend.cpp was compiled with (they size the records)."""
    for entry in json.loads((build / "compile_commands.json").read_text()):
        if entry["file"].endswith("/ggml-backend.cpp"):
            return re.findall(r"-DGGML_SCHED_\w+=\S+", entry["command"])
    raise RuntimeError(f"{build}/compile_commands.json has no ggml-backend.cpp")


def compile_tool(out: Path) -> Path:
    """The tool built at `out` (a C++ compiler is needed: the engine suite builds the engines)."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise RuntimeError("no C++ compiler: the engine suite builds the engines and needs one")
    gen = out.parent / "graphdump-include"
    gen.mkdir(parents=True, exist_ok=True)
    (gen / "graphdump_sched.h").write_text(sched_header())
    incs = [gen, TREE / "include", TREE / "ggml" / "include", TREE / "ggml" / "src", TREE / "src",
            TREE / "common", TREE / "vendor"]
    p = subprocess.run([cxx, "-std=c++17", "-O1", f"-DGRAPHDUMP_BUILD={NEWEST_MAINLINE_BUILD}", *sched_defines(),
                        "-o", str(out), str(SRC), *[f"-I{i}" for i in incs], f"-L{LIB}", "-lllama-common", "-lllama",
                        "-lggml", "-lggml-base", f"-Wl,-rpath,{LIB}"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"graphdump did not build:\n{p.stderr[-4000:]}")
    return out


@functools.lru_cache(maxsize=1)
def shared_tool() -> Path:
    """The tool, compiled once per test session (into a temporary folder)."""
    return compile_tool(Path(tempfile.mkdtemp(prefix="moeconf-graphdump-")) / "graphdump")


def dump(tool: Path, model: Path, args: list[str]) -> dict[str, Any]:
    """The reserved graph of `model` under `args` (llama-fit-params's reading), as the tool's JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    p = subprocess.run([str(tool), "-m", str(model), *args], capture_output=True, text=True, timeout=300, env=env,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"graphdump failed ({p.returncode}): {' '.join(args)}\n{p.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc
