"""Measured CPU speed rows for `tests/data/speed_runs.json` (issue 26 item 5, the host side).

    python benchmarks/cpu_speed_runs.py probe                 # this machine: lscpu + host memory bandwidth
    python benchmarks/cpu_speed_runs.py run --out rows.json   # probe, then every layout below, as rows
    python benchmarks/cpu_speed_runs.py run --layouts olmoe-1b-7b --repeats 3 --threads 2 --out rows.json
    python benchmarks/cpu_speed_runs.py merge tests/data/speed_runs.json rows.json [more.json ...]

What it measures, and how:

* The engine is the pinned llama.cpp (0.3.36 = b11312, CPU build, AVX2, no AVX-512) in
  `~/.cache/moeconf/engines/llama-cpp-python-0.3.36`. That build ships no `llama-bench`, so the script
  compiles the engine's own `tools/llama-bench` sources once against the pinned libraries
  (`libllama`, `libllama-common`, `libggml*` of that build, same defines as the build's other tools)
  into `--bench-dir` (default `/tmp/moeconf-llama-bench`); the engine cache is not written to.
* Each model is a full-size GGUF of a real MoE layout from `moeconf.fixtures.LAYOUTS` (real tensor
  names, shapes and per-tensor quant types; data region sparse, so every weight reads as zero),
  written under `--work` and deleted after its runs. With zero weights every router scores all
  experts alike and picks the same `expert_used_count` experts for every token, so a generated
  token reads the same bytes as with real routing. A prompt ubatch, though, sends all its tokens
  to those same experts, where real routing spreads them over (nearly) all experts: the prompt
  figures are those of a fixed expert set (the same FLOPs per token, fewer distinct expert bytes).
* `llama-bench -m MODEL -p 128,512 -n 32 -t THREADS -r 3 -o json` (and `-p 0 -n 32 -d 512` for
  generation at depth 512 unless `--no-depth`), run `--repeats` times as separate processes; the
  best of the repeats is kept for each test (the machine is shared: a slower repeat is another
  process taking the cores, not the engine). `uptime`'s load averages are read before every repeat
  and all of them are written into the row's notes.
* The host memory bandwidth: `probe_bandwidth` times numpy reads (`np.add.reduce` over 256 MiB of
  int64, counted as bytes read) and copies (`np.copyto`, counted as bytes read + bytes written), in
  one process and in `--threads` processes at once, best of 7; the row's `memory_bandwidth_gbs` is
  the best read figure (1 or `--threads` processes), in GB/s = 1e9 bytes/s.

Rows come out in the schema of `tests/data/speed_runs.json` (`source` names this script); the
`aside` flag is set by the rule stated in docs/benchmarks.md ("Measured runs"): within this
script's rows sorted by id, every third (the 3rd, 6th, ...) is aside. `merge` puts the rows of one
or more `run --out` files into the data file: where two runs measured the same row (same id), the
one with the higher generation speed (prompt speed where it has none) is kept, as within a run; every
other row is left as it is, and the aside rule is applied again over the `cpu-` rows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ENGINE = Path.home() / ".cache" / "moeconf" / "engines" / "llama-cpp-python-0.3.36"
DEFAULT_LAYOUTS = ["granite-3.1-3b-a800m", "smallthinker-4ba0.6b", "olmoe-1b-7b", "lfm2-8b-a1b"]
SOURCE = "benchmarks/cpu_speed_runs.py (this repository; measured on the development machine)"


def build_bench(bench_dir: Path) -> Path:
    """The pinned engine's `llama-bench`, compiled from its own sources against its own libraries."""
    exe = bench_dir / "llama-bench"
    if exe.exists():
        return exe
    src = ENGINE / "src" / "vendor" / "llama.cpp"
    lib = ENGINE / "build" / "bin"
    if not (src / "tools" / "llama-bench" / "llama-bench.cpp").exists() or not (lib / "libllama.so").exists():
        sys.exit(f"error: the pinned llama.cpp build is not at {ENGINE} (build it with scripts/build-engines.sh)")
    bench_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        "g++", "-O3", "-DNDEBUG", "-std=c++17", "-DGGML_BACKEND_SHARED", "-DGGML_SHARED", "-DGGML_USE_CPU",
        "-DGGML_USE_RPC", "-DLLAMA_SHARED", "-DLLAMA_SUBPROCESS",
        f"-I{src}/tools/llama-bench", f"-I{src}/common", f"-I{src}/vendor", f"-I{src}/include",
        f"-I{src}/ggml/include",
        str(src / "tools" / "llama-bench" / "llama-bench.cpp"), str(src / "tools" / "llama-bench" / "main.cpp"),
        f"-L{lib}", f"-Wl,-rpath,{lib}", "-lllama-common", "-lllama", "-lggml", "-lggml-base", "-lpthread",
        "-o", str(exe),
    ]
    subprocess.run(cmd, check=True)
    return exe


