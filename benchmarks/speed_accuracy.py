"""The speed predictor's accuracy on the measured runs (tests/data/speed_runs.json), and the fit of its
constants on the rows not set aside.

    python benchmarks/speed_accuracy.py          # the accuracy table: each row measured, predicted, error;
                                                 # median and worst, the aside rows separately
    python benchmarks/speed_accuracy.py fit      # the constants fitted on the non-aside rows (the lines
                                                 # moeconf/speed.py holds) and each row's leave-one-out error
    python benchmarks/speed_accuracy.py hybrid   # the real-routing op-offload copy: each row's bytes against
                                                 # the link, and the copy model fitted with its own share of
                                                 # the link (why moeconf refuses these prompts)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:,.{max(0, digits - len(str(int(v))))}f}" if v < 100 else f"{v:,.0f}"


def table(results: list, refused: dict[str, str] | None = None) -> str:  # type: ignore[type-arg]
    """Each row measured, predicted and its error; the summaries (median and worst |error|) per group of
    rows (h200, pub, cpu) and kind of command (all-gpu, hybrid, cpu-only), fitted rows and aside rows apart;
    the rows not predicted with the reason."""
    from tests.speed_runs import summary

    lines = ["| run | kind | aside | pp measured | pp predicted | error | tg measured | tg predicted | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ep, eg = r.err("pp"), r.err("tg")
        tg_err = "-" if eg is None else f"{eg:+.0%}"
        lines.append(f"| {r.id} | {r.kind} | {'yes' if r.aside else ''} | {_fmt(r.pp)} | {_fmt(r.pp_pred)} | "
                     f"{'-' if ep is None else f'{ep:+.0%}'} | {_fmt(r.tg)} | {_fmt(r.tg_pred)} | {tg_err} |")
    lines += ["", "| rows | kind | set | prompt: median, worst (rows) | generation: median, worst (rows) |",
              "|---|---|---|---|---|"]
    for group in ("h200", "pub", "hyb", "cpu"):
        for kind in ("all-gpu", "hybrid", "cpu-only"):
            part = [r for r in results if r.group == group and r.kind == kind]
            for aside in (False, True):
                cells = []
                for w in ("pp", "tg"):
                    med, worst, n = summary(part, w, aside)
                    cells.append(f"{med:.0%}, {worst:.0%} ({n})" if n else "-")
                measured = [r for r in part if r.aside == aside]
                if measured and cells == ["-", "-"]:
                    which = "aside" if aside else "fitted"
                    lines.append(f"| {group} | {kind} | {which} | not predicted | not predicted |")
                elif measured:
                    lines.append(f"| {group} | {kind} | {'aside' if aside else 'fitted'} | {cells[0]} | {cells[1]} |")
    lines.append("")
    for aside in (False, True):
        for w, name in (("pp", "prompt"), ("tg", "generation")):
            med, worst, n = summary(results, w, aside)
            if n:
                lines.append(f"{'aside' if aside else 'fitted'} rows, {name}: median {med:.0%}, worst {worst:.0%} "
                             f"({n} rows)")
    if refused:
        lines += ["", "Not predicted:", ""]
        lines += [f"- {rid}: {why}" for rid, why in refused.items()]
    return "\n".join(lines) + "\n"


def refusals(cases: list) -> dict[str, str]:  # type: ignore[type-arg]
    """Each row moeconf gives no figure for (or no prompt figure), with the first reason."""
    return {c.id: c.refused[0] for c in cases if c.refused}


def hybrid(cases: list) -> str:  # type: ignore[type-arg]
    """The real-routing op-offload rows: per row the copy's bytes (uniform routing's expected share of the host
    experts), those bytes at the full PCIe rate against the measured prompt, and CopyFit's constants and errors
    (fitted rows and aside rows apart)."""
    from tests.speed_runs import copy_fit, real_routing_copy

    lines = ["| run | aside | ubatch | prompt | copied per ubatch (GB) | at the full link (s) | measured (s) |",
             "|---|---|---|---|---|---|---|"]
    for c in cases:
        if not real_routing_copy(c):
            continue
        f = c.features
        per_ub = sum(x.weights for x in c.traffic.ubatch_copies) / 1e9
        lines.append(f"| {c.id} | {'yes' if c.aside else ''} | {c.traffic.n_ubatch} | {c.row['prompt_tokens']} | "
                     f"{per_ub:.1f} | {f.offload_s:.1f} | {c.row['prompt_tokens'] / c.row['measured']['pp_tps']:.1f} |")
    k = copy_fit(cases)
    lines += ["", f"copy model fitted: prompt fixed {k.prompt_fixed_s:.3g} s, matrix fraction {k.matrix_fraction:.3g}, "
              f"same-experts copy {k.same_fraction:.3g} x the link, real-routing copy {k.real_fraction:.3g} x the "
              f"link, {k.tensor_s * 1e3:.3g} ms per weight copied", "",
              "| run | kind | aside | prompt error |", "|---|---|---|---|"]
    by_id = {c.id: c for c in cases}
    for rid, (aside, e) in k.errors.items():
        kind = "real routing" if real_routing_copy(by_id[rid]) else "predicted today"
        lines.append(f"| {rid} | {kind} | {'yes' if aside else ''} | {e:+.0%} |")
    lines.append("")
    for aside in (False, True):
        errs = [abs(e) for rid, (a, e) in k.errors.items() if a == aside and real_routing_copy(by_id[rid])]
        if errs:
            which = "aside" if aside else "fitted"
            lines.append(f"real-routing rows, {which}: worst {max(errs):.0%} ({len(errs)} rows)")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    from tests.speed_runs import bound, build_all, evaluate, fit, leave_one_out

    if argv[:1] == ["hybrid"]:
        from tests.speed_runs import as_analysed, build, load_runs

        with tempfile.TemporaryDirectory() as tmp:
            analysed = [build(as_analysed(r), Path(tmp)) for r in load_runs()]
        print(hybrid(analysed))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = build_all(Path(tmp))
    if argv[:1] == ["fit"]:
        train = [c for c in cases if not c.aside]
        k, host = fit(train)
        print(f"TOKEN_FIXED_S = {k.token_fixed_s:.3g}\nGPU_BW_FRACTION = {k.gpu_bw_fraction:.3g}\n"
              f"PROMPT_FIXED_S = {k.prompt_fixed_s:.3g}\nGPU_MATRIX_FRACTION = {k.gpu_matrix_fraction:.3g}\n"
              f"OFFLOAD_COPY_FRACTION = {k.offload_copy_fraction:.3g}\nOFFLOAD_TENSOR_S = {k.offload_tensor_s:.3g}\n"
              f"CPU_THREAD_BW = {k.cpu_thread_bw / 1e9:.3g}e9")
        if host is not None:
            print(f"host rate fitted on the rows that did not record it: {host / 1e9:.3g} GB/s "
                  "(speed_runs.json machine.host.memory_bandwidth_fitted_gbs)")
        loo = leave_one_out(cases)
        for rid, e in loo.items():
            if not e:  # not predicted (speed.md "Limits")
                continue
            print(f"  leave-one-out {rid}: " + ", ".join(f"{w} {v:+.0%}" for w, v in e.items()))
        fitted = evaluate(train, k, host)
        for w, name in (("tg", "GEN_ERROR"), ("pp", "PROMPT_ERROR")):
            worst = bound([e for r in fitted for e in (r.err(w),) if e is not None])
            print(f"{name}: worst of the fitted rows at the fitted constants {worst:.2f} "
                  "(the rule moeconf/speed.py states), worst leave-one-out "
                  f"{bound([e[w] for e in loo.values() if w in e]):.2f} (rounded up to 5 %)")
        print()
        print(table(evaluate(cases, k, host), refusals(cases)))
        return 0
    if argv:
        print(__doc__)
        return 2
    print(table(evaluate(cases), refusals(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
