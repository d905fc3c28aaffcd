"""moeconf benchmarks: one command, printed tables.

    python benchmarks/bench.py            # every table
    python benchmarks/bench.py inventory  # header reader vs gguf.GGUFReader, CLI wall time
    python benchmarks/bench.py lint-corpus  # linter precision/recall on real-world launch lines
    python benchmarks/bench.py lint-size --size-mb 50   # `moeconf lint` on huge launch files
    python benchmarks/bench.py cli --baseline 611898a  # whole commands, beside an older revision
    python benchmarks/bench.py lint-items --items 250 1000 4000  # lint time against -ot items
    python benchmarks/bench.py compile    # compile of each shipped plan against an interpreter start
    python benchmarks/bench.py hub        # remote headers against the Hub emulator (50 ms a request)

Times are wall-clock on this machine; each row says how many runs it took the median of.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _fmt_s(sec: float) -> str:
    return f"{sec * 1000:.1f} ms" if sec < 1 else f"{sec:.2f} s"


def _print_table(title: str, rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"\n## {title}\n")
    for n, r in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def bench_inventory(runs: int, ref_runs: int) -> None:
    import gguf

    from moeconf.fixtures import LAYOUTS, write_layout
    from moeconf.model.gguf_header import read_header
    from moeconf.model.load import load_inventory

    lay = LAYOUTS["deepseek-v3"]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_layout(lay, Path(tmp) / "DeepSeek-V3-0324-Q4_K_M.gguf")[0]
        (Path(tmp) / "split").mkdir()
        split = write_layout(lay, Path(tmp) / "split" / "DeepSeek-V3-0324-Q4_K_M.gguf", split_max_tensors=130)
        header = read_header(path)
        n_tokens = header.get("tokenizer.ggml.tokens").count
        n_merges = header.get("tokenizer.ggml.merges").count
        size_gb = path.stat().st_size / 1e9
        print(f"\nmodel: DeepSeek-V3-shaped GGUF, {len(header.tensors)} tensors, {lay.blocks} blocks, "
              f"{n_tokens:,} tokens, {n_merges:,} merges, {size_gb:.0f} GB (sparse), "
              f"header {header.data_offset / 1e6:.1f} MB")

        ours = _median_time(lambda: read_header(path), runs)
        inv = _median_time(lambda: load_inventory(path), runs)
        inv_split = _median_time(lambda: load_inventory(split[0]), runs)
        ref = _median_time(lambda: gguf.GGUFReader(path), ref_runs)

        cli = []
        for _ in range(runs):
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "moeconf", "inspect", str(path)], capture_output=True, cwd=REPO)
            cli.append(time.perf_counter() - t)
            assert r.returncode == 0, r.stderr
        cli_json = []
        for _ in range(runs):
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "moeconf", "inspect", str(path), "--json"],
                               capture_output=True, cwd=REPO)
            cli_json.append(time.perf_counter() - t)
        python_start = _median_time(
            lambda: subprocess.run([sys.executable, "-c", "pass"], capture_output=True), runs)

    rows = [
        ["what", "runs", "median", "vs gguf.GGUFReader"],
        ["gguf.GGUFReader(path) (reference)", str(ref_runs), _fmt_s(ref), "1x"],
        ["moeconf read_header(path)", str(runs), _fmt_s(ours), f"{ref / ours:.0f}x faster"],
        ["moeconf load_inventory(path) (+ taxonomy)", str(runs), _fmt_s(inv), f"{ref / inv:.0f}x faster"],
        [f"load_inventory, split into {len(split)} shards", str(runs), _fmt_s(inv_split),
         f"{ref / inv_split:.0f}x faster"],
        ["`moeconf inspect MODEL` (whole command, wall)", str(runs), _fmt_s(statistics.median(cli)), ""],
        ["`moeconf inspect MODEL --json` (wall)", str(runs), _fmt_s(statistics.median(cli_json)), ""],
        ["`python -c pass` (interpreter start, for scale)", str(runs), _fmt_s(python_start), ""],
    ]
    _print_table("Inventory: GGUF header reading", rows)


# (model manifest, plan rules, extra plan TOML, what users write by hand, where it comes from)
HAND_WRITTEN = [
    ("kimi-k2", ["experts -> cpu", "experts first 10 -> gpu"], "",
     r"\.(\d|10)\.=CUDA0,exps=CPU", "guide shape: layers 0-10 carved first, experts on CPU"),
    ("deepseek-v3", ["layer -> cpu", "layers 3..4 -> gpu1", "experts layers 1,3,4 -> gpu1"],
     '[engine]\nname = "ik_llama.cpp"\n[flags]\nrpc = ["10.0.0.2:50052"]\n',
     r"blk\.[34]\.=RPC0[10.0.0.2:50052],blk=CPU", "ik: whole layers on CPU, 3-4 on an RPC server"),
    ("glm-4.5", ["experts -> cpu", "layers ..30 -> gpu"], "",
     r"blk\.([0-9]|[1-2][0-9]|30)\.=CUDA0,exps=CPU", "guide: layers 0-30 on CUDA0, other experts on CPU"),
    ("glm-4.5", ["experts -> cpu", "layers ..30 -> gpu"], "",
     "blk\\.(" + "|".join(str(i) for i in range(31)) + ")\\.=CUDA0,exps=CPU", "guide, spelled out"),
    ("qwen3-30b-a3b", ["experts layers 14..47 -> cpu"], "",
     ",".join(rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU" for i in range(14, 48)),
     "llama-fit-params style: 34 items"),
    ("qwen3-235b-a22b", ["experts layers 0..87 -> cpu"], "",
     r"blk\.(?:[0-9]|[1-7][0-9]|[8][0-7])\.ffn_.*_exps\.=CPU", "guide: experts of layers 0-87 on CPU"),
    ("deepseek-v3", ["experts -> cpu"], "", r"\.ffn_.*_exps\.=CPU", "guide: all routed experts on CPU"),
    ("deepseek-v3", ["experts -> cpu", "layers ..9 -> gpu", "layers 10..19 -> gpu1"],
     '[engine]\ngpus = ["CUDA0", "CUDA1"]\n',
     r"blk\.([0-9])\.=CUDA0,blk\.(1[0-9])\.=CUDA1,exps=CPU", "guide: two GPUs"),
    ("glm-4.5", ["experts layers 19.. -> cpu"], "",
     r"blk\.(19|[2-9][0-9])\.ffn_(up|gate|down)_exps\.weight=CPU", "guide (-sm graph): experts of 19+ on CPU"),
]


def bench_ot_length(args: argparse.Namespace) -> None:
    from moeconf.compile import compile_plan
    from moeconf.engines.simulate import OverrideItem, simulate
    from moeconf.plan import plan_from_text

    base = _baseline_tree(args.baseline) if args.baseline else None
    rows = [["model", "placement", "hand-written", *(["before"] if base else []), "moeconf", "shorter by",
             "same placement", "compile"]]
    for model, rules, extra, hand, what in HAND_WRITTEN:
        rl = "[" + ", ".join(f'"{r}"' for r in rules) + "]"
        text = (f'rules = {rl}\n[model]\npath = "{REPO}/examples/models/{model}.manifest.json"\n'
                f'serve_path = "/m.gguf"\n{extra}')
        plan = plan_from_text(text, str(REPO / "bench-plan.toml"))
        before: list[str] = []
        if base:
            with tempfile.TemporaryDirectory() as tmp:
                pf = Path(tmp) / "plan.toml"
                pf.write_text(text)
                r = subprocess.run([sys.executable, "-m", "moeconf", "compile", str(pf), "-T", "ot", "-q"],
                                   capture_output=True, text=True, cwd=base)
                before = [f"{len(r.stdout.strip())} chars" if r.returncode == 0 else f"exit {r.returncode}"]
        t = time.perf_counter()
        c = compile_plan(plan)
        dt = time.perf_counter() - t
        items = [OverrideItem(*it.rsplit("=", 1)) for it in hand.split(",")]
        sim = simulate(c.inventory, items, c.placement.defaults)
        same = all(sim.devices[n] == d for n, d in c.placement.devices.items() if d is not None)
        rows.append([model, what, f"{len(hand)} chars, {len(items)} item{'s' if len(items) > 1 else ''}", *before,
                     f"{len(c.ot)} chars, {len(c.synthesis.items)} item{'s' if len(c.synthesis.items) > 1 else ''}",
                     f"{100 * (len(hand) - len(c.ot)) / len(hand):.0f}%", "yes" if same else "NO", _fmt_s(dt)])
        print(f"  {model}: {c.ot}", file=sys.stderr)
    _print_table("-ot length: moeconf against hand-written rules (same effective placement)", rows)


def bench_lint_corpus(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import lintcorpus

    t = time.perf_counter()
    s = lintcorpus.score()
    dt = time.perf_counter() - t
    prec, rec = lintcorpus.tables(s)
    print(f"\ncorpus: {s.launches} launches, {s.values} distinct -ot values, {s.items} items, {s.models} models, "
          f"{s.sources} sources; linted and judged in {_fmt_s(dt)}")
    _print_table("lint precision per rule (truth: the reference simulation)", prec)
    _print_table("lint recall per problem type", rec)
    if s.unjudged:
        print("\nnot judged (rules with no reference label): "
              + ", ".join(f"{k} {v}" for k, v in sorted(s.unjudged.items())))
    _print_corpus_details(s, args.verbose)


def _print_corpus_details(s: Any, verbose: bool) -> None:
    """The closing lines of a corpus score: errors on clean lines, then (-v) every false
    positive, miss and such error."""
    print(f"error-severity findings on launches the engine runs as written: {len(s.errors_on_clean)}")
    if verbose:
        for line in s.false_positives:
            print("FP   " + line)
        for line in s.misses:
            print("MISS " + line)
        for line in s.errors_on_clean:
            print("ERR  " + line)


def bench_lint_mutants(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from collections import Counter

    import lintcorpus

    t = time.perf_counter()
    pairs = lintcorpus.mutants()
    kinds = Counter(what for what, _ in pairs)
    s = lintcorpus.score([la for _, la in pairs])
    dt = time.perf_counter() - t
    prec, rec = lintcorpus.tables(s)
    print(f"\nmutants: {s.launches} launches ({', '.join(f'{k} {n}' for k, n in kinds.most_common())}); "
          f"linted and judged in {_fmt_s(dt)}")
    _print_table("lint precision per rule on the mutants", prec)
    _print_table("lint recall per problem type on the mutants", rec)
    if s.unjudged:
        print("\nnot judged: " + ", ".join(f"{k} {v}" for k, v in sorted(s.unjudged.items())))
    _print_corpus_details(s, args.verbose)


# (file name, what it is, a function of the size in bytes -> the file's text)
def _shell_lines(size: int) -> str:
    line = "llama-server -m /models/m.gguf -ngl 999 -c 32768 -ot 'blk\\.(1[4-9]|[2-4]\\d)\\..*exps=CPU'\n"
    return line * max(1, size // len(line))


def _shell_comment(size: int) -> str:
    return "#!/bin/sh\n# " + "x" * size + "\nllama-server -m /m.gguf -ot exps=CPU\n"


def _shell_word(size: int) -> str:
    return "llama-server -m /m.gguf --alias " + "w" * size + " -ot exps=CPU\n"


def _shell_ot(size: int) -> str:
    item = "blk\\.1\\.ffn_up_exps=CPU,"
    return "llama-server -m /m.gguf -ot '" + item * max(1, size // len(item)) + "exps=CPU'\n"


def _shell_many_words(size: int) -> str:
    return "llama-server -m /m.gguf " + "-c 1 " * max(1, size // 5) + "\n"


def _shell_long_item(size: int) -> str:
    return "llama-server -m /m.gguf -ot 'blk\\." + "(a|b)" * max(1, size // 5) + "=CPU'\n"


def _compose_services(size: int) -> str:
    svc = ("  s{n}:\n    image: ghcr.io/ggml-org/llama.cpp:server-cuda-b7600\n    command: -m /m.gguf -ngl 999 "
           "-ot 'blk\\.1\\.ffn_up_exps=CPU'\n    environment:\n      - LLAMA_ARG_N_CPU_MOE=2\n")
    n = max(1, size // len(svc.format(n=100000)))
    return "services:\n" + "".join(svc.format(n=i) for i in range(n))


def _compose_command(size: int) -> str:
    item = "blk\\.1\\.ffn_up_exps=CPU,"
    return ("services:\n  s:\n    image: ghcr.io/ggml-org/llama.cpp:server-cuda-b7600\n"
            "    command: -m /m.gguf -ot '" + item * max(1, size // len(item)) + "exps=CPU'\n")


def _swap_models(size: int) -> str:
    m = "  m{n}:\n    cmd: |\n      ${{server}} -m /m.gguf -ngl 999\n      -ot 'blk\\.1\\.ffn_up_exps=CPU'\n"
    n = max(1, size // len(m.format(n=100000)))
    return "macros:\n  server: llama-server --port ${PORT}\nmodels:\n" + "".join(m.format(n=i) for i in range(n))


LINT_SIZE = [
    ("launch.sh", "shell, many launch lines", _shell_lines),
    ("comment.sh", "shell, one long comment line", _shell_comment),
    ("word.sh", "shell, one long word", _shell_word),
    ("ot.sh", "shell, one single-line -ot", _shell_ot),
    ("words.sh", "shell, one command of many words", _shell_many_words),
    ("item.sh", "shell, one huge -ot item", _shell_long_item),
    ("docker-compose.yml", "compose, many services", _compose_services),
    ("one-command.yml", "compose, one long command", _compose_command),
    ("llama-swap.yaml", "llama-swap, many models", _swap_models),
]


def bench_lint_size(args: argparse.Namespace) -> None:
    """`moeconf lint FILE` in a fresh process: wall time and peak RSS (of the child, via wait4)."""
    import os

    sizes = [int(float(s) * 1e6) for s in args.size_mb]
    rows = [["file kind", "size", "exit", "seconds", "peak MB", "findings shown"]]
    with tempfile.TemporaryDirectory() as tmp:
        for name, what, _ in LINT_SIZE:
            for size in sizes:
                path = Path(tmp) / name
                # written by a child process: the parent stays small, and a child's peak RSS
                # (ru_maxrss) starts from its parent's size at fork
                subprocess.run([sys.executable, __file__, "--make", name, str(size), str(path)], check=True)
                real = path.stat().st_size
                out_path = Path(tmp) / "out.json"
                t = time.perf_counter()
                with out_path.open("wb") as out_file:
                    proc = subprocess.Popen([sys.executable, "-m", "moeconf", "lint", "--format", "json", str(path)],
                                            stdout=out_file, stderr=subprocess.DEVNULL, cwd=tmp,
                                            env={**os.environ, "PYTHONPATH": str(REPO)})
                    code: int | None = None
                    while True:  # wait4 gives the child's own peak RSS; poll it to enforce the timeout
                        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                        if pid:
                            code = os.waitstatus_to_exitcode(status)
                            break
                        if time.perf_counter() - t > args.timeout:
                            proc.kill()
                            _, _, usage = os.wait4(proc.pid, 0)
                            break
                        time.sleep(0.02)
                    proc.returncode = -1  # reaped above; keep Popen from waiting again
                dt = time.perf_counter() - t
                out = out_path.read_bytes()
                shown = str(out.count(b'"code"')) if code is not None else "-"
                rows.append([what, f"{real / 1e6:.1f} MB", str(code) if code is not None else "timeout",
                             f"{dt:.1f}" + ("" if code is not None else "+"), f"{usage.ru_maxrss / 1024:.0f}", shown])
                print(f"  {what} {real / 1e6:.1f} MB: {dt:.1f} s", file=sys.stderr)
    _print_table("lint-size: `moeconf lint` on large launch files (one process each)", rows)


def _baseline_tree(rev: str) -> Path:
    """The source tree of an older revision, unpacked once into a temporary folder (`git archive`:
    the checkout is not touched). Commands run there with this interpreter, so `python -m moeconf`
    imports that revision's code."""
    cached = _BASELINES.get(rev)
    if cached is not None:
        return cached
    out = Path(tempfile.mkdtemp(prefix="moeconf-baseline-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    _BASELINES[rev] = out
    return out


_BASELINES: dict[str, Path] = {}


def _run_timed(cmd: list[str], cwd: Path, runs: int) -> tuple[float, float, int]:
    """Median wall time and median CPU time (user + system, of the child) of `runs` runs, after
    one warm-up run. Bytecode caching is on, as in a normal install (PYTHONDONTWRITEBYTECODE=1
    would make every run compile every module from source, ~0.1 s more)."""
    import os
    import resource

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, capture_output=True, cwd=cwd, env=env)
    walls, cpus = [], []
    rc = 0
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, cwd=cwd, env=env)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        rc = r.returncode
    return statistics.median(walls), statistics.median(cpus), rc


