"""The reserved graph of the pinned llama.cpp, node by node: tests/engine/graphdump.cpp compiled against
the pinned build (as tests/engine/outputs.cpp is), run with a command line read as llama-fit-params
reads it (the model loaded with no_alloc: nothing allocated), its JSON read by
tests/enginegraph.py.

The scheduler's split records have no accessor in ggml: the build step writes a header with their
definitions, taken from the pinned ggml-backend.cpp at build time (not copied into this repository),
and the tool checks the split count it reads against ggml_backend_sched_get_n_splits.

`python -m tests.engine.graphdump` records every architecture's graphs into tests/data/graphs (files no
longer dumped removed); `--arch NAME` (repeatable) records only those architectures': their files replaced,
the index updated for them alone, nothing else touched."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from moeconf.engines import NEWEST_MAINLINE_BUILD
from tests.engine.harness import MAINLINE, rpc_servers

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


# The recorded graphs (tests/data/graphs/): every model of moeconf.fixtures.graphmodels under these
# command lines (tests/recorded_memory.rpc_args: `2rpc` = two RPC devices; "-fit off" as recorded)
DATA = Path(__file__).parent.parent / "data" / "graphs"
LINES: dict[str, str] = {
    "rpc": "-c 512 -ub 64 -ngl 99",
    "expscpu": "-c 512 -ub 64 -ngl 99 -ot exps=CPU",
    "ngl2": "-c 512 -ub 64 -ngl 2",
    "2rpc": "2rpc -c 512 -ub 64 -ngl 99 -ts 1,1",
    "nofa": "-c 512 -ub 64 -ngl 99 -fa off",
}
# the real-config models (moeconf.fixtures.graphmodels.REAL: one full-size layout per architecture,
# dimension set "real") under a long context: experts on the CPU, and two devices (pipeline parallel)
REAL_DIMS = "real"
REAL_LINES: dict[str, str] = {
    "expscpu32k": "-c 32768 -ngl 99 -ot exps=CPU",
    "2rpc32k": "2rpc -c 32768 -ngl 99 -ts 1,1",
}


def canonical(doc: dict[str, Any], endpoints: list[str], model: Path) -> dict[str, Any]:
    """A dump as recorded: the k-th RPC endpoint as `{EPk}`, the model path as its file name."""
    text = json.dumps(doc)
    for k, ep in enumerate(endpoints):
        text = text.replace(ep, f"{{EP{k}}}")
    out: dict[str, Any] = json.loads(text.replace(json.dumps(str(model))[1:-1], model.name))
    return out


def file_name(arch: str, dims: str, line: str) -> str:
    return f"{arch}-{dims}-{line}.json.gz"


def record_all(tool: Path, out: Path, archs: Collection[str] | None = None
               ) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every recorded graph (of `archs` only, when given), dumped now: {(arch, dims, line): canonical
    document}. The next model is written (in Python: the real ones' vocabularies take a second or two)
    while the tool dumps the current one."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from moeconf.fixtures.graphmodels import ARCHS, DIMS, REAL, write_graph_model, write_real_model
    from tests.recorded_memory import rpc_args

    jobs: list[tuple[str, str, dict[str, str]]] = [(a, d, LINES) for a in ARCHS for d in DIMS]
    jobs += [(a, REAL_DIMS, REAL_LINES) for a in REAL]
    if archs is not None:
        jobs = [job for job in jobs if job[0] in archs]

    def write(arch: str, dims: str) -> Path:
        path = out / f"{arch}-{dims}.gguf"
        return write_real_model(arch, path) if dims == REAL_DIMS else write_graph_model(arch, dims, path)

    docs: dict[tuple[str, str, str], dict[str, Any]] = {}
    with rpc_servers(MAINLINE, 2) as eps, ThreadPoolExecutor(max_workers=1) as pool:
        ahead: Future[Path] = pool.submit(write, *jobs[0][:2])
        for k, (arch, dims, lines) in enumerate(jobs):
            model = ahead.result()
            if k + 1 < len(jobs):
                ahead = pool.submit(write, *jobs[k + 1][:2])
            for line, args in lines.items():
                docs[arch, dims, line] = canonical(dump(tool, model, rpc_args(args, eps)), eps, model)
            model.unlink()
    return docs


def index(docs: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    """What the recorded folder holds, and which engine produced it."""
    from moeconf.fixtures.graphmodels import DIMS, REAL

    engines = {json.dumps(d["engine"], sort_keys=True) for d in docs.values()}
    if len(engines) != 1:
        raise RuntimeError(f"dumps from several engines: {engines}")
    return {
        "source": "tests/engine/graphdump.cpp against llama-cpp-python 0.3.36 (ggml-org/llama.cpp 0c1e57098, b11312); "
                  "models: moeconf/fixtures/graphmodels.py (dims a, b: write_graph_model; real: write_real_model, "
                  "the full-size layout REAL names); RPC servers on 127.0.0.1 as devices ({EP0}, {EP1}); "
                  "regenerate: python -m tests.engine.graphdump",
        "engine": json.loads(engines.pop()),
        "lines": LINES,
        "dims": {k: vars(v) for k, v in DIMS.items()},
        "real_lines": REAL_LINES,
        "real": REAL,
        "graphs": [{"file": file_name(*key), "arch": key[0], "dims": key[1], "line": key[2],
                    "nodes": len(d["nodes"]), "splits": len(d["splits"])} for key, d in sorted(docs.items())],
    }


def write(docs: dict[tuple[str, str, str], dict[str, Any]], folder: Path = DATA) -> None:
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    names = {file_name(*key) for key in docs}
    for old in folder.glob("*.json.gz"):
        if old.name not in names:
            old.unlink()
    for key, doc in docs.items():
        text = json.dumps(doc, separators=(",", ":"))
        (folder / file_name(*key)).write_bytes(gzip.compress(text.encode(), 9, mtime=0))
    (folder / "index.json").write_text(json.dumps(index(docs), indent=1) + "\n")


def stale(folder: Path, fresh: dict[tuple[str, str, str], dict[str, Any]]) -> list[str]:
    """How the recorded folder differs from graphs dumped now (empty: current): each file missing,
    left over or different, a different one with the first node that differs."""
    import gzip

    from tests.enginegraph import compare, from_dict

    problems: list[str] = []
    names = {file_name(*key): doc for key, doc in fresh.items()}
    for path in sorted(folder.glob("*.json.gz")):
        if path.name not in names:
            problems.append(f"{path.name}: recorded, but no longer dumped")
    for name, doc in sorted(names.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: not recorded")
            continue
        old = json.loads(gzip.decompress(path.read_bytes()))
        if old != doc:
            diff = compare(from_dict(old), from_dict(doc))
            where = f": {diff.describe('recorded', 'now')}" if diff else " (outside the nodes and splits)"
            problems.append(f"{name}: differs{where}")
    idx = folder / "index.json"
    if not idx.is_file() or json.loads(idx.read_text()) != index(fresh):
        problems.append("index.json: not what the dumps give")
    return problems


def arch_files(folder: Path, arch: str) -> list[Path]:
    """The recorded files of `arch` in `folder`: those its index lists for it, and any named as one of
    its dumps would be (an architecture's name may hold "-", so a name is matched whole, never split)."""
    from moeconf.fixtures.graphmodels import DIMS

    names = {file_name(arch, dims, line) for dims in (*DIMS, REAL_DIMS) for line in (*LINES, *REAL_LINES)}
    idx = folder / "index.json"
    if idx.is_file():
        names |= {g["file"] for g in json.loads(idx.read_text())["graphs"] if g["arch"] == arch}
    return sorted(folder / name for name in names if (folder / name).is_file())


def merged_index(old: dict[str, Any], docs: dict[tuple[str, str, str], dict[str, Any]],
                 archs: Collection[str]) -> dict[str, Any]:
    """The folder's index with the graphs of `archs` replaced by `docs` (their dumps now) and every other
    architecture's entries kept. Refused (RuntimeError) where the kept dumps could not stand beside the new
    ones: another engine, other command lines or dimension sets, another real layout for a kept one."""
    from moeconf.fixtures.graphmodels import REAL

    new = index(docs)
    redo = "record every architecture (python -m tests.engine.graphdump, no --arch)"
    if old.get("engine") != new["engine"]:
        raise RuntimeError(f"the folder was recorded by {old.get('engine')}, the dumps now come from "
                           f"{new['engine']}: {redo}")
    for key in ("lines", "dims", "real_lines"):
        if old.get(key) != new[key]:
            raise RuntimeError(f"index.json's {key} are not graphdump's now ({old.get(key)} against "
                               f"{new[key]}): the other architectures' dumps are stale too; {redo}")
    moved = sorted(a for a in {*old.get("real", {}), *REAL} - set(archs) if old.get("real", {}).get(a) != REAL.get(a))
    if moved:
        raise RuntimeError(f"the real layout of {', '.join(moved)} changed since the folder was recorded: "
                           f"add them to --arch, or {redo}")
    kept = [g for g in old["graphs"] if g["arch"] not in archs]
    new["graphs"] = sorted(kept + new["graphs"], key=lambda g: (g["arch"], g["dims"], g["line"]))
    return new


def write_archs(docs: dict[tuple[str, str, str], dict[str, Any]], archs: Collection[str],
                folder: Path = DATA) -> list[str]:
    """Record `docs` (the dumps of `archs`, and only theirs) into `folder`: each of those architectures'
    files replaced, those no longer dumped removed, the index (if the folder has one) updated for them
    alone; every other file untouched. Checked before anything is written. Returns what it did, a line each."""
    import gzip

    if stray := sorted({key[0] for key in docs} - set(archs)):
        raise RuntimeError(f"dumps of {', '.join(stray)} given, which are not being recorded")
    idx = folder / "index.json"
    new_index = merged_index(json.loads(idx.read_text()), docs, archs) if idx.is_file() else None
    names = {file_name(*key) for key in docs}
    done: list[str] = []
    folder.mkdir(parents=True, exist_ok=True)
    for arch in sorted(archs):
        for old in arch_files(folder, arch):
            if old.name not in names:
                old.unlink()
                done.append(f"removed {old.name} (no longer dumped)")
    for key, doc in sorted(docs.items()):
        text = json.dumps(doc, separators=(",", ":"))
        (folder / file_name(*key)).write_bytes(gzip.compress(text.encode(), 9, mtime=0))
    done.append(f"wrote {len(docs)} dumps of {', '.join(sorted(archs))}")
    if new_index is not None:
        idx.write_text(json.dumps(new_index, indent=1) + "\n")
        done.append("index.json: updated for those architectures")
    else:
        done.append(f"{folder} has no index.json: none written")
    return done


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The recorder's command line: `--arch NAME` (repeatable; each one of graphmodels.ARCHS), `--out`."""
    from moeconf.fixtures.graphmodels import ARCHS

    ap = argparse.ArgumentParser(
        prog="python -m tests.engine.graphdump",
        description="Record the pinned llama.cpp's reserved graphs of moeconf.fixtures.graphmodels' models "
                    "(every architecture: the folder rewritten, files no longer dumped removed).")
    ap.add_argument("--arch", action="append", default=[], metavar="NAME",
                    help="record only this architecture's dumps (repeatable): only its files are replaced "
                         "and the index updated for it alone")
    ap.add_argument("--out", type=Path, default=DATA, metavar="FOLDER",
                    help="the recorded folder (default: tests/data/graphs)")
    ns = ap.parse_args(argv)
    if unknown := [a for a in ns.arch if a not in ARCHS]:
        ap.error(f"unknown architecture {', '.join(map(repr, unknown))}; the known ones: {', '.join(ARCHS)}")
    ns.arch = sorted(set(ns.arch))
    return ns


def main(argv: Sequence[str] | None = None, tool: Path | None = None) -> int:
    ns = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="moeconf-graphdump-") as tmp:
        built = tool or compile_tool(Path(tmp) / "graphdump")
        if not ns.arch:
            write(record_all(built, Path(tmp)), ns.out)
            print(f"recorded every architecture into {ns.out}")
            return 0
        docs = record_all(built, Path(tmp), ns.arch)
    try:
        done = write_archs(docs, ns.arch, ns.out)
    except RuntimeError as e:
        print(f"graphdump: {e}; nothing written", file=sys.stderr)
        return 1
    print("\n".join(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