def lscpu() -> dict[str, str]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines()) if v}


def load_averages() -> str:
    """`uptime`'s three load averages, as it prints them."""
    out = subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"load average:\s*(.*)$", out.strip())
    return m.group(1) if m else out.strip()


def _probe_worker(barrier: Any, queue: Any, kind: str, n: int, tries: int) -> None:
    import numpy as np

    src = np.ones(n, dtype=np.int64)
    dst = np.empty(n, dtype=np.int64)
    spans = []
    for _ in range(tries):
        barrier.wait()
        t0 = time.perf_counter()
        if kind == "read":
            np.add.reduce(src)
        else:
            np.copyto(dst, src)
        spans.append((t0, time.perf_counter()))
    queue.put(spans)


def probe_bandwidth(threads: int, mib: int = 256, tries: int = 7) -> dict[str, float]:
    """Best GB/s (1e9 bytes/s) of numpy reads and copies of `mib` MiB per process, in 1 process and
    in `threads` processes started together (a barrier before each try; a try lasts from the first
    start to the last finish)."""
    import multiprocessing as mp

    n = mib * 2**20 // 8
    out: dict[str, float] = {}
    for k in sorted({1, threads}):
        for kind in ("read", "copy"):
            barrier, queue = mp.Barrier(k), mp.Queue()
            procs = [mp.Process(target=_probe_worker, args=(barrier, queue, kind, n, tries)) for _ in range(k)]
            for p in procs:
                p.start()
            spans = [queue.get() for _ in procs]
            for p in procs:
                p.join()
            best = min(max(s[i][1] for s in spans) - min(s[i][0] for s in spans) for i in range(tries))
            moved = (1 if kind == "read" else 2) * k * n * 8
            out[f"{kind}_{k}p_gbs"] = round(moved / best / 1e9, 1)
    return out