def bench_cli(args: argparse.Namespace) -> None:
    """Whole commands as a pre-commit hook runs them: compile of each shipped plan, lint of the
    deploy example, --version; beside the same commands on a baseline revision."""
    base = _baseline_tree(args.baseline) if args.baseline else None
    plans = sorted((REPO / "examples" / "plans").glob("*.toml"))
    commands = [[f"compile examples/plans/{p.name}", "compile", f"examples/plans/{p.name}", "-q"] for p in plans]
    commands += [["lint examples/deploy", "lint", "examples/deploy"], ["--version", "--version"]]
    head = ["command", "runs"]
    if base:
        head += [f"wall ({args.baseline})", "wall (now)", f"CPU ({args.baseline})", "CPU (now)"]
    else:
        head += ["wall", "CPU"]
    rows = [head]
    for label, *argv in commands:
        cmd = [sys.executable, "-m", "moeconf", *argv]
        wall, cpu, _ = _run_timed(cmd, REPO, args.runs)
        if base:
            bwall, bcpu, _ = _run_timed(cmd, base, args.runs)
            rows.append([f"`moeconf {label}`", str(args.runs), _fmt_s(bwall), _fmt_s(wall), _fmt_s(bcpu), _fmt_s(cpu)])
        else:
            rows.append([f"`moeconf {label}`", str(args.runs), _fmt_s(wall), _fmt_s(cpu)])
    start, start_cpu, _ = _run_timed([sys.executable, "-c", "pass"], REPO, args.runs)
    rows.append(["`python -c pass` (interpreter start)", str(args.runs), *([_fmt_s(start)] * (2 if base else 1)),
                 *([_fmt_s(start_cpu)] * (2 if base else 1))])
    _print_table("Whole commands: wall time and CPU time (median, after a warm-up run, bytecode cached)", rows)
    if base:
        rows = [["plan", f"-ot ({args.baseline})", "-ot (now)"]]
        for p in plans:
            got = []
            for cwd in (base, REPO):
                r = subprocess.run([sys.executable, "-m", "moeconf", "compile", f"examples/plans/{p.name}", "-T", "ot",
                                    "-q"], capture_output=True, text=True, cwd=cwd)
                got.append(f"`{r.stdout.strip()}` ({len(r.stdout.strip())})")
            rows.append([p.stem, *got])
        _print_table("-ot of the shipped plans", rows)
