"""The engine suite's table scripts (.ci/run runs them after the engine suite): they import and render
on a small results file, so a renamed moeconf name fails here, in the default suite, not after a
30-minute engine run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_the_memory_table_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.engine.memory_table import main

    results = tmp_path / "memory-results.json"
    results.write_text(json.dumps([{"model": "qwen3-30b-a3b", "args": "-c 4096", "device": "CUDA0",
                                    "weights": [100.0, 100.0], "kv": [8.0, 8.0], "compute": [300.0, 310.0]}]))
    assert main(str(results)) == 0
    out = capsys.readouterr().out
    assert "| qwen3-30b-a3b | 1 | 1 | 0.00 | 0.00 | 10.0 | 1 of 1 |" in out
    from moeconf.memory import support

    refused = out[out.index("Refused (memory not modelled"):]
    unmodelled = [a for a in support.routed_expert_archs() if a not in support.MODELLED]
    not_text = support.NOT_APPLICABLE
    # a diffusion model is never modelled: listed as not applicable, not as refused
    assert unmodelled and "`llada-moe`: memory" not in refused
    assert all(f"`{a}`: memory is not modelled" in refused for a in unmodelled if a not in not_text)
    not_applicable = out[out.index("Not applicable"):]
    assert all(f"`{a}`" in not_applicable for a in unmodelled if a in not_text) and "`llada-moe`" in not_applicable
    assert "`grovemoe`" not in refused and "`qwen3moe`" not in refused  # modelled: not listed


def test_the_tables_read_every_workers_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """.ci/run runs the engine suite over pytest-xdist workers: each writes its own shard of a results
    file and the table reads them all (a lost shard would drop rows from docs' tables in silence)."""
    from tests.engine import shards
    from tests.engine.memory_table import main

    results = tmp_path / "memory-results.json"
    row = {"model": "qwen3-30b-a3b", "args": "-c 4096", "device": "CUDA0",
           "weights": [100.0, 100.0], "kv": [8.0, 8.0], "compute": [300.0, 310.0]}
    for worker, model in (("gw0", "qwen3-30b-a3b"), ("gw1", "glm-4.5-air")):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        shards.shard_path(results).write_text(json.dumps([{**row, "model": model}]))
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert shards.shard_path(results) == results and not results.exists()
    assert [r["model"] for r in shards.load_rows(results)] == ["qwen3-30b-a3b", "glm-4.5-air"]  # type: ignore[index]
    assert main(str(results)) == 0
    out = capsys.readouterr().out
    assert "| qwen3-30b-a3b | 1 | 1 |" in out and "| glm-4.5-air | 1 | 1 |" in out
    # a new run starts from no shard an earlier run left (the file itself stays: a plain run overwrites it)
    shards.clear(results)
    assert list(tmp_path.iterdir()) == []
    results.write_text("[]")
    shards.clear(results)
    assert list(tmp_path.iterdir()) == [results]
    results.unlink()
    with pytest.raises(FileNotFoundError, match="no results"):
        shards.load_rows(results)
