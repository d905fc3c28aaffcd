"""The speed predictor (moeconf/speed.py) against the measured runs of tests/data/speed_runs.json: every
row not set aside within the stated error, the rows set aside too; the constants are the fit on the
non-aside rows (a broken constant or a wrong machine figure breaks the bound); a missing machine figure is
refused by name; the prompt ubatch's work (traffic.Work) by hand on Qwen3-30B-A3B."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import moeconf.speed as sp
from moeconf import load_inventory
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.machine import GPU, Figure, Host, Machine
from moeconf.memory import read_settings
from moeconf.report.speed import speed_report
from moeconf.traffic import traffic
from tests.conftest import EXAMPLES
from tests.speed_runs import Case, Constants, build_all, evaluate, fit, load_runs, machine_of, tool_of


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return build_all(tmp_path_factory.mktemp("speed-layouts"))


def _bound(which: str, kind: str = "") -> float:
    if kind == "cpu-only":
        return sp.CPU_GEN_ERROR
    if which == "pp":
        return sp.PROMPT_ERROR
    # a hybrid token (experts read on the host) carries HOST_GEN_ERROR, as predict() states it
    return max(sp.GEN_ERROR, sp.HOST_GEN_ERROR) if kind == "hybrid" else sp.GEN_ERROR


def _violations(results: list[Any], aside: bool | None = False) -> list[str]:
    out = []
    for r in results:
        if aside is not None and r.aside != aside:
            continue
        for w in ("pp", "tg"):
            e = r.err(w)
            if e is not None and abs(e) > _bound(w, r.kind):
                out.append(f"{r.id} {w} {e:+.0%}")
    return out


def test_every_h200_row_is_predicted(cases: list[Case]) -> None:
    h200 = [r for r in evaluate(cases) if r.id.startswith("h200-")]
    assert len(h200) == 9
    assert all(r.pp_pred is not None and r.tg_pred is not None for r in h200)


def test_every_row_is_predicted_or_says_why(cases: list[Case]) -> None:
    # the harness reads every row of every group; a row without a figure carries the reason
    assert {c.group for c in cases} == {"h200", "pub", "hyb", "cpu"} and len(cases) == len(load_runs())
    for c, r in zip(cases, evaluate(cases), strict=True):
        predicted = r.tg_pred is not None or r.pp_pred is not None
        assert predicted or c.refused, c.id
    why = {c.id: c.refused[0] for c in cases if c.features is None}
    assert "ik_llama.cpp" in why["pub-kimi-k2-iq2_kl-epyc9965-cpu-p512"]
    assert all("AMD GPU" in why[c.id] for c in cases if "rx7900" in c.id)
    # this machine's CPU rows: generation predicted, the prompt refused with its reason
    cpu = [c for c in cases if c.group == "cpu"]
    assert all(c.features is not None and c.refused[0].startswith("prompt: without a GPU") for c in cpu)
    # the NVIDIA published rows whose cards the table has are predicted (figures from the card table)
    assert all(c.features is not None for c in cases if "rtxpro6000-" in c.id or "3xrtx4090" in c.id)
    # the real-routing hybrid prompts (op offload) are refused with their reason, and no generation is given
    # where the row states no host
    hyb = [(c, r) for c, r in zip(cases, evaluate(cases), strict=True) if c.group == "hyb"]
    assert len(hyb) == 5 and all(c.features is not None and c.features.routed_offload for c, _ in hyb)
    assert all(r.pp_pred is None and r.tg_pred is None and "op offload" in c.refused[0] for c, r in hyb)


def test_llama_bench_rows_have_no_server_fixed_cost(cases: list[Case]) -> None:
    c = next(c for c in cases if c.id == "pub-gpt-oss-20b-rtxpro6000-ub2048-d512")
    assert tool_of(c.row) == "llama-bench"
    m = machine_of(c.row)
    bench = sp.predict(c.traffic, m, prompt_tokens=128, tool="llama-bench")
    server = sp.predict(c.traffic, m, prompt_tokens=128)
    assert bench.generation is not None and server.generation is not None
    assert bench.generation.terms["fixed"] == 0 and server.generation.terms["fixed"] == sp.TOKEN_FIXED_S
    assert bench.prompt is not None and server.prompt is not None
    assert server.prompt.seconds - bench.prompt.seconds == pytest.approx(sp.PROMPT_FIXED_S)
    with pytest.raises(ValueError, match="tool is one of"):
        sp.predict(c.traffic, m, tool="llama-cli")


def test_an_amd_gpu_is_refused(cases: list[Case]) -> None:
    c = next(c for c in cases if c.id == "h200-qwen3-30b-gpu-8k")
    m = machine_of(c.row)
    amd = Machine((dataclasses.replace(m.gpus[0], name="AMD Radeon RX 7900 XTX", compute="gfx1100"),), m.host)
    p = sp.predict(c.traffic, amd)
    assert p.generation is None and p.prompt is None and "AMD GPU" in p.refused[0]
    assert sp.predict(c.traffic, m).generation is not None


def test_a_run_without_a_gpu_predicts_generation_from_threads_or_bandwidth(cases: list[Case]) -> None:
    c = next(c for c in cases if c.id == "cpu-granite-3.1-3b-a800m-t2-p512")
    m = machine_of(c.row)
    p = sp.predict(c.traffic, m, tool="llama-bench", threads=1)
    assert p.generation is not None and p.prompt is None and p.refused[0].startswith("prompt: without a GPU")
    assert p.generation.error == sp.CPU_GEN_ERROR and p.generation.terms["fixed"] == 0
    host = c.traffic.reads["CPU"].total
    assert p.generation.seconds == pytest.approx(host / sp.CPU_THREAD_BW)  # one thread binds
    many = sp.predict(c.traffic, m, tool="llama-bench", threads=64)
    assert many.generation is not None  # the host's bandwidth binds
    assert many.generation.seconds == pytest.approx(host / (36.0e9 * sp.HOST_BW_FRACTION))
    # the rows that set CPU_GEN_ERROR were thread-bound: where the bandwidth binds, the unmeasured share
    # of it a host reaches carries the host's error
    assert many.generation.error == max(sp.CPU_GEN_ERROR, sp.HOST_GEN_ERROR) > sp.CPU_GEN_ERROR
    # the threads default to the host's cores; without them (or the bandwidth) the figure is named
    assert sp.predict(c.traffic, m, tool="llama-bench").generation == sp.predict(
        c.traffic, m, tool="llama-bench", threads=2).generation
    bare = Machine((), Host(m.host.memory_bandwidth, None))
    assert sp.predict(c.traffic, bare).missing == ("host: cores",)
    assert sp.predict(c.traffic, Machine((), Host(None, m.host.cores))).missing == ("host: memory_bandwidth",)


def test_rows_not_set_aside_are_within_the_stated_error(cases: list[Case]) -> None:
    assert _violations(evaluate(cases), aside=False) == []


def test_rows_set_aside_are_within_the_stated_error(cases: list[Case]) -> None:
    # never used to set a constant: the held-out check
    results = evaluate(cases)
    assert any(r.aside for r in results)
    assert _violations(results, aside=True) == []


def test_the_constants_are_the_fit_on_the_rows_not_set_aside(cases: list[Case]) -> None:
    k, host = fit([c for c in cases if not c.aside])
    mine = Constants.module()
    for name in ("token_fixed_s", "gpu_bw_fraction", "prompt_fixed_s", "gpu_matrix_fraction", "offload_copy_fraction",
                 "offload_tensor_s", "cpu_thread_bw"):
        assert getattr(mine, name) == pytest.approx(getattr(k, name), rel=0.01), name
    assert host is not None
    recorded = {c.row["machine"]["host"].get("memory_bandwidth_fitted_gbs") for c in cases
                if c.row["machine"]["host"].get("memory_bandwidth_gbs") is None and c.features is not None
                and c.features.host_bytes and c.row["measured"].get("tg_tps")}
    assert len(recorded) == 1 and recorded.pop() == pytest.approx(host / 1e9, rel=0.01)


def test_the_aside_rows_set_no_constant(cases: list[Case]) -> None:
    # moving an aside row's measurement leaves the fit where it is
    train = [c for c in cases if not c.aside]
    moved = [dataclasses.replace(c, row={**c.row, "measured": {"pp_tps": 1.0, "tg_tps": 1.0}}) if c.aside else c
             for c in cases]
    assert fit([c for c in moved if not c.aside]) == fit(train)
    # and a fitted row's does move it (the check can fail)
    first = next(c for c in train if c.features is not None)
    shifted = [dataclasses.replace(c, row={**c.row, "measured": {"pp_tps": 1.0, "tg_tps": 1.0}}) if c is first else c
               for c in train]
    assert fit(shifted) != fit(train)


@pytest.mark.parametrize("name, factor", [("GPU_MATRIX_FRACTION", 2.0), ("TOKEN_FIXED_S", 2.0),
                                          ("OFFLOAD_TENSOR_S", 3.0), ("GPU_BW_FRACTION", 3.0),
                                          ("CPU_THREAD_BW", 2.0)])
def test_a_broken_constant_breaks_the_bound(cases: list[Case], monkeypatch: pytest.MonkeyPatch, name: str,
                                            factor: float) -> None:
    monkeypatch.setattr(sp, name, getattr(sp, name) * factor)
    assert _violations(evaluate(cases), aside=None) != []


def test_a_wrong_machine_figure_breaks_the_bound(cases: list[Case], tmp_path: Path) -> None:
    # the H200's dense FP16 rate given as its FP8 sparsity figure (3,958 TFLOPS): prompts come out far too fast
    rows = [json.loads(json.dumps(c.row)) for c in cases if c.id.startswith("h200-")]
    for r in rows:
        r["machine"]["gpus"][0]["matrix_tflops"] = 3958
    wrong = build_all(tmp_path, rows)
    assert any(r.err("pp") is not None and r.err("pp") > sp.PROMPT_ERROR for r in evaluate(wrong))  # type: ignore[operator]


def test_a_missing_machine_figure_is_refused_by_name(cases: list[Case]) -> None:
    c = next(c for c in cases if c.id == "h200-qwen3-30b-exps-cpu")
    m = machine_of(c.row, host_bandwidth=None)
    p = sp.predict(c.traffic, m, routing="same-experts")
    assert p.generation is None and p.prompt is None
    assert p.missing == ("host: memory_bandwidth",)
    no_rate = Machine((dataclasses.replace(m.gpus[0], matrix_flops=None),), Host(Figure(45e9, "test"), None))
    p = sp.predict(c.traffic, no_rate, routing="same-experts")
    assert p.generation is None and p.missing == ("CUDA0: matrix_flops",)
    none = sp.predict(c.traffic, Machine((), Host(Figure(45e9, "test"), None)))
    assert none.missing == ("CUDA0: the card (memory_bandwidth, pcie_bandwidth, matrix_flops)",)
    js, text = speed_report(none)
    assert js["generation"] is None and "not predicted" in text and "CUDA0" in text


def test_all_on_the_gpu_needs_no_host_figure(cases: list[Case]) -> None:
    c = next(c for c in cases if c.id == "h200-qwen3-30b-gpu-8k")
    p = sp.predict(c.traffic, machine_of(c.row, host_bandwidth=None))
    assert p.missing == () and p.generation is not None and p.prompt is not None


def test_real_routing_with_op_offload_gives_no_prompt_figure(cases: list[Case]) -> None:
    c = next(c for c in cases if c.id == "h200-qwen3-30b-exps-cpu")
    m = machine_of(c.row, host_bandwidth=44.8e9)
    p = sp.predict(c.traffic, m)  # uniform routing: the copy rate of full copies is not measured
    assert p.generation is not None and p.prompt is None
    assert any("op offload" in r for r in p.refused)
    assert sp.predict(c.traffic, m, routing="same-experts").prompt is not None


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    # every row as the copy analysis reads it (tests/speed_runs.as_analysed: the Max-Q card's figures, and
    # llama-bench's `--no-op-offload 0`, its default, left out)
    from tests.speed_runs import as_analysed, build

    folder = tmp_path_factory.mktemp("speed-analysed")
    return [build(as_analysed(r), folder) for r in load_runs()]


def test_real_routing_copies_less_than_uniform_routing_expects(analysed: list[Case]) -> None:
    # constant-free: on the RTX 3090 (PCIe 4.0 x16 at most) at -ub 256 and 512, uniform routing's expected
    # copy (every expert of gpt-oss-120b's 25-26 host layers, 1 - (1 - 4/128)^T) at the full link takes
    # longer than the whole measured prompt: real routing copies fewer experts (docs/speed.md, "Limits")
    from tests.speed_runs import real_routing_copy

    real = {c.id: c for c in analysed if real_routing_copy(c)}
    assert len(real) == 6  # the DeepSeek-V3.2 row and the five hyb- rows
    for rid in ("hyb-gpt-oss-120b-f16-rtx3090-ub0256-ncmoe25", "hyb-gpt-oss-120b-f16-rtx3090-ub0512-ncmoe26"):
        c = real[rid]
        assert c.features is not None
        assert c.features.offload_s > c.row["prompt_tokens"] / c.row["measured"]["pp_tps"]


def test_real_routing_op_offload_is_refused_because_no_model_meets_an_error(
        analysed: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    # the evidence behind the refusal (docs/speed.md, "Limits"). With it lifted at the module's constants (the
    # copy rate of the zero-weight H200 runs), every real-routing prompt comes out 75 % too slow or worse
    from tests.speed_runs import copy_fit, real_routing_copy

    real = [c for c in analysed if real_routing_copy(c)]
    assert all(any("op offload" in w for w in c.refused) for c in real)
    monkeypatch.setattr(sp, "OFFLOAD_MEASURED_ROUTINGS", ("same-experts", "uniform"))
    lifted = evaluate([dataclasses.replace(c, refused=()) for c in real])
    assert all(e is not None and e < -0.74 for r in lifted for e in (r.err("pp"),))
    # the copy model with the real-routing copy at its own share of the link, fitted with the other prompt
    # constants: that share comes out above the link (impossible), a fitted row is more than 100 % off and an
    # aside row beyond the stated prompt error: no error to state, so the refusal stays
    k = copy_fit(analysed)
    assert k.real_fraction > 1.0
    by_id = {c.id: c for c in analysed}
    fitted = [abs(e) for rid, (aside, e) in k.errors.items() if not aside and real_routing_copy(by_id[rid])]
    aside = [abs(e) for rid, (a, e) in k.errors.items() if a and real_routing_copy(by_id[rid])]
    assert len(fitted) == 4 and len(aside) == 2
    assert max(fitted) > 1.0 and max(aside) > sp.PROMPT_ERROR
    # docs/speed.md ("Limits") quotes this fit and these rows as `benchmarks/speed_accuracy.py hybrid` prints them
    text = " ".join((DOCS / "speed.md").read_text().split())
    assert (f"fixed {k.prompt_fixed_s:.3g} s, matrix share {k.matrix_fraction:.3g}, same-experts copy "
            f"{k.same_fraction:.3g} x the link, real-routing copy {k.real_fraction:.3g} x the link") in text
    assert f"{k.tensor_s * 1e3:.3g} ms per weight copied" in text
    e = {rid.split("-ub")[-1].split("-")[0].lstrip("0") if "hyb-" in rid else "deepseek": f"{err * 100:+.0f} %"
         for rid, (_, err) in k.errors.items() if real_routing_copy(by_id[rid])}
    assert (f"DeepSeek {e['deepseek']}, 3090 `-ub` 256 {e['256']}, 2048 {e['2048']}, 4096 {e['4096']}; aside: "
            f"`-ub` 512 {e['512']}, 8192 {e['8192']}") in text
    for rid in ("hyb-gpt-oss-120b-f16-rtx3090-ub0256-ncmoe25", "hyb-gpt-oss-120b-f16-rtx3090-ub0512-ncmoe26"):
        c = by_id[rid]
        assert c.features is not None
        measured = c.row["prompt_tokens"] / c.row["measured"]["pp_tps"]
        assert f"{c.features.offload_s:.1f} s" in text and f"{measured:.1f} s" in text


def test_printed_digits_follow_the_error() -> None:
    assert sp.rounded(14.93, 0.30) == "15"
    assert sp.rounded(6176.4, 0.10) == "6,200"
    assert sp.rounded(6176.4, 0.05) == "6,200"  # +-309: the hundreds are the last digit that means something
    assert sp.rounded(6176.4, 0.01) == "6,180"
    assert sp.rounded(933, 0.30) == "900"
    assert sp.rounded(0.734, 0.30) == "0.7"
    assert sp.Rate(14.93, 0.25, 0.067, {}).text() == "~15 t/s (+-25%)"


def test_the_h200_rows_keep_the_schema() -> None:
    for r in load_runs():
        assert set(r) >= {"id", "source", "aside", "engine", "model", "command", "prompt_tokens", "depth", "machine",
                          "measured", "notes"}
        assert r["engine"] in ("llama.cpp", "ik_llama.cpp")
        assert set(r["measured"]) == {"pp_tps", "tg_tps"}
        assert set(r["machine"]["host"]) >= {"memory_bandwidth_gbs", "cores", "threads", "cpu"}


# --- the prompt ubatch's work, by hand ------------------------------------------------------------------------
def test_qwen3_30b_prompt_ubatch_work_by_hand() -> None:
    path = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    with open(path) as f:
        data = json.load(f)
    md, tensors = data["metadata"], {t["name"]: t["shape"] for t in data["tensors"]}
    L, k, H = md["block_count"], md["expert_used_count"], md["head_count"]
    dk, dv = md["key_length"], md["value_length"]
    T, depth = 512, 3000
    argv = ["-c", "4096", "-ub", "512"]
    e = engine("llama.cpp")
    tr = traffic(explain(load_inventory(path), e, argv).placement, read_settings(argv, e, {}), depth)

    def params(name: str) -> int:
        s = tensors[name]
        return int(s[0] * s[1])

    attn = sum(params(f"blk.{il}.attn_{w}.weight") for il in range(L) for w in ("q", "k", "v", "output"))
    ffn = [params(f"blk.{il}.ffn_gate_inp.weight") + k * sum(params(f"blk.{il}.ffn_{w}_exps.weight")
                                                             for w in ("gate", "up", "down")) for il in range(L)]
    # every layer's attention projections at the ubatch's T tokens; the FFNs too but the last layer's, which
    # runs on the output row only (one), as does the output matrix
    matrix = 2 * T * attn + 2 * T * sum(ffn[:-1]) + 2 * ffn[-1] + 2 * params("output.weight")
    cells = -(-depth // 256) * 256  # the viewed cells, in multiples of 256
    attention = L * 2 * (dk + dv) * cells * H * T
    w = tr.work["CUDA0"]
    assert (w.matrix, w.attention, w.max_batch) == (matrix, attention, T)
    assert tr.ubatch_cells == cells
    assert "CPU" not in tr.work  # the embedding's GET_ROWS is no matrix product


def test_host_products_below_the_offload_batch_refuse_the_prompt() -> None:
    path = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    argv = ["-c", "4096", "-ub", "16", "-b", "16", "-ot", "exps=CPU"]
    e = engine("llama.cpp")
    tr = traffic(explain(load_inventory(path), e, argv).placement, read_settings(argv, e, {}), 2048)
    assert tr.work["CPU"].max_batch == 16 and tr.work["CPU"].matrix > 0
    m = Machine((GPU("CUDA0", None, Figure(1e12, "t"), Figure(3e10, "t"), Figure(1e14, "t")),),
                Host(Figure(5e10, "t"), None))
    p = sp.predict(tr, m)
    assert p.generation is not None and p.prompt is None
    assert any("batch of 16" in r for r in p.refused)


def test_for_placement_as_fit_and_the_quant_table_use_it() -> None:
    path = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    argv = ["-c", "8192"]
    e = engine("llama.cpp")
    placement = explain(load_inventory(path), e, argv).placement
    m = Machine((GPU("CUDA0", "NVIDIA H200", Figure(4.8e12, "t"), Figure(63e9, "t"), Figure(989e12, "t")),), Host())
    p = sp.for_placement(placement, read_settings(argv, e, {}), m, depth=2048)
    assert p.generation is not None and p.depth == 2048
    assert sp.generation_cell(p) == f"~{sp.rounded(p.generation.tps, sp.GEN_ERROR)} (+-{round(sp.GEN_ERROR * 100)}%)"
    ik = engine("ik_llama.cpp")
    p = sp.for_placement(explain(load_inventory(path), ik, argv).placement, read_settings(argv, ik, {}), m)
    assert p.generation is None and "llama.cpp only" in p.refused[0] and sp.generation_cell(p) == "-"


# --- the docs' table and example are the commands' output ----------------------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_benchmarks_page_holds_the_accuracy_table(cases: list[Case]) -> None:
    from benchmarks.speed_accuracy import refusals, table

    text = (DOCS / "benchmarks.md").read_text()
    assert table(evaluate(cases), refusals(cases)) in text
    assert f"+-{round(sp.PROMPT_ERROR * 100)} % (prompt) and\n+-{round(sp.GEN_ERROR * 100)} % (generation)" in text


def test_the_speed_page_example_is_the_output(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    from moeconf.cli import main

    text = (DOCS / "speed.md").read_text()
    section = text[text.index("## Predicted speed"):]
    command = section.split("```sh\n", 1)[1].split("\n```", 1)[0]
    shown = section.split("```\n...\n", 1)[1].split("```", 1)[0]
    words = shlex.split(command)
    assert words[:2] == ["moeconf", "explain"]
    monkeypatch.chdir(DOCS.parent)
    assert main(words[1:]) == 0
    out = capsys.readouterr().out
    assert out[out.index("speed (predicted)"):] == shown


# --- explain --speed ------------------------------------------------------------------------------------------
def test_explain_speed_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    from moeconf.cli import main

    path = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    argv = ["--", "llama-server", "-c", "8192"]
    assert main(["explain", path, *argv]) == 0
    assert "speed" not in capsys.readouterr().out  # only when asked
    assert main(["explain", path, "--speed", "--no-detect", *argv]) == 0
    out = capsys.readouterr().out
    assert "traffic (MiB) per generated token" in out  # --speed implies --traffic
    assert ("speed: not predicted: the machine description lacks CUDA0: memory_bandwidth, CUDA0: pcie_bandwidth, "
            "CUDA0: matrix_flops") in out
    assert main(["explain", path, "--json", "--no-detect", "--gpu-bandwidth", "4800GB/s", "--pcie", "5x16",
                 "--gpu-tflops", "989", "--depth", "2048", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    s = data["speed"]
    assert s["missing"] == [] and s["depth"] == 2048 and s["prompt_tokens"] == 2048 and s["routing"] == "uniform"
    assert s["generation"]["error"] == sp.GEN_ERROR and s["prompt"]["error"] == sp.PROMPT_ERROR
    assert s["generation"]["tps"] == float(sp.rounded(1 / s["generation"]["seconds"], sp.GEN_ERROR).replace(",", ""))
    assert "speed" not in data["traffic"] and data["traffic"]["prompt"]["work"]["CUDA0"]["matrix_flops"] > 0


@pytest.mark.parametrize("flags, message", [
    (["--gpu-bandwidth", "fast"], "--gpu-bandwidth: 'fast' is not a bandwidth"),
    (["--gpu-model", "RTX9999"], "--gpu-model: 'RTX9999' is not in moeconf's card table"),
])
def test_explain_speed_machine_bad_values(capsys: pytest.CaptureFixture[str], flags: list[str], message: str) -> None:
    from moeconf.cli import main

    path = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    assert main(["explain", path, "--no-detect", *flags, "--", "-c", "4096"]) == 2
    assert message in capsys.readouterr().err


def test_explain_speed_where_no_traffic_is_modelled(capsys: pytest.CaptureFixture[str]) -> None:
    from moeconf.cli import main

    path = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    assert main(["explain", path, "--engine", "ik_llama.cpp", "--speed", "--", "-c", "4096"]) == 0
    assert "speed: not predicted: no traffic" in capsys.readouterr().out


def test_the_quant_table_column_of_predicted_generation() -> None:
    from moeconf.fitquants import QuantRow, QuantTable, predicted_generation, render_table
    from moeconf.hub.ref import RemoteRef

    path = str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")
    inv = load_inventory(path)
    ref = RemoteRef(repo="Qwen/Qwen3-30B-A3B-GGUF", tag="Q4_K_M")
    row = QuantRow("Q4_K_M", ref, ("q.gguf",), inv.total_bytes(), ("llama-server", "-hf", ref.display, "-ngl", "999",
                                                                      "-c", "8192"), None, 1, 1)
    m = Machine((GPU("CUDA0", None, Figure(4.8e12, "t"), Figure(63e9, "t"), Figure(989e12, "t")),), Host())
    got = predicted_generation(row, inv, engine("llama.cpp"), m)
    assert got.generation is not None and got.generation[1] == sp.GEN_ERROR
    direct = sp.for_placement(explain(inv, engine("llama.cpp"), ["-c", "8192"]).placement,
                              read_settings(["-c", "8192"], engine("llama.cpp"), {}, binary="llama-server"), m)
    assert direct.generation is not None
    assert got.generation[0] == float(sp.rounded(direct.generation.tps, sp.GEN_ERROR).replace(",", ""))
    assert got.json()["generation"] == {"tps": got.generation[0], "error": sp.GEN_ERROR}
    nofit = QuantRow("Q8_0", ref, ("r.gguf",), 1, None, "too large")
    text = render_table(QuantTable("Qwen/Qwen3-30B-A3B-GGUF", "0" * 40, (got, nofit)))
    assert "generation t/s" in text and f"~{got.generation[0]:,g} (+-{round(sp.GEN_ERROR * 100)}%)" in text
    assert "generation t/s" not in render_table(QuantTable("Qwen/Qwen3-30B-A3B-GGUF", "0" * 40, (row, nofit)))
    # without a machine figure the row stays as it was
    assert predicted_generation(row, inv, engine("llama.cpp"), Machine((), Host())).generation is None