# -ot item shapes for lint-items: what long generated lines hold (one item per block, llama-fit-params
# style), and a mix of the mistakes lint reports (unescaped dots, shadowed and redundant items,
# always-active tensors to the CPU, blocks the model lacks)
_ITEM_KINDS = (
    "blk\\.{i}\\.ffn_up_exps=CPU", "blk\\.{i}\\.ffn_(up|down)_exps=CUDA0", "blk\\.{i}\\.ffn_gate_exps=CPU",
    "blk.{i}.ffn_down_exps=CPU", "blk\\.{i}\\.attn_.*=CPU", "blk\\.{i}\\.=CUDA0", "blk\\.{i}\\.ffn_.*_exps=CPU",
    "blk\\.{i}\\.ffn_up_shexp=CPU", "exps=CPU",
)


def _ot_items(shape: str, n: int) -> str:
    import random

    if shape == "per-block":
        return ",".join(f"blk\\.{i}\\.ffn_up_exps=CPU" for i in range(n))
    rnd = random.Random(n)
    return ",".join(rnd.choice(_ITEM_KINDS).format(i=rnd.randrange(0, 70)) for _ in range(n))


def bench_lint_items(args: argparse.Namespace) -> None:
    """`moeconf lint` of one launch line with one -ot of N items (DeepSeek-V3, 61 blocks, mapped in
    .moeconf.toml): CPU seconds of the whole process and per item, beside a baseline revision."""
    base = _baseline_tree(args.baseline) if args.baseline else None
    model = REPO / "examples" / "models" / "deepseek-v3.manifest.json"
    served = "/models/DeepSeek-V3-0324-Q4_K_M-00001-of-00009.gguf"
    trees = ([base] if base else []) + [REPO]
    head = ["-ot items", "shape", "runs"]
    for label in ([f" ({args.baseline})"] if base else []) + [""]:
        head += [f"CPU{label}", f"per added item{label}"]
    rows = [head]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / ".moeconf.toml").write_text(f'engine = "llama.cpp"\n[models]\n"{served}" = "{model}"\n')

        def lint_cpu(name: str, ot: str, tree: Path) -> float:
            path = Path(tmp) / f"{name}.sh"
            path.write_text(f"#!/bin/sh\nllama-server -m {served} -ngl 999 -c 8192 \\\n  -ot '{ot}'\n")
            cmd = [sys.executable, "-m", "moeconf", "lint", "--format", "json", str(path)]
            return _run_timed(cmd, tree, args.item_runs)[1]

        # one item: start-up, reading the model, the rules' fixed work; the rest is per item
        one = {tree: lint_cpu("one", "exps=CPU", tree) for tree in trees}
        rows.append(["1", "exps=CPU", str(args.item_runs), *(c for t in trees for c in (f"{one[t]:.2f} s", ""))])
        for shape in ("per-block", "mixed"):
            for n in args.items:
                row = [f"{n:,}", shape, str(args.item_runs)]
                for tree in trees:
                    cpu = lint_cpu(f"{shape}-{n}", _ot_items(shape, n), tree)
                    row += [f"{cpu:.2f} s", f"{(cpu - one[tree]) / (n - 1) * 1000:.2f} ms"]
                    print(f"  {shape} {n}: {cpu:.2f} s{' (baseline)' if tree is base else ''}", file=sys.stderr)
                rows.append(row)
    _print_table("lint-items: `moeconf lint` of one -ot of N items (CPU of the whole process, median)", rows)


