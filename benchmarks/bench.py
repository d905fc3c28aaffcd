"""moeconf benchmarks: one command, printed tables.

    python benchmarks/bench.py            # every table
    python benchmarks/bench.py inventory  # header reader vs gguf.GGUFReader, CLI wall time
    python benchmarks/bench.py lint-corpus  # linter precision/recall on real-world launch lines

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
    from moeconf.model.inventory import load_inventory

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

    rows = [["model", "placement", "hand-written", "moeconf", "shorter by", "same placement", "compile"]]
    for model, rules, extra, hand, what in HAND_WRITTEN:
        rl = "[" + ", ".join(f'"{r}"' for r in rules) + "]"
        text = (f'rules = {rl}\n[model]\npath = "{REPO}/examples/models/{model}.manifest.json"\n'
                f'serve_path = "/m.gguf"\n{extra}')
        plan = plan_from_text(text, str(REPO / "bench-plan.toml"))
        t = time.perf_counter()
        c = compile_plan(plan)
        dt = time.perf_counter() - t
        items = [OverrideItem(*it.rsplit("=", 1)) for it in hand.split(",")]
        sim = simulate(c.inventory, items, c.placement.defaults)
        same = all(sim.devices[n] == d for n, d in c.placement.devices.items() if d is not None)
        rows.append([model, what, f"{len(hand)} chars, {len(items)} item{'s' if len(items) > 1 else ''}",
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
    print(f"error-severity findings on launches the engine runs as written: {len(s.errors_on_clean)}")
    if args.verbose:
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
    print(f"error-severity findings on launches the engine runs as written: {len(s.errors_on_clean)}")
    if args.verbose:
        for line in s.false_positives:
            print("FP   " + line)
        for line in s.misses:
            print("MISS " + line)
        for line in s.errors_on_clean:
            print("ERR  " + line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="*", metavar="TABLE", help=f"which tables: {', '.join(TABLES)} (default: all)")
    p.add_argument("--runs", type=int, default=7, help="runs per measurement (median is shown)")
    p.add_argument("--ref-runs", type=int, default=3, help="runs of the slow reference reader")
    p.add_argument("-v", "--verbose", action="store_true", help="lint-corpus: list false positives and misses")
    args = p.parse_args(argv)
    unknown = sorted(set(args.tables) - set(TABLES))
    if unknown:
        p.error(f"unknown table {unknown[0]!r} (choose from {', '.join(TABLES)})")
    for name in args.tables or TABLES:
        TABLES[name](args)
    return 0


TABLES: dict[str, Callable[[argparse.Namespace], None]] = {
    "inventory": lambda a: bench_inventory(a.runs, a.ref_runs),
    "ot-length": bench_ot_length,
    "lint-corpus": bench_lint_corpus,
    "lint-mutants": bench_lint_mutants,
}


if __name__ == "__main__":
    sys.exit(main())