def _bench(exe: Path, model: Path, args: list[str]) -> list[dict[str, Any]]:
    cmd = [str(exe), "-m", str(model), *args, "-o", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({res.returncode}): {res.stderr[-2000:]}")
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def _test_key(r: dict[str, Any]) -> tuple[int, int, int]:
    return (int(r["n_prompt"]), int(r["n_gen"]), int(r["n_depth"]))


def measure(exe: Path, model: Path, threads: int, repeats: int, depth: bool) -> dict[str, Any]:
    """Best t/s per llama-bench test over `repeats` processes, with the load before each."""
    best: dict[tuple[int, int, int], dict[str, Any]] = {}
    loads: list[str] = []
    plans = [["-p", "128,512", "-n", "32", "-t", str(threads), "-r", "3"]]
    if depth:
        plans.append(["-p", "0", "-n", "32", "-d", "512", "-t", str(threads), "-r", "3"])
    for _ in range(repeats):
        for args in plans:
            loads.append(load_averages())
            for r in _bench(exe, model, args):
                k = _test_key(r)
                if k not in best or float(r["avg_ts"]) > float(best[k]["avg_ts"]):
                    best[k] = r
    return {"best": best, "loads": loads}


def _machine(cpu: dict[str, str], bw: dict[str, float], threads: int) -> dict[str, Any]:
    name = cpu.get("Model name", "unknown")
    fam, model = cpu.get("CPU family", "?"), cpu.get("Model", "?")
    hyp = cpu.get("Hypervisor vendor")
    desc = f"{name} (family {fam}, model {model}{', ' + hyp + ' guest' if hyp else ''}, {cpu.get('CPU(s)')} vCPUs)"
    return {
        "gpus": [],
        "host": {
            "memory_bandwidth_gbs": max(v for k, v in bw.items() if k.startswith("read_")),
            "ram": None,
            "cores": int(cpu.get("CPU(s)", "0")) or None,
            "threads": threads,
            "cpu": desc,
        },
    }


def rows_for(layout_key: str, result: dict[str, Any], machine: dict[str, Any], bw: dict[str, float],
             threads: int) -> list[dict[str, Any]]:
    from moeconf.fixtures import LAYOUTS

    lay = LAYOUTS[layout_key]
    best = result["best"]
    any_r = next(iter(best.values()))
    quant = (f"moeconf fixture layout '{layout_key}' as written by moeconf.fixtures.write_layout: file type "
             f"{lay.file_type}, experts {lay.expert_type} (down {lay.expert_down_type}), attention {lay.attn_type}; "
             f"zero weights (sparse data region); llama-bench reports {any_r['model_type']}, "
             f"{int(any_r['model_size'])} bytes")
    common = (f"pinned llama.cpp {any_r['build_commit']} CPU build (llama-bench compiled from its sources); "
              f"best of {len(result['loads'])} llama-bench processes (each -r 3, the mean of 3); load averages "
              f"(1/5/15 min) before each: {'; '.join(result['loads'])}. Host bandwidth probe: {bw} "
              f"(numpy, GB/s = 1e9 B/s; read = bytes read, copy = bytes read + written).")
    base_cmd = f"llama-bench -m {layout_key}.gguf -t {threads} -r 3"
    out: list[dict[str, Any]] = []

    def row(suffix: str, prompt: int, dep: int | None, pp: float | None, tg: float | None, cmd: str,
            what: str) -> None:
        out.append({
            "id": f"cpu-{layout_key}-t{threads}-{suffix}",
            "source": SOURCE,
            "aside": False,
            "engine": "llama.cpp",
            "engine_version": f"b11312 ({any_r['build_commit']})",
            "model": {"layout": layout_key},
            "quant_note": quant,
            "command": cmd,
            "prompt_tokens": prompt,
            "depth": dep,
            "machine": machine,
            "measured": {"pp_tps": pp, "tg_tps": tg},
            "notes": f"{what} {common}",
        })

    def ts(k: tuple[int, int, int]) -> float | None:
        return round(float(best[k]["avg_ts"]), 2) if k in best else None

    row("p128", 128, 0, ts((128, 0, 0)), None, f"{base_cmd} -p 128,512 -n 32",
        "pp128 (tg of the same run is in the p512 row).")
    row("p512", 512, 0, ts((512, 0, 0)), ts((0, 32, 0)), f"{base_cmd} -p 128,512 -n 32",
        "pp512 and tg32 from an empty context (llama-bench runs them as separate tests).")
    if (0, 32, 512) in best:
        row("d512", 0, 512, None, ts((0, 32, 512)), f"{base_cmd} -p 0 -n 32 -d 512",
            "tg32 after a 512-token context (-d 512).")
    return out


def set_aside(rows: list[dict[str, Any]]) -> None:
    """Every third row by id order (the 3rd, 6th, ...) is aside."""
    for i, r in enumerate(sorted(rows, key=lambda r: str(r["id"]))):
        r["aside"] = i % 3 == 2


def merge(data: Path, parts: list[Path]) -> list[dict[str, Any]]:
    """The data file's runs with its `cpu-` rows replaced or joined by those of `parts`."""
    runs: list[dict[str, Any]] = json.loads(data.read_text())["runs"] if data.exists() else []
    cpu = {str(r["id"]): r for r in runs if str(r["id"]).startswith("cpu-")}

    def speed(r: dict[str, Any]) -> float:
        m = r["measured"]
        return float(m["tg_tps"] if m["tg_tps"] is not None else m["pp_tps"] or 0.0)

    for part in parts:
        for r in json.loads(part.read_text())["runs"]:
            old = cpu.get(str(r["id"]))
            if old is None or speed(r) > speed(old):
                cpu[str(r["id"])] = r
    rows = sorted(cpu.values(), key=lambda r: str(r["id"]))
    set_aside(rows)
    return [r for r in runs if not str(r["id"]).startswith("cpu-")] + rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["probe", "run", "merge"])
    ap.add_argument("files", nargs="*", type=Path, help="merge: the data file, then the row files")
    ap.add_argument("--layouts", nargs="*", default=DEFAULT_LAYOUTS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-depth", action="store_true")
    ap.add_argument("--work", type=Path, default=Path("/tmp/moeconf-cpu-speed"))
    ap.add_argument("--bench-dir", type=Path, default=Path("/tmp/moeconf-llama-bench"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.what == "merge":
        if len(a.files) < 2:
            sys.exit("error: merge needs the data file and at least one row file")
        runs = merge(a.files[0], a.files[1:])
        a.files[0].write_text(json.dumps({"runs": runs}, indent=1) + "\n")
        print(f"{a.files[0]}: {len(runs)} runs")
        return 0

    cpu = lscpu()
    load = load_averages()
    bw = probe_bandwidth(a.threads)
    print(json.dumps({"cpu": cpu.get("Model name"), "platform": platform.machine(), "load": load,
                      "bandwidth": bw}), flush=True)
    if a.what == "probe":
        return 0
    from moeconf.fixtures import LAYOUTS, write_layout

    exe = build_bench(a.bench_dir)
    machine = _machine(cpu, bw, a.threads)
    rows: list[dict[str, Any]] = []
    a.work.mkdir(parents=True, exist_ok=True)
    for key in a.layouts:
        path = a.work / f"{key}.gguf"
        try:
            write_layout(LAYOUTS[key], path)
            res = measure(exe, path, a.threads, a.repeats, not a.no_depth)
        finally:
            if path.exists():
                os.unlink(path)
        new = rows_for(key, res, machine, bw, a.threads)
        rows.extend(new)
        print(json.dumps([(r["id"], r["measured"]) for r in new]), flush=True)
        if a.out:  # written after every model, so a long run's finished part is kept
            set_aside(rows)
            a.out.write_text(json.dumps({"runs": rows}, indent=1) + "\n")
    shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
