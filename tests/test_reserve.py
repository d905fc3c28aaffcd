"""The reserve from its parts (moeconf/memory/reserve.py) against the H200 measurements
(tests/data/h200_memory.json, from ../shared/memory-facts.md section 5): moeconf's total (weights + KV
+ compute as recorded with each line, plus the H200's reserve from parts) is at or above the card's
peak on every line, and within 256 MiB of it where compute is replayed exactly."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from moeconf.engines import engine
from moeconf.engines.settings import DEFAULT_RESERVE, MemorySettings, read_settings
from moeconf.memory.reserve import CARDS, Part, card_row, op_pool_bytes, pool_bytes, reserve_for, reserve_parts
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory

MiB = 1 << 20
GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent
DATA = json.loads((ROOT / "tests" / "data" / "h200_memory.json").read_text())
LINES: list[dict[str, Any]] = DATA["lines"]
TOLERANCE = 256 * MiB


@cache
def _inv(layout: str) -> Inventory:
    return load_inventory(ROOT / "examples" / "models" / f"{layout}.manifest.json")


def _settings(line: dict[str, Any]) -> MemorySettings:
    # llama-server: 4 slots, one output row each (engines/settings.py server_outputs)
    return MemorySettings(n_ubatch=line["n_ubatch"], n_batch=max(2048, line["n_ubatch"]), n_outputs=4)


def _problems(parts_of: Callable[[dict[str, Any]], tuple[Part, ...]]) -> list[str]:
    """Every line where total = recorded weights+KV+compute + the parts' sum is under the peak, or
    (compute replayed exactly) more than 256 MiB over it."""
    out = []
    for line in LINES:
        total = line["w_kv_compute_mib"] * MiB + sum(p.size for p in parts_of(line))
        peak = line["peak_mib"] * MiB
        if total < peak:
            out.append(f"{line['layout']} {line['command']}: {total / MiB:.0f} MiB under the peak {line['peak_mib']}")
        elif line["exact"] and total - peak > TOLERANCE:
            out.append(f"{line['layout']} {line['command']}: {(total - peak) / MiB:.0f} MiB over the peak")
    return out


def _h200_parts(line: dict[str, Any]) -> tuple[Part, ...]:
    return reserve_for(DATA["card"], _settings(line), _inv(line["layout"])).parts


def test_other_is_the_largest_exact_residual() -> None:
    """"other" is calibrated: the largest of peak - (weights+KV+compute) - context - cuBLAS - pool
    over the lines whose compute is replayed exactly (here, not hidden in a constant)."""
    residuals = []
    for line in LINES:
        parts = {p.name: p.size for p in _h200_parts(line)}
        known = parts["CUDA context"] + parts["cuBLAS handle"] + parts["cuBLAS workspace"] + parts["CUDA pool"]
        if line["exact"]:
            residuals.append((line["peak_mib"] - line["w_kv_compute_mib"]) * MiB - known)
    assert max(residuals) == parts["other"]
    assert min(residuals) >= 0


def test_data_is_the_record() -> None:
    assert len(LINES) == 9
    assert sum(line["exact"] for line in LINES) == 6  # GLM-4.5-Air's two q8_0 lines and gpt-oss aside
    for line in LINES:
        assert line["exact"] or line["why"]
        assert line["after_load_mib"] < line["peak_mib"]


def test_h200_reserve_is_its_parts() -> None:
    line = LINES[1]
    r = reserve_for("NVIDIA H200", _settings(line), _inv(line["layout"]))
    assert r.basis == "parts"
    assert r.size == sum(p.size for p in r.parts)
    assert [p.name for p in r.parts] == ["CUDA context", "cuBLAS handle", "cuBLAS workspace", "CUDA pool", "other"]
    assert all(p.source for p in r.parts)


def test_total_at_or_above_every_h200_peak_and_within_256_mib_where_exact() -> None:
    assert _problems(_h200_parts) == []


def check_table() -> list[str]:
    """The H200 check as docs/memory.md shows it, one row per line."""
    rows = ["| layout | command | -ub | peak | moeconf w+KV+compute | H200 reserve | moeconf total | total - peak |",
            "|---|---|---|---|---|---|---|---|"]
    for line in LINES:
        r = reserve_for(DATA["card"], _settings(line), _inv(line["layout"]))
        total = line["w_kv_compute_mib"] * MiB + r.size
        margin = (total - line["peak_mib"] * MiB) // MiB
        note = "" if line["exact"] else " (compute an estimate: aside)"
        rows.append(f"| {line['layout']} | {line['command'].replace('|', chr(92) + '|')} | {line['n_ubatch']} | "
                    f"{line['peak_mib']:,} | {line['w_kv_compute_mib']:,} | {r.size // MiB:,} | {total // MiB:,} | "
                    f"{margin:+,}{note} |")
    return rows


def test_docs_show_the_check() -> None:
    for page in ("memory.md", "benchmarks.md"):
        lines = (ROOT / "docs" / page).read_text().splitlines()
        missing = [row for row in check_table() if row not in lines]
        assert not missing, f"docs/{page}'s H200 reserve table differs; rows now:\n" + "\n".join(check_table())
    doc = (ROOT / "docs" / "memory.md").read_text()
    # the ranges the text quotes: the H200's reserve, and the parts with the largest reported context
    h200 = [reserve_for("NVIDIA H200", _settings(line), _inv(line["layout"])).size // MiB for line in LINES]
    unknown = [sum(p.size for p in reserve_for(None, _settings(line), _inv(line["layout"])).parts) // MiB
               for line in LINES]
    assert f"({min(h200)}-{max(h200)} MiB on the lines below)" in " ".join(doc.split())
    assert f"the parts come to {min(unknown)}-{max(unknown)} MiB" in " ".join(doc.split())
    assert 1024 - max(unknown) >= 200


@pytest.mark.parametrize("name,delta", [("CUDA context", -300), ("cuBLAS handle", -68), ("other", -80),
                                        ("CUDA context", +300)])
def test_a_wrong_part_fails_the_check(name: str, delta: int) -> None:
    def wrong(line: dict[str, Any]) -> tuple[Part, ...]:
        return tuple(dataclasses.replace(p, size=p.size + delta * MiB) if p.name == name else p
                     for p in _h200_parts(line))
    assert _problems(wrong)


def test_pool_by_hand() -> None:
    """Qwen3-30B-A3B at -ub 512: the largest op is an expert gate/up (ne0 2048, 8 experts used):
    q8_1 activations 512*8*2048*144/128 = 9,437,184 B, 512 spare q8_1 blocks of 144 B = 73,728,
    id maps 2*4096*4 + 129*4 = 33,284, fixup 132 SMs x 64 KiB = 8,650,752: 18,194,948 B -> 18 MiB.
    At -ub 2048 the activations are 37,748,736 B: 46,506,500 B -> 46 MiB (2 MiB steps)."""
    inv = _inv("qwen3-30b-a3b")
    assert pool_bytes(inv, MemorySettings(n_ubatch=512), 132) == 18 * MiB
    assert pool_bytes(inv, MemorySettings(n_ubatch=2048, n_batch=2048), 132) == 46 * MiB
    glm = _inv("glm-4.5-air")
    assert [pool_bytes(glm, MemorySettings(n_ubatch=u, n_batch=2048), 132) // MiB for u in (512, 2048)] == [28, 82]
    # an F16 weight goes through cuBLAS: its f16 input and output copies (gpt-oss's attention)
    gpt = _inv("gpt-oss-120b")
    q = gpt.by_name["blk.0.attn_q.weight"]
    assert q.type == "F16"
    assert op_pool_bytes(q, 512, 4, 132) == 512 * (q.shape[0] + q.shape[1]) * 2
    # an F32 weight (the router) needs none
    assert op_pool_bytes(inv.by_name["blk.0.ffn_gate_inp.weight"], 512, 8, 132) == 0


def test_given_reserve_overrides_everything() -> None:
    line = LINES[0]
    for card in ("NVIDIA H200", None, "NVIDIA GeForce RTX 4060 Ti"):
        r = reserve_for(card, _settings(line), _inv(line["layout"]), given=300 * MiB)
        assert (r.size, r.basis) == (300 * MiB, "given")


def test_unknown_card_keeps_the_default_margin() -> None:
    line = LINES[1]
    for card in (None, "", "NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"):
        r = reserve_for(card, _settings(line), _inv(line["layout"]))
        assert r.basis == "default"
        assert r.size == DEFAULT_RESERVE  # the parts (largest context 555 MiB + ...) stay under 1,024
        assert next(p for p in r.parts if p.name == "CUDA context").size == 555 * MiB
        assert sum(p.size for p in r.parts) < DEFAULT_RESERVE


def test_unknown_card_above_the_default_when_the_parts_are() -> None:
    """DeepSeek-V3 at -ub 8192: the pool alone (8192*8*7168*144/128 B of activations, 504 MiB) takes
    the parts over 1,024 MiB, and the default margin follows them."""
    inv = _inv("deepseek-v3")
    s = MemorySettings(n_ubatch=8192, n_batch=8192)
    r = reserve_for(None, s, inv)
    assert r.basis == "default"
    assert r.size == sum(p.size for p in r.parts) > DEFAULT_RESERVE
    assert next(p for p in r.parts if p.name == "CUDA pool").size >= 8192 * 8 * 7168 * 144 // 128


def test_cards_with_a_reported_context_only_keep_the_default() -> None:
    line = LINES[1]
    for c in CARDS:
        r = reserve_for(c.name, _settings(line), _inv(line["layout"]))
        assert r.basis == ("parts" if c.measured else "default")
        assert next(p for p in r.parts if p.name == "CUDA context").size == c.context
    assert [c.name for c in CARDS if c.measured] == ["NVIDIA H200"]


def test_card_names_as_nvidia_smi_prints_them() -> None:
    assert card_row("NVIDIA H200") is not None and card_row("nvidia h200 nvl") is card_row("NVIDIA H200")
    assert card_row("NVIDIA RTX PRO 6000 Blackwell Workstation Edition") is CARDS[1]
    assert card_row("NVIDIA GeForce RTX 4060 Ti") is CARDS[2]
    assert card_row("NVIDIA GeForce RTX 4060") is None
    assert card_row("NVIDIA GH200 480GB") is None  # Grace Hopper: not the card measured
    assert card_row(None) is None


def test_volta_and_types_without_mmq_go_through_cublas() -> None:
    """On a V100 at 64 rows or more every quantized weight is dequantized to f16 in the pool: for
    Qwen3-30B-A3B with every row of the ubatch output (no binary named) the output weight (Q6_K,
    2048 x 151936) is the largest op; llama-server's 4 output rows keep it on MMQ."""
    inv = _inv("qwen3-30b-a3b")
    out = inv.by_name["output.weight"]
    k, n = out.shape
    s = MemorySettings(n_ubatch=512)
    pool = next(p for p in reserve_parts("Tesla V100-SXM2-32GB", s, inv) if p.name == "CUDA pool").size
    assert pool == -(-(k * n * 2 + 512 * k * 2 + 512 * n * 2) // (2 * MiB)) * 2 * MiB == 744 * MiB  # docs/memory.md
    below = next(p for p in reserve_parts("Tesla V100-SXM2-32GB", MemorySettings(n_ubatch=32), inv)
                 if p.name == "CUDA pool").size
    assert below == pool_bytes(inv, MemorySettings(n_ubatch=32), 192) < pool
    server = next(p for p in reserve_parts("Tesla V100-SXM2-32GB", MemorySettings(n_ubatch=512, n_outputs=4), inv)
                  if p.name == "CUDA pool").size
    assert below < server < 100 * MiB
    # an expert tensor of a type without MMQ (IQ1_M): the sorted rows, then one expert dequantized
    gate = dataclasses.replace(inv.by_name["blk.0.ffn_gate_exps.weight"], type="IQ1_M")
    k, n, _ = gate.shape
    r = 512 * 8
    assert op_pool_bytes(gate, 512, 8, 132) == 2 * r * 4 + r * k * 4 + r * n * 4 + k * n * 2 + 512 * (k + n) * 2


def test_workspace_by_compute_capability() -> None:
    line = LINES[1]
    ws = {c.name: next(p for p in reserve_parts(c.name, _settings(line), _inv(line["layout"]))
                       if p.name == "cuBLAS workspace").size for c in CARDS}
    assert ws == {"NVIDIA H200": 32 * MiB, "NVIDIA RTX PRO 6000 Blackwell": 32 * MiB,
                  "NVIDIA GeForce RTX 4060 Ti": 4 * MiB}


def test_explain_takes_the_cards_reserve_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's reserve: the H200's parts where --gpu-model names it, the parts with the largest
    reported context where they pass the default (DeepSeek-V3's pool at -ub 8192), --reserve over both."""
    from moeconf.cli import main

    qwen = str(ROOT / "examples" / "models" / "qwen3-30b-a3b.manifest.json")
    line = ["--", "llama-server", "-c", "8192"]
    assert main(["explain", qwen, "--json", "--no-detect", "--gpu-model", "H200", *line]) == 0
    data = json.loads(capsys.readouterr().out)
    h200 = reserve_for("NVIDIA H200", read_settings(line[1:], engine("llama.cpp")), _inv("qwen3-30b-a3b"))
    assert h200.basis == "parts" and data["memory"]["CUDA0"]["reserve"] == h200.size < 1024 * MiB
    assert any("the parts measured on the H200" in n for n in data["memory_notes"])
    assert main(["explain", qwen, "--json", "--no-detect", "--gpu-model", "H200", "--reserve", "2GiB", *line]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["CUDA0"]["reserve"] == 2 * GiB
    ds = str(ROOT / "examples" / "models" / "deepseek-v3.manifest.json")
    big = ["--", "llama-server", "-c", "16384", "-ub", "8192", "-b", "8192", "-ot", "exps=CPU"]
    assert main(["explain", ds, "--json", "--no-detect", *big]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory"]["CUDA0"]["reserve"] > 1024 * MiB
    assert any("more than the default 1,024" in n for n in data["memory_notes"])
    assert main(["explain", ds, "--json", "--no-detect", "--", "llama-server", "-c", "16384", "-ot", "exps=CPU"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["CUDA0"]["reserve"] == 1024 * MiB
