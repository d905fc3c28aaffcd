"""Record a layout's figures for tests/graph_oracle.py: `python -m tests.engine.record_graph_oracle
LAYOUT...` writes tests/data/graph_oracle/<LAYOUT>.json, each line's engine figures per device
(weights, KV, compute in MiB) as `llama-fit-params -fitp on` projects them over two RPC servers on
127.0.0.1 (the pinned llama.cpp, built by scripts/build-engines.sh llama)."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.model.load import load_inventory
from tests import graph_oracle
from tests.engine import oracle
from tests.engine.harness import MAINLINE, rpc_servers


def figures(path: Path, line: str, eps: Sequence[str]) -> dict[str, list[float]]:
    """The engine's figures for one line, by recorded device name (`host`, `rpc0`, `rpc1`)."""
    a = graph_oracle.args(line, eps)
    proj = oracle.project(path, a, eps[: 2 if "2rpc" in line.split() else 1])
    out: dict[str, list[float]] = {}
    names = {"CPU": "host", **{f"RPC0[{ep}]": f"rpc{i}" for i, ep in enumerate(eps)}}
    for dev in sorted(set(proj.model) | set(proj.compute_exact), key=lambda d: names.get(d, d)):
        if dev not in names:
            raise RuntimeError(f"llama-fit-params listed a device moeconf does not name: {dev}")
        out[names[dev]] = [proj.model.get(dev, 0), proj.context.get(dev, 0), proj.compute_exact.get(dev, 0.0)]
    return out


def _row(path: Path, line: str, eps: Sequence[str]) -> dict[str, object]:
    """One line's figures. Where the engine refuses a quantized V cache (flash attention off: Grok), the
    line keeps the quantized K alone; where it refuses that too, the row records the engine's reason
    (moeconf must refuse the line as well)."""
    try:
        return {"args": line, "engine": figures(path, line, eps)}
    except RuntimeError as e:
        if "-ctv q8_0" not in line or "failed to create llama_context" not in str(e):
            raise
        first = _reason(str(e))
    k_only = line.replace(" -ctv q8_0", "")
    try:
        return {"args": k_only, "engine": figures(path, k_only, eps)}
    except RuntimeError as e:
        if "failed to create llama_context" not in str(e):
            raise
    return {"args": line, "refused": first}


def _reason(text: str) -> str:
    """The engine's own error line (`E llama_init_from_model: ...`)."""
    hits = [x.split(" E ", 1)[1].strip() for x in text.splitlines() if " E " in x]
    return hits[0] if hits else _last_error(text)


def record(keys: Sequence[str], eps: Sequence[str]) -> int:
    """Each layout's file; a layout the engine refuses is reported and left unwritten (exit status 1)."""
    failed = 0
    with tempfile.TemporaryDirectory(prefix="moeconf-graph-oracle-") as tmp:
        for key in keys:
            path = Path(tmp) / f"{key}.gguf"
            write_layout(LAYOUTS[key], path)
            inv = load_inventory(path)
            try:
                rows = [_row(path, line, eps) for line in graph_oracle.lines(inv)]
            except RuntimeError as e:
                print(f"{key}: not recorded: {str(e).splitlines()[0]}\n  {_last_error(str(e))}", file=sys.stderr)
                failed += 1
                continue
            doc = {"model": key, "arch": inv.arch, "source": graph_oracle.ENGINE,
                   "columns": ["weights MiB", "KV MiB", "compute MiB"], "rows": rows}
            out = graph_oracle.DATA / f"{key}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(_text(doc))
            print(f"{out}: {len(rows)} lines")
    return 1 if failed else 0


def _last_error(text: str) -> str:
    hits = [x for x in text.splitlines() if "error" in x.lower() or "failed" in x.lower() or "GGML_ASSERT" in x]
    return hits[-1].strip() if hits else text.splitlines()[-1].strip()


def _text(doc: dict[str, object]) -> str:
    """The file with one line per command line (its figures compact)."""
    head = {k: v for k, v in doc.items() if k != "rows"}
    rows = doc["rows"]
    assert isinstance(rows, list)
    body = ",\n".join("  " + json.dumps(r) for r in rows)
    return json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n"


def main(argv: Sequence[str]) -> int:
    unknown = [k for k in argv if k not in LAYOUTS]
    if not argv or unknown:
        print(f"usage: python -m tests.engine.record_graph_oracle LAYOUT...; unknown: {unknown}", file=sys.stderr)
        return 2
    if not oracle.available():
        print(f"llama-fit-params is not built: run scripts/build-engines.sh llama ({oracle.FIT_PARAMS})",
              file=sys.stderr)
        return 2
    with rpc_servers(MAINLINE, 2) as eps:
        return record(argv, eps)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
