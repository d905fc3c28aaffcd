"""Print the engine suite's results as the README table: `python -m tests.engine.table FILE`."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> int:
    with open(path) as f:
        rows = json.load(f)
    by: dict[tuple[str, str], dict[str, object]] = defaultdict(lambda: {"archs": set(), "plans": 0, "cmdlines": 0,
                                                                       "tensors": 0, "disagreements": 0})
    for r in rows:
        agg = by[(r["engine"], r["package"])]
        agg["archs"].add(r["model"].removeprefix("tiny-"))  # type: ignore[union-attr]
        agg["plans" if "rules" in r else "cmdlines"] += 1  # type: ignore[operator]
        agg["tensors"] += r["tensors"]  # type: ignore[operator]
        agg["disagreements"] += r["disagreements"]  # type: ignore[operator]
    print("| engine | package | architectures | plans checked | command lines explained | tensor placements "
          "compared | disagreements |")
    print("|---|---|---|---|---|---|---|")
    for (engine, package), a in sorted(by.items()):
        archs = ", ".join(sorted(a["archs"]))  # type: ignore[call-overload]
        print(f"| {engine} | {package} | {archs} | {a['plans']} | {a['cmdlines']} | {a['tensors']} "
              f"| {a['disagreements']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "engine-results.json"))
