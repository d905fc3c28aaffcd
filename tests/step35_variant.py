"""Step-3.5-Flash as its published GGUFs have it beyond the layout (moeconf/fixtures/layouts_loaders.py
leaves both out): its 3 MTP blocks (nextn_predict_layers 3: blocks 45..47, full decoder blocks with the
NextN projections, src/models/step35.cpp load_block_mtp) and per-layer SwiGLU limits on the routed
experts (swiglu_clamp_exp) and on the dense FFN and shared expert (swiglu_clamp_shexp), which make the
graph clamp, unfused (src/llama-graph.cpp build_ffn, build_moe_ffn). The limits here are chosen to reach
the dense, the routed and the shared path, not the model's own values.

`python -m tests.step35_variant` records the engine's figures (tests/data/step35_variant_oracle.json) as
tests/engine/record_graph_oracle.py does for the layouts."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from moeconf.fixtures.layouts import LAYOUTS, metadata, tensors
from moeconf.fixtures.layouts_loaders import LoaderLayout
from moeconf.fixtures.writer import header_values, write_gguf
from tests import graph_oracle

ORACLE = Path(__file__).parent / "data" / "step35_variant_oracle.json"
LINES = ("-c 32768 -ngl 999", "2rpc -c 32768 -ngl 999 -ts 1,1", "-c 32768 -ngl 999 -ot exps=CPU")
N_MTP = 3


def write_variant(path: Path) -> Path:
    base = LAYOUTS["step-3.5-flash"]
    assert isinstance(base, LoaderLayout)
    n = base.blocks + N_MTP
    lay = dataclasses.replace(base, blocks=n, nextn=N_MTP, swa=tuple(il % 4 != 0 for il in range(n)),
                              heads_per_block=tuple(64 if il % 4 == 0 else 96 for il in range(n)))
    ts = tensors(lay)
    h = lay.hidden
    for il in range(base.blocks, n):
        p = f"blk.{il}.nextn."
        ts += [(p + "eh_proj.weight", "Q4_K", (2 * h, h)), (p + "enorm.weight", "F32", (h,)),
               (p + "hnorm.weight", "F32", (h,)), (p + "shared_head_norm.weight", "F32", (h,))]
    md = metadata(lay)
    md["step35.swiglu_clamp_exp"] = ("u32[]", [0.0] * (n - 2) + [7.0, 7.0])
    md["step35.swiglu_clamp_shexp"] = ("u32[]", [16.0] + [0.0] * (n - 3) + [16.0, 16.0])
    write_gguf(path, lay.arch, header_values(md, lay.file_type), ts, vocab=lay.vocab)
    return path


def main() -> int:
    import tempfile

    from tests.engine import oracle
    from tests.engine.harness import MAINLINE, rpc_servers
    from tests.engine.record_graph_oracle import _text, figures

    if not oracle.available():
        print(f"llama-fit-params is not built ({oracle.FIT_PARAMS})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="moeconf-step35-variant-") as tmp, rpc_servers(MAINLINE, 2) as eps:
        path = write_variant(Path(tmp) / "step35-variant.gguf")
        rows = [{"args": line, "engine": figures(path, line, eps)} for line in LINES]
    ORACLE.write_text(_text({"model": "step-3.5-flash + 3 MTP blocks + SwiGLU limits", "arch": "step35",
                             "source": graph_oracle.ENGINE, "columns": ["weights MiB", "KV MiB", "compute MiB"],
                             "rows": rows}))
    print(f"{ORACLE}: {len(rows)} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
