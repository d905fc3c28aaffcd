"""Render the fit head-to-head table for docs/benchmarks.md from the engine suite's results:
`MOECONF_FIT_RESULTS=f.json pytest -m engine tests/engine/test_fit_oracle.py`, then
`python -m tests.engine.fit_table f.json`."""

from __future__ import annotations

import sys
from typing import Any

from tests.engine.shards import load_rows


def main(path: str) -> int:
    rows: list[Any] = load_rows(path)
    print("| model | budgets (GiB) | flags | llama-server's allocation of moeconf's command (MiB) "
          "| expert GiB on GPUs: moeconf | llama.cpp fit | always-active on CPU, llama.cpp fit (MiB) "
          "| host MiB read per token: moeconf | llama.cpp fit | `-ot` chars: moeconf | llama.cpp fit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        proj = " + ".join(f"{v:,}" for v in r["moeconf_projected_mib"].values())
        print(f"| {r['model']} | {' + '.join(map(str, r['budgets_gib']))} | `{r['flags']}` | {proj} "
              f"| {r['moeconf_expert_gib']:.2f} | {r['llama_fit_expert_gib']:.2f} "
              f"| {r['llama_fit_always_active_on_cpu_mib']:.0f} | {r['moeconf_host_read_mib_per_token']:,.0f} "
              f"| {r['llama_fit_host_read_mib_per_token']:,.0f} | {r['moeconf_ot_chars']} "
              f"| {r['llama_fit_ot_chars']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "fit-results.json"))