def bench_compile(args: argparse.Namespace) -> None:
    """`moeconf compile PLAN -q` of each shipped plan (a pre-commit hook's run): CPU and wall time
    of the whole process, and how many interpreter starts (`python -c pass`) that is."""
    base = _baseline_tree(args.baseline) if args.baseline else None
    plans = sorted((REPO / "examples" / "plans").glob("*.toml"))
    runs = args.compile_runs
    _, start, _ = _run_timed([sys.executable, "-c", "pass"], REPO, runs)
    head = ["command", "runs"]
    head += ([f"CPU ({args.baseline})", f"x start ({args.baseline})"] if base else []) + ["CPU", "wall", "x start"]
    rows = [head]
    for p in plans:
        cmd = [sys.executable, "-m", "moeconf", "compile", f"examples/plans/{p.name}", "-q"]
        row = [f"`moeconf compile examples/plans/{p.name} -q`", str(runs)]
        if base:
            _, bcpu, _ = _run_timed(cmd, base, runs)
            row += [_fmt_s(bcpu), f"{bcpu / start:.0f}x"]
        wall, cpu, _ = _run_timed(cmd, REPO, runs)
        rows.append([*row, _fmt_s(cpu), _fmt_s(wall), f"{cpu / start:.0f}x"])
    rows.append(["`python -c pass` (interpreter start)", str(runs), *([_fmt_s(start), "1x"] if base else []),
                 _fmt_s(start), "", "1x"])
    _print_table("compile: each shipped plan (CPU of the whole process, median, bytecode cached)", rows)


