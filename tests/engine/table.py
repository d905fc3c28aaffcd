"""Print the engine suite's results as the table of docs/engines.md: `python -m tests.engine.table FILE`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from tests.engine.shards import load_rows


@dataclass
class Totals:
    archs: set[str] = field(default_factory=set)
    plans: int = 0
    cmdlines: dict[int, int] = field(default_factory=dict)  # devices -> command lines
    tensors: int = 0
    disagreements: int = 0


def main(path: str) -> int:
    rows: list[Any] = load_rows(path)
    by: dict[tuple[str, str], Totals] = {}
    splits: list[dict[str, object]] = []
    crashes = [c for r in rows if "crashes_after_loading" in r for c in r["crashes_after_loading"]]
    for r in rows:
        if "engine" not in r:
            continue
        agg = by.setdefault((r["engine"], r["package"]), Totals())
        agg.archs.add(r["model"].removeprefix("tiny-"))
        if "rules" in r:
            agg.plans += 1
        else:
            n = int(r.get("devices", 1))
            agg.cmdlines[n] = agg.cmdlines.get(n, 0) + 1
        agg.tensors += int(r.get("tensors", 0))  # the full-size split runs compare layer devices only
        agg.disagreements += int(r["disagreements"])
        if "predicted_split" in r:
            splits.append(r)
    print("| engine | package | architectures | plans checked | command lines explained (one / two devices) "
          "| tensor placements compared | disagreements |")
    print("|---|---|---|---|---|---|---|")
    for (engine, package), a in sorted(by.items()):
        cmd = sum(a.cmdlines.values())
        print(f"| {engine} | {package} | {', '.join(sorted(a.archs))} | {a.plans} | {cmd} ({a.cmdlines.get(1, 0)} / "
              f"{a.cmdlines.get(2, 0)}) | {a.tensors} | {a.disagreements} |")
    if splits:
        layers = sum(len(r["predicted_split"]) for r in splits)  # type: ignore[arg-type]
        full = sum(1 for r in splits if "tensors" not in r)
        bad = sum(int(r["disagreements"]) for r in splits)  # type: ignore[call-overload]
        print(f"\nik_llama.cpp -ts layer splits predicted without its log: {len(splits)} runs ({full} on full-size "
              f"layouts), {layers} layer devices compared, {bad} disagreements")
    if crashes:
        print(f"\n{len(crashes)} ik_llama.cpp run(s) crashed after placing every tensor (placement compared):")
        for c in crashes:
            print(f"- {c['model']}: {' '.join(c['args'])} (exit {c['returncode']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "engine-results.json"))
