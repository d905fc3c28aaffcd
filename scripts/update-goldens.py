#!/usr/bin/env python3
"""Regenerate tests/golden/ from the shipped example plans, after an intended output change:
`python scripts/update-goldens.py` from the checkout, then review `git diff tests/golden`.

The golden test only reads these files; it never writes them, so a test run cannot accept its
own output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_cli_compile import CASES, GOLDEN  # noqa: E402


def main() -> int:
    changed = 0
    for plan, target in CASES:
        r = subprocess.run([sys.executable, "-m", "moeconf", "compile", f"examples/plans/{plan.name}",
                            "--target", target, "-q"], capture_output=True, text=True, cwd=REPO, timeout=300)
        if r.returncode != 0:
            print(f"{plan.name} --target {target}: exit {r.returncode}\n{r.stderr}", file=sys.stderr)
            return 1
        golden = GOLDEN / f"{plan.stem}.{target}.txt"
        if not golden.exists() or golden.read_text() != r.stdout:
            golden.write_text(r.stdout)
            changed += 1
            print(f"wrote {golden.relative_to(REPO)}")
    print(f"{changed} of {len(CASES)} golden files changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