def bench_fit(args: argparse.Namespace) -> None:
    """`moeconf fit` (whole process) beside llama.cpp's own fit (`llama-fit-params -fitt`) on the
    same sparse full-size model and budget, one and two devices (RPC servers on 127.0.0.1)."""
    import os
    import re
    import socket

    from moeconf.fixtures import LAYOUTS, write_layout

    cache = Path(os.environ.get("MOECONF_ENGINE_CACHE", Path.home() / ".cache" / "moeconf" / "engines"))
    bin_dir = cache / "llama-cpp-python-0.3.36" / "build" / "bin"
    fit_params, rpc_server = bin_dir / "llama-fit-params", bin_dir / "ggml-rpc-server"
    have_llama = fit_params.is_file() and rpc_server.is_file()
    cases = [("qwen3-30b-a3b", [12]), ("qwen3-30b-a3b", [8, 6]), ("glm-4.5-air", [20]), ("glm-4.5-air", [14, 10]),
             # the architectures modelled by their own replays (issue 17)
             ("qwen3.5-35b-a3b", [12]), ("nemotron-3-nano-30b-a3b", [12]), ("kimi-linear-48b-a3b", [16]),
             ("deepseek-v3.2", [24]), ("deepseek-v3.2", [24, 16]), ("glm-5", [24]), ("glm-5", [24, 16]),
             ("glm-5.3-flash", [16]), ("glm-5.3-flash", [12, 8])]
    rows = [["model", "budgets (GiB)", "runs", "moeconf fit", "llama-fit-params", "faster"]]
    procs = []
    try:
        ports = []
        for _ in range(2):
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                ports.append(sk.getsockname()[1])
        if have_llama:
            for port in ports:
                procs.append(subprocess.Popen([str(rpc_server), "-H", "127.0.0.1", "-p", str(port)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1)
        with tempfile.TemporaryDirectory() as tmp:
            for key, budgets in cases:
                path = Path(tmp) / f"{key}.gguf"
                if not path.exists():
                    write_layout(LAYOUTS[key], path)
                eps = [f"127.0.0.1:{p}" for p in ports[: len(budgets)]]
                gpus = [arg for ep, b in zip(eps, budgets, strict=True) for arg in ("--gpu", f"RPC0[{ep}]={b}GiB")]
                ours = [sys.executable, "-m", "moeconf", "fit", str(path), *gpus, "--", "-c", "8192", "--rpc",
                        ",".join(eps)]
                # as installed: bytecode compiled once (pip does it at install), here into a
                # cache of the run's own, whatever PYTHONDONTWRITEBYTECODE says; one untimed run
                env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
                env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
                subprocess.run(ours, check=True, capture_output=True, env=env)
                t_ours = _median_time(
                    lambda cmd=ours, env=env: subprocess.run(cmd, check=True, capture_output=True, env=env),
                    args.fit_runs)
                t_theirs = None
                if have_llama:
                    probe = subprocess.run([str(fit_params), "-m", str(path), "--rpc", ",".join(eps), "-fitp", "on",
                                            "-v", "-c", "8192"], capture_output=True, text=True)
                    free = [int(m.group(1)) for m in re.finditer(r"RPC\d+ \([^)]*\)\s+\|\s+\d+ = (\d+)", probe.stderr)]
                    fitt = ",".join(str(f - (b - 1) * 1024) for f, b in zip(free, budgets, strict=False))
                    theirs = [str(fit_params), "-m", str(path), "--rpc", ",".join(eps), "-c", "8192", "-fitt", fitt]
                    t_theirs = _median_time(lambda cmd=theirs: subprocess.run(cmd, check=True, capture_output=True),
                                            args.fit_runs)
                rows.append([key, "+".join(map(str, budgets)), str(args.fit_runs), _fmt_s(t_ours),
                             _fmt_s(t_theirs) if t_theirs else "(not built)",
                             f"{t_theirs / t_ours:.1f}x" if t_theirs else "-"])
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    _print_table("fit: moeconf fit against llama.cpp's own fit (whole process, same model and budget)", rows)


def bench_regex(args: argparse.Namespace) -> None:
    """User patterns over every tensor name of DeepSeek-V3 (1,086 names): the static screen
    matches cheap patterns in process; suspect ones go to a forked worker with a time limit."""
    from moeconf.engines import regex as rxmod
    from moeconf.model.load import load_inventory

    inv = load_inventory(REPO / "examples" / "models" / "deepseek-v3.manifest.json")
    names = [t.name for t in inv.tensors]
    rows = [["pattern", "screen", "result", f"time (median of {args.runs})"]]
    for pattern in [r"blk\.(1|2|3)\.ffn_.*_exps", r"\.ffn_(up|down|gate)_(ch|)exps", "(ffn_(up|down)_exps)+",
                    r"(\d+\.)+ffn", "(.|.)*Q", ".*.*.*.*Q"]:
        results: list[object] = []

        def run(p: str = pattern, out: list[object] = results) -> None:
            rxmod._RESULTS.clear()
            out.append(rxmod.ecmascript_search(p, names))

        t = _median_time(run, args.runs if "Q" not in pattern else 1)
        r = results[-1]
        shown = f"{len(r)} names" if isinstance(r, frozenset) else f"reported {r.kind}"  # type: ignore[union-attr]
        screen = "fork" if rxmod._parsed(pattern).suspect else "in process"
        rows.append([f"`{pattern}`".replace("|", "\\|"), screen, shown, _fmt_s(t)])
    _print_table("Regex simulation over 1,086 tensor names (time limit 1 s per suspect pattern)", rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--make"]:  # lint-size: write one file (in a child process)
        _, name, size, path = argv
        Path(path).write_text(next(make for n, _, make in LINT_SIZE if n == name)(int(size)))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="*", metavar="TABLE", help=f"which tables: {', '.join(TABLES)} (default: all)")
    p.add_argument("--runs", type=int, default=7, help="runs per measurement (median is shown)")
    p.add_argument("--ref-runs", type=int, default=3, help="runs of the slow reference reader")
    p.add_argument("-v", "--verbose", action="store_true", help="lint-corpus: list false positives and misses")
    p.add_argument("--size-mb", nargs="+", default=["1", "50"], metavar="MB",
                   help="lint-size: file sizes in MB (default 1 50)")
    p.add_argument("--timeout", type=float, default=120, help="lint-size: seconds before a run is stopped")
    p.add_argument("--baseline", metavar="REV", help="also measure this git revision (e.g. main, 611898a)")
    p.add_argument("--fit-runs", type=int, default=3, help="runs per fit measurement")
    p.add_argument("--items", type=int, nargs="+", default=[250, 500, 1000, 2000, 4000], metavar="N",
                   help="lint-items: -ot item counts (default 250 500 1000 2000 4000)")
    p.add_argument("--item-runs", type=int, default=3, help="lint-items: runs per count")
    p.add_argument("--compile-runs", type=int, default=5, help="compile: runs per plan")
    args = p.parse_args(argv)
    unknown = sorted(set(args.tables) - set(TABLES))
    if unknown:
        p.error(f"unknown table {unknown[0]!r} (choose from {', '.join(TABLES)})")
    for name in args.tables or TABLES:
        TABLES[name](args)
    return 0


# (label in the file name, expert type, file type, shards): a 20-quant repo laid out as Unsloth's
_HUB_QUANTS = [
    ("UD-IQ1_S", "IQ1_S", "IQ1_S", 1), ("UD-IQ1_M", "IQ1_M", "IQ1_M", 1), ("UD-IQ2_XXS", "IQ2_XXS", "IQ2_XXS", 1),
    ("IQ2_XS", "IQ2_XS", "IQ2_XS", 1), ("UD-Q2_K_XL", "Q2_K", "Q2_K", 1), ("Q2_K", "Q2_K", "Q2_K", 1),
    ("IQ3_XXS", "IQ3_XXS", "IQ3_XXS", 1), ("Q3_K_M", "Q3_K", "Q3_K_M", 1), ("UD-Q3_K_XL", "Q3_K", "Q3_K_L", 1),
    ("IQ4_XS", "IQ4_XS", "IQ4_XS", 1), ("IQ4_NL", "IQ4_NL", "IQ4_NL", 1), ("Q4_0", "Q4_0", "Q4_0", 1),
    ("Q4_1", "Q4_1", "Q4_1", 1), ("Q4_K_S", "Q4_K", "Q4_K_S", 1), ("Q4_K_M", "Q4_K", "Q4_K_M", 2),
    ("UD-Q4_K_XL", "Q4_K", "Q4_K_M", 2), ("Q5_K_M", "Q5_K", "Q5_K_M", 2), ("Q6_K", "Q6_K", "Q6_K", 2),
    ("Q8_0", "Q8_0", "Q8_0", 3), ("BF16", "BF16", "BF16", 5),
]


def bench_hub(args: argparse.Namespace) -> None:
    """Remote models against the Hub emulator (tests/hub_emulator.py) with 50 ms added to every
    HTTP request: header bytes and requests per model (DeepSeek-V3 in 9 shards, GLM-4.5-Air),
    `moeconf inspect`, and `moeconf fit REPO` over a 20-quant repo, cold and warm (whole processes)."""
    import dataclasses
    import math
    import os

    from moeconf.fixtures import LAYOUTS, write_layout
    from moeconf.fixtures.layouts import tensors
    from tests.hub_emulator import Hub, Repo

    tmp = Path(tempfile.mkdtemp(prefix="moeconf-bench-hub-"))
    print(f"\nwriting sparse GGUFs with real vocabularies under {tmp} ...", file=sys.stderr)
    ds = LAYOUTS["deepseek-v3"]
    ds_files = write_layout(ds, tmp / "ds" / "DeepSeek-V3-0324-Q4_K_M.gguf",
                            split_max_tensors=math.ceil(len(tensors(ds)) / 9)) if (tmp / "ds").mkdir() is None else []
    air = LAYOUTS["glm-4.5-air"]
    air_files: dict[str, Path] = {}
    for label, et, ft, shards in _HUB_QUANTS:
        folder = tmp / "air" / (label if shards > 1 else "")
        folder.mkdir(parents=True, exist_ok=True)
        per = math.ceil(len(tensors(air)) / shards) if shards > 1 else 0
        for p in write_layout(dataclasses.replace(air, expert_type=et, file_type=ft, attn_type="Q8_0"),
                              folder / f"GLM-4.5-Air-{label}.gguf", split_max_tensors=per):
            air_files[f"{label}/{p.name}" if shards > 1 else p.name] = p
    hub = Hub(latency=0.05).start()
    hub.repos["unsloth/DeepSeek-V3-0324-GGUF"] = Repo({f"Q4_K_M/{p.name}": p for p in ds_files})
    hub.repos["unsloth/GLM-4.5-Air-GGUF"] = Repo(air_files)
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "LLAMA_CACHE": str(tmp / "hf-empty"), "HF_HOME": str(tmp / "hfh")}
    for var in ("HF_HUB_OFFLINE", "MODEL_ENDPOINT", "HF_TOKEN"):
        env.pop(var, None)

    def run(argv: list[str], cache: str) -> tuple[float, int, int, str]:
        n, sent = len(hub.log), hub.sent
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "moeconf", *argv], cwd=REPO, capture_output=True, text=True,
                           env={**env, "MOECONF_CACHE_DIR": str(tmp / cache)}, timeout=600)
        wall = time.perf_counter() - t
        if r.returncode not in (0, 1):
            raise SystemExit(f"moeconf {' '.join(argv)} failed: {r.stderr}")
        return wall, len(hub.log) - n, hub.sent - sent, r.stdout

    runs = max(1, min(args.fit_runs, 5))

    def cold_warm(argv: list[str], name: str
                  ) -> tuple[list[float], list[float], int, int, int, list[tuple[str, str, str]]]:
        """Median inputs: `runs` cold runs (each with an empty cache) and `runs` warm ones."""
        colds, warms, log = [], [], []
        hops = sent = warm_hops = 0
        for i in range(runs):
            n0 = len(hub.log)
            wall, hops, sent, _ = run(argv, f"{name}-{i}")
            log = hub.log[n0:]
            colds.append(wall)
        for _ in range(runs):
            wall, warm_hops, _, _ = run(argv, f"{name}-0")
            warms.append(wall)
        return colds, warms, hops, sent, warm_hops, log

    rows = [["model", "shards", "header MiB read", "range requests", "max per shard", "HTTP hops", "file GiB",
             "inspect cold", "inspect warm"]]
    for spec, files in (("unsloth/DeepSeek-V3-0324-GGUF:Q4_K_M", ds_files),
                        ("unsloth/GLM-4.5-Air-GGUF:Q4_K_M",
                         [air_files[k] for k in sorted(air_files) if "Q4_K_M/" in k])):
        colds, warms, hops, sent, warm_hops, log = cold_warm(["inspect", spec],
                                                             f"c-{spec.split('/')[1].split(':')[0]}")
        per_file: dict[str, int] = {}
        for _m, p, r in log:
            if r and ("/resolve/" in p or not r.startswith("bytes=0-")):
                per_file[p.rsplit("/", 1)[-1]] = per_file.get(p.rsplit("/", 1)[-1], 0) + 1
        size = sum(os.path.getsize(f) for f in files)
        rows.append([spec, str(len(files)), f"{sent / 2**20:.1f}", str(sum(per_file.values())),
                     str(max(per_file.values())), f"{hops} (warm {warm_hops})", f"{size / 2**30:.0f}",
                     _fmt_s(statistics.median(colds)), _fmt_s(statistics.median(warms))])
    _print_table(f"Remote headers (Hub emulator, 50 ms per HTTP request; a request to resolve/ is redirected: 2 hops; "
                 f"median of {runs} whole processes)", rows)
    fit_argv = ["fit", "unsloth/GLM-4.5-Air-GGUF", "--gpu", "24GiB", "--ram", "128GiB", "-c", "32768"]
    colds, warms, hops, sent, warm_hops, _ = cold_warm(fit_argv, "c-table")
    _, _, _, out = run(fit_argv, "c-table-0")
    fits = sum(1 for line in out.splitlines() if "  yes  " in line)
    rows = [["repo", "quants (files)", "fit", "header MiB read", "HTTP hops", "wall"],
            ["unsloth/GLM-4.5-Air-GGUF", f"{len(_HUB_QUANTS)} ({len(air_files)})", f"{fits} fit", f"{sent / 2**20:.1f}",
             str(hops), f"cold {_fmt_s(statistics.median(colds))}"],
            ["", "", "", "0.0", str(warm_hops), f"warm {_fmt_s(statistics.median(warms))}"]]
    _print_table(f"`moeconf fit REPO --gpu 24GiB --ram 128GiB -c 32768`: the quant table (median of {runs} whole "
                 "processes)", rows)
    hub.stop()
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


TABLES: dict[str, Callable[[argparse.Namespace], None]] = {
    "inventory": lambda a: bench_inventory(a.runs, a.ref_runs),
    "ot-length": bench_ot_length,
    "lint-corpus": bench_lint_corpus,
    "lint-mutants": bench_lint_mutants,
    "lint-size": bench_lint_size,
    "cli": bench_cli,
    "lint-items": bench_lint_items,
    "compile": bench_compile,
    "fit": bench_fit,
    "regex": bench_regex,
    "hub": bench_hub,
}


if __name__ == "__main__":
    sys.exit(main())
