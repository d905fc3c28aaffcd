"""Flags the regenerated tables know (the pinned llama-cpp-python 0.3.36 / llama.cpp b11312, and
ik_llama.cpp 0.1.5 against the newest ik code read), on real-looking launch lines: a new flag
parses with its value, a new speculative parameter is classed as specflags classes it, the new
`--n-cpu-ffn` places what the engine's rule places, and flags the pinned parser no longer has
are reported for the builds that lack them only."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import moeconf.engines.specflags as sf
from moeconf.cli import main
from moeconf.engines import engine
from moeconf.engines.argvread import Arg
from moeconf.engines.cmdline import cpu_ffn_pattern, engine_items, parse_invocation
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.conftest import EXAMPLES
from tests.test_lint_reads_line import lint_text

GLM_AIR = str(EXAMPLES / "models" / "glm-4.5-air.manifest.json")  # block 0 dense, blocks 1.. MoE
SPEC_LINE = ("llama-server -m /models/GLM-4.5-Air-Q4_K_M.gguf -ngl 99 -ot exps=CPU --spec-type draft-simple "
             "-md /models/draft.gguf --spec-synth-len 4 --spec-synth-rates 0.9,0.7 -c 16384 --port 8080")


def _words(line: str) -> list[Arg]:
    return [Arg(w) for w in shlex.split(line)]


def test_a_synthetic_acceptance_line_parses_with_every_value_read() -> None:
    inv = parse_invocation(_words(SPEC_LINE), engine("llama.cpp"))
    assert inv.unknown_flags == [] and inv.problems == []
    assert inv.ngl is not None and inv.ngl[1] == 99
    assert [o.value.text for o in inv.ot] == ["exps=CPU"]
    # the values of the new flags are theirs, not words of their own: -c after them is read
    assert read_settings(shlex.split(SPEC_LINE), engine("llama.cpp")).n_ctx == 16384


def test_synthetic_acceptance_is_a_speculative_parameter_and_the_memory_model_refuses_the_line() -> None:
    assert {"--spec-synth-len", "--spec-synth-rates"} <= sf.MAINLINE_PARAMS
    inv = load_inventory(GLM_AIR)
    eng = engine("llama.cpp")
    argv = shlex.split(SPEC_LINE)
    est = estimate_explained(explain(inv, eng, argv), read_settings(argv, eng))
    assert not est.complete
    assert any(n.startswith("memory is not modelled with speculative decoding") and "-md" in n for n in est.notes)
    # the parameters alone turn nothing on: the estimate is complete and the same as without them
    plain = [w for w in argv if w not in ("--spec-type", "draft-simple", "-md", "/models/draft.gguf")]
    bare = [w for w in plain if w not in ("--spec-synth-len", "4", "--spec-synth-rates", "0.9,0.7")]
    alone = estimate_explained(explain(inv, eng, plain), read_settings(plain, eng))
    without = estimate_explained(explain(inv, eng, bare), read_settings(bare, eng))
    assert alone.complete and {d: m.total for d, m in alone.devices.items()} == {
        d: m.total for d, m in without.devices.items()}


def test_n_cpu_ffn_keeps_the_dense_ffn_of_the_first_blocks_on_the_cpu() -> None:
    """`-ncffn 2`: the rules `blk\\.0\\.ffn_(up|down|gate)\\.` and block 1's (common/common.h): block
    0's dense FFN goes to the CPU; block 1 is MoE, so only its dense-named tensors would match
    (none: its shared expert is `ffn_*_shexp`); the experts stay where -ngl puts them."""
    inv = load_inventory(GLM_AIR)
    line = "llama-server -m /m/GLM-4.5-Air-Q4_K_M.gguf -ngl 99 -ncffn 2 -c 8192"
    ex = explain(inv, engine("llama.cpp"), shlex.split(line), gpus=["CUDA0"])
    dev = ex.placement.devices
    assert {dev[f"blk.0.ffn_{k}.weight"] for k in ("up", "down", "gate")} == {"CPU"}
    assert dev["blk.0.attn_q.weight"] == "CUDA0" and dev["blk.1.ffn_up_exps.weight"] == "CUDA0"
    assert dev["blk.1.ffn_up_shexp.weight"] == "CUDA0"
    items = engine_items(parse_invocation(_words(line), engine("llama.cpp")), inv)
    assert [(p, d, o) for p, d, o, _ in items] == [(cpu_ffn_pattern(0), "CPU", "--n-cpu-ffn 2 (cli)"),
                                                  (cpu_ffn_pattern(1), "CPU", "--n-cpu-ffn 2 (cli)")]
    assert re.search(cpu_ffn_pattern(0), "blk.0.ffn_gate.weight") and not re.search(
        cpu_ffn_pattern(0), "blk.0.ffn_gate_exps.weight")
    # in order with -ot (mainline reads its sources left to right), and from the environment
    later = parse_invocation(_words("llama-server -ot blk\\.0\\.=CUDA0 -ncffn 1"), engine("llama.cpp"))
    assert [o for _p, _d, o, _k in engine_items(later, inv)] == ["-ot item 1", "--n-cpu-ffn 1 (cli)"]
    env = parse_invocation(_words("llama-server"), engine("llama.cpp"), {"LLAMA_ARG_N_CPU_FFN": Arg("1")})
    assert [o for _p, _d, o, _k in engine_items(env, inv)] == ["--n-cpu-ffn 1 (env)"]
    bad = parse_invocation(_words("llama-server -ncffn x"), engine("llama.cpp"))
    assert [m for _a, m in bad.problems] == [
        "-ncffn 'x': llama.cpp reads it with std::stoi, which finds no number there and stops"]


def test_n_cpu_ffn_is_unknown_to_ik() -> None:
    inv = parse_invocation(_words("llama-server -m /m/x.gguf -ncffn 2"), engine("ik_llama.cpp"))
    assert [a.text for a, _ in inv.unknown_flags] == ["-ncffn"] and inv.n_cpu_ffn == []


def test_load_switches_the_pinned_parser_dropped_are_reported_for_new_builds_only(tmp_path: Path) -> None:
    line = "llama-server -m /models/m.gguf -ngl 99 -ot exps=CPU --no-mmap -c 4096\n"
    found = [f for f in lint_text(tmp_path, line) if f.name == "unknown-flag"]
    assert len(found) == 1 and "has no --no-mmap any more" in found[0].message
    assert "--load-mode" in found[0].message
    assert not [f for f in lint_text(tmp_path, line, engine_version="b10000") if f.name == "unknown-flag"]
    assert not [f for f in lint_text(tmp_path, line.replace("--no-mmap", "-lm none")) if f.name == "unknown-flag"]


def test_ik_flags_follow_the_version_named() -> None:
    """ik 0.1.5 has no --dsa (the newest ik code read does); its `-ctkd` takes a value in both
    (an `argv[++i]` block), so `-c` after it is read."""
    words = _words("llama-server -m /m/x.gguf -ngl 99 --dsa -ctkd q8_0 -c 4096")
    old = parse_invocation(words, engine("ik_llama.cpp", "0.1.5"))
    new = parse_invocation(words, engine("ik_llama.cpp"))
    assert [a.text for a, _ in old.unknown_flags] == ["--dsa"] and new.unknown_flags == []
    for inv in (old, new):
        assert inv.ctx_size is not None and inv.ctx_size.text == "4096"


def test_kv_unified_per_slot_sizes_the_servers_kv_pool_without_c() -> None:
    """llama-server --kv-unified-per-slot N (tools/server/server.cpp): without -c the KV pool is
    n_parallel * N, after -np auto (4 slots) is resolved; -c, even -c 0, pins it."""
    eng = engine("llama.cpp")

    def n_ctx(line: str, env: dict[str, str] | None = None) -> int:
        s = read_settings(shlex.split(line), eng, env)
        assert s.problems == ()
        return s.n_ctx

    base = "llama-server -m /m/x.gguf -ngl 99"
    assert parse_invocation(_words(f"{base} --kv-unified-per-slot 8192"), eng).unknown_flags == []
    assert n_ctx(f"{base} --kv-unified-per-slot 8192 -np 2") == 16384
    assert n_ctx(f"{base} --kv-unified-per-slot 8192") == 4 * 8192
    assert n_ctx(base, {"LLAMA_ARG_KV_UNIFIED_PER_SLOT": "4096"}) == 4 * 4096
    assert n_ctx(f"{base} --kv-unified-per-slot 8192 -c 4096") == 4096
    assert n_ctx(f"{base} --kv-unified-per-slot 8192 -c 0") == 0
    assert n_ctx(f"{base} --kv-unified-per-slot 0") == 0
    assert n_ctx("llama-cli -m /m/x.gguf --kv-unified-per-slot 8192") == 0  # a server option only
    assert n_ctx(f"{base} --kv-unified-per-slot 8192", {"LLAMA_ARG_CTX_SIZE": "2048"}) == 2048
    # the estimate follows: the pool of 2 x 8192 cells is the one -c 16384 gives
    inv = load_inventory(GLM_AIR)
    lines = [f"{base} -np 2 --kv-unified-per-slot 8192", f"{base} -np 2 -c 16384"]
    kv = [sum(m.kv for m in estimate_explained(explain(inv, eng, shlex.split(ln)),
                                               read_settings(shlex.split(ln), eng)).devices.values()) for ln in lines]
    assert kv[0] == kv[1] > 0


def test_explain_names_what_n_cpu_ffn_takes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", GLM_AIR, "--", "llama-server", "-m", "/m/GLM-4.5-Air-Q4_K_M.gguf", "-ngl", "99",
                 "-ncffn", "2", "-c", "8192"]) in (0, 1)
    out = capsys.readouterr().out
    assert "--n-cpu-ffn 2 (cli): 2 rule(s) the engine adds, taking the dense FFN of blocks 0 (3 tensors) to CPU" in out
    assert "unknown argument" not in out


@pytest.mark.parametrize(("flags", "says"), [
    (["-ncffn", "2"], "fit chooses -ncffn itself"),
    (["--kv-unified-per-slot", "4096"], "fit sizes the KV cache from -c"),
])
def test_fit_refuses_the_new_placement_and_pool_flags(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                      says: str) -> None:
    assert main(["fit", GLM_AIR, "--gpu", "24GiB", "-c", "4096", *flags]) == 2
    assert says in capsys.readouterr().err


def test_a_plan_may_not_pass_the_new_flags_unsimulated(tmp_path: Path) -> None:
    from moeconf.engines.argvread import scan_extra
    from moeconf.engines.flags import PLAN_KEYS

    owned, unknown = scan_extra(["-ncffn", "2", "--kv-unified-per-slot", "4096", "-t", "8"], engine("llama.cpp"))
    assert [n for _i, n in owned] == ["-ncffn", "--kv-unified-per-slot", "-t"] and unknown == []
    assert PLAN_KEYS["--n-cpu-ffn"] == "rules"
