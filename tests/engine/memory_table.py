"""Render the memory accuracy table for docs/memory.md from the engine suite's results:
`MOECONF_MEMORY_RESULTS=r.json pytest -m engine tests/engine/test_memory_oracle.py`, then
`python -m tests.engine.memory_table r.json`."""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

from tests.engine.shards import load_rows


def _ok(term: str, device: str, ours: float, theirs: float) -> bool:
    if term == "compute":
        return abs(ours - theirs) <= max(16.0, 0.03 * theirs)
    floors = 2 if device == "host" and term == "weights" else 1
    return 0 <= ours - theirs < floors or abs(ours - theirs) <= 1.0


def main(path: str) -> int:
    rows: list[Any] = load_rows(path)
    by: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        by[r["model"]].append(r)
    print("| model | command lines | device rows | max weights error (MiB) | max KV error (MiB) | "
          "max compute error (MiB) | compute within 3% / 16 MiB |")
    print("|---|---|---|---|---|---|---|")
    total_cases = 0
    for model in sorted(by):
        rs = by[model]
        cases = {r["args"] for r in rs}
        total_cases += len(cases)
        worst = {t: max(abs(r[t][0] - r[t][1]) for r in rs) for t in ("weights", "kv", "compute")}  # type: ignore[index]
        good = {c for c in cases if all(_ok("compute", r["device"], *r["compute"]) for r in rs  # type: ignore[arg-type]
                                        if r["args"] == c)}
        print(f"| {model} | {len(cases)} | {len(rs)} | {worst['weights']:.2f} | {worst['kv']:.2f} | "
              f"{worst['compute']:.1f} | {len(good)} of {len(cases)} |")
    print(f"\n{total_cases} command lines, llama.cpp (llama-cpp-python 0.3.36) `llama-fit-params -fitp on`.")
    # architectures the loader creates routed experts for whose memory is not modelled, with the refusal
    # explain and fit give (moeconf.memory.support.unmodelled_architecture)
    from moeconf.memory import support

    not_text = support.NOT_APPLICABLE
    unmodelled = [a for a in support.routed_expert_archs() if a not in support.MODELLED]
    refused = [a for a in unmodelled if a not in not_text]
    print("\nRefused (memory not modelled; `explain` prints ? with this note, `fit` refuses):\n")
    for arch in refused:
        print(f"- `{arch}`: {support.unmodelled_architecture(arch)}")
    if not refused:
        print("(none)")
    na = [a for a in unmodelled if a in not_text]
    if na:
        print("\nNot applicable (no MoE text model llama-server serves, or a loader that creates no routed experts; "
              "refused the same way, naming why: docs/memory-architectures.md): "
              + ", ".join(f"`{a}`" for a in na))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "memory-results.json"))
