"""The real engines place tensors exactly where moeconf says they will.

For each tiny model, plan and engine: compile with moeconf (devices: CPU and one or two RPC
servers on 127.0.0.1), load the model with the engine's own binary, read every tensor's
placement from its logs, and compare tensor by tensor. Also through `explain`, for hand-written
command lines. Run with `pytest -m engine` after `scripts/build-engines.sh`."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeconf.compile import compile_plan
from moeconf.engines import AUTO_GPU, engine
from moeconf.engines.cmdline import invocation_ncmoe
from moeconf.explanation import explain, ik_split
from moeconf.fixtures.layouts import TINY
from moeconf.fixtures.tiny import write_tiny
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.plan import plan_from_text
from tests.engine.harness import (
    BUILDS,
    DEFAULT_CTX,
    IK,
    MAINLINE,
    EngineBuild,
    IkLog,
    parse_ik,
    parse_mainline,
    rpc_servers,
    run_engine,
)
from tests.engine.shards import shard_path
from tests.strategies import rules

pytestmark = pytest.mark.engine

RESULTS: list[dict[str, object]] = []
CRASHES: list[dict[str, object]] = []
_IK_LOADED = re.compile(r"llm_load_tensors: offloaded \d+/\d+ layers to GPU")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {key: write_tiny(lay, d / f"{key}.gguf") for key, lay in TINY.items()}


@pytest.fixture(scope="session", params=sorted(BUILDS))
def build(request: pytest.FixtureRequest) -> EngineBuild:
    b = BUILDS[request.param]
    if not b.available():
        pytest.fail(f"{b.name} is not built: run scripts/build-engines.sh (looked for {b.cli})")
    return b


@pytest.fixture(scope="session", autouse=True)
def results_table() -> Iterator[None]:
    yield
    if RESULTS:
        out = shard_path(os.environ.get("MOECONF_ENGINE_RESULTS", Path.cwd() / "engine-results.json"))
        out.write_text(json.dumps([*RESULTS, {"crashes_after_loading": CRASHES}] if CRASHES else RESULTS, indent=1))


def actual_placement(build: EngineBuild, model: Path, inv: Inventory, args: list[str], endpoints: list[str],
                     env: dict[str, str] | None = None) -> tuple[dict[str, str | None], IkLog | None]:
    """Every tensor's device as the engine's log tells it (None: the engine does not load it),
    and, for ik_llama.cpp, what else its log says (layer split, --n-cpu-moe shares)."""
    run = run_engine(build, model, args, env, endpoints)
    if run.returncode != 0 and build.name == "ik_llama.cpp" and _IK_LOADED.search(run.log):
        # ik 0.1.5 placed every tensor (its load summary is printed after placement) and then
        # crashed setting up the context: the placement is still what it did
        CRASHES.append({"model": str(model.name), "args": args, "returncode": run.returncode})
    else:
        assert run.returncode == 0, run.log[-3000:]
    if build.name == "llama.cpp":
        return dict(parse_mainline(run.log, inv, endpoints)), None
    ik_log = parse_ik(run.log, inv, endpoints)
    return ik_log.placement, ik_log


def differences(build: EngineBuild, want: dict[str, str | None],
                got: dict[str, str | None]) -> dict[str, tuple[str | None, str | None]]:
    """Tensors where moeconf and the engine disagree: the device, or whether the tensor is loaded
    at all (ik_llama.cpp's log names the tensors it skips; mainline's does not, so there a tensor
    moeconf says is not loaded is not compared)."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for name, w in want.items():
        g = got[name]
        if w is None:
            if build.name == "ik_llama.cpp" and g is not None:
                out[name] = (w, g)
        elif not same(w, g):
            out[name] = (w, g)
    return out


def compared(build: EngineBuild, want: dict[str, str | None]) -> int:
    """How many tensor placements a run compared."""
    return sum(1 for w in want.values() if w is not None or build.name == "ik_llama.cpp")


def same(want: str | None, got: str | None) -> bool:
    """moeconf's device against the engine's; GPU(auto) (the engine's own split over several
    devices) stands for any accelerator."""
    if want == AUTO_GPU:
        return got not in ("CPU", "?", None)
    return want == got


def plan_for(rules_: list[str], build: EngineBuild, endpoints: list[str]) -> str:
    rl = "[" + ", ".join(json.dumps(r) for r in rules_) + "]"
    version = f'version = "{build.version}"\n' if build.version else ""
    rpc = ", ".join(json.dumps(e) for e in endpoints)
    return (f"rules = {rl}\n[model]\npath = \"unused.gguf\"\n[engine]\nname = \"{build.name}\"\n{version}"
            f"gpus = []\n[flags]\nrpc = [{rpc}]\n")


def compare(build: EngineBuild, key: str, model: Path, rules_: list[str], n_rpc: int) -> None:
    inv = load_inventory(model)
    with rpc_servers(build, n_rpc) as endpoints:
        text = plan_for(rules_, build, endpoints)
        gpu_words = [f"RPC0[{e}]" for e in endpoints]
        for i, w in enumerate(gpu_words):
            text = text.replace(f"@rpc{i}", w)
        plan = plan_from_text(text, "/tmp/engine-plan.toml")
        c = compile_plan(plan, inventory=inv)
        args = list(c.argv[3:])  # drop binary and -m MODEL
        got, _ik = actual_placement(build, model, inv, args, endpoints)
    want = c.placement.devices
    diff = differences(build, want, got)
    RESULTS.append({"engine": build.name, "package": build.package, "model": key, "rules": rules_,
                    "ot": c.ot, "tensors": compared(build, want), "disagreements": len(diff)})
    assert not diff, f"{build.name} {key} {rules_} -ot {c.ot!r}: {dict(list(diff.items())[:8])}"


HAND_WRITTEN = [
    ["experts -> cpu"],
    ["experts -> cpu", "experts last 2 -> gpu"],
    ["experts -> cpu", "experts first 1 -> gpu", "shexp -> cpu"],
    ["attn layers 0..2 -> cpu", "output -> cpu"],
    ["layer layers 1, 3 -> cpu", "ffn_up_exps -> cpu"],
    ["experts -> cpu", "nextn -> cpu"],
    ["experts layers ..2 -> gpu1", "experts layers 3.. -> cpu"],
]


@pytest.mark.parametrize("key", sorted(TINY))
@pytest.mark.parametrize("rules_", HAND_WRITTEN, ids=lambda r: " | ".join(r))
def test_compiled_plans(build: EngineBuild, tiny_models: dict[str, Path], key: str, rules_: list[str]) -> None:
    n_rpc = 2 if any("gpu1" in r for r in rules_) else 1
    compare(build, key, tiny_models[key], rules_, n_rpc)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_drawn_plans(build: EngineBuild, tiny_models: dict[str, Path], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(TINY)))
    inv = load_inventory(tiny_models[key])
    drawn = data.draw(st.lists(rules(inv), min_size=1, max_size=3))
    drawn = [r.replace("CUDA1", "gpu1") for r in drawn]
    compare(build, key, tiny_models[key], drawn, 2)


# --- explain against hand-written command lines --------------------------------------------

# (RPC devices, command line): what new users write, on one GPU and on two
CMDLINES: list[tuple[int, list[str]]] = [
    # unanchored and overbroad patterns
    (1, ["-ngl", "999", "-ot", "blk\\.1=CPU"]),
    (1, ["-ngl", "999", "-ot", "ffn.*=CPU"]),
    (1, ["-ngl", "999", "-ot", "exps=CPU, attn=CPU"]),
    # no -ngl (ik_llama.cpp 0.1.5 offloads nothing), and -ngl 0 with -ot / --n-cpu-moe
    (1, []),
    (1, ["-ot", "exps=CPU"]),
    (1, ["-ngl", "0", "-ot", "attn_q\\.=@rpc0"]),
    (1, ["-ngl", "0", "--n-cpu-moe", "2"]),
    # partial -ngl
    (1, ["-ngl", "3"]),
    (1, ["-ngl", "4", "-ot", "blk\\.0\\.attn.*=@rpc0"]),
    (1, ["-ngl", "3", "--n-cpu-moe", "2"]),
    # the built-in MoE flags, and their order against -ot
    (1, ["-ngl", "999", "--cpu-moe"]),
    (1, ["-ngl", "999", "--n-cpu-moe", "2"]),
    (1, ["-ngl", "999", "--n-cpu-moe", "3"]),
    (1, ["-ngl", "999", "--n-cpu-moe", "99"]),
    (1, ["-ngl", "999", "-ot", "blk\\.2\\.ffn_up_exps=@rpc0", "--cpu-moe"]),
    (1, ["-ngl", "999", "--cpu-moe", "-ot", "blk\\.2\\.ffn_up_exps=@rpc0"]),
    (1, ["-ngl", "999", "--cpu-moe", "--n-cpu-moe", "1"]),
    # two GPUs: ik shares --n-cpu-moe over the devices
    (2, []),
    (2, ["-ngl", "999"]),
    (2, ["-ngl", "999", "--n-cpu-moe", "1"]),
    (2, ["-ngl", "999", "--n-cpu-moe", "2"]),
    (2, ["-ngl", "999", "--n-cpu-moe", "3"]),
    (2, ["-ngl", "3", "--n-cpu-moe", "2"]),
    (2, ["-ngl", "999", "--cpu-moe"]),
    (2, ["-ngl", "999", "-ot", "exps=CPU", "--n-cpu-moe", "2"]),
]


@pytest.mark.parametrize("key", sorted(TINY))
@pytest.mark.parametrize(("n_rpc", "cmd"), CMDLINES, ids=lambda c: str(c) if isinstance(c, int) else " ".join(c))
def test_explain_matches_engine(build: EngineBuild, tiny_models: dict[str, Path], key: str, n_rpc: int,
                                cmd: list[str]) -> None:
    model = tiny_models[key]
    inv = load_inventory(model)
    eng = engine(build.name, build.version)
    with rpc_servers(build, n_rpc) as endpoints:
        # one --rpc with every server: ik keeps only the last --rpc
        args = ["--rpc", ",".join(endpoints), *[a.replace("@rpc0", f"RPC0[{endpoints[0]}]") for a in cmd]]
        if build.name == "llama.cpp":
            args += ["-fit", "off"]
        got, ik_log = actual_placement(build, model, inv, args, endpoints)
    # ik splits layers over 2+ devices by free memory: moeconf is told that split (from ik's log),
    # and everything else -- defaults, --n-cpu-moe shares and blocks -- is compared
    layer_devices = ik_log.layer_devices if ik_log else None
    ex = explain(inv, eng, args, gpus=[], layer_devices=layer_devices)
    want = ex.placement.devices
    diff = differences(build, want, got)
    if ik_log is not None:
        takes = [t for t, _o, _k in invocation_ncmoe(ex.invocation, inv, n_rpc, layer_devices)]
        mine = [share for t in takes for share in t.shares]
        if ik_log.shares != mine:
            diff["(--n-cpu-moe shares)"] = (str(mine), str(ik_log.shares))
    RESULTS.append({"engine": build.name, "package": build.package, "model": key, "cmdline": cmd, "devices": n_rpc,
                    "tensors": compared(build, want), "disagreements": len(diff)})
    assert not diff, f"{build.name} {key} {cmd} on {n_rpc} devices: {dict(list(diff.items())[:8])}"


# llama.cpp -sm none keeps only the model device -mg names for the layers; -ot may still name any
SM_NONE: list[list[str]] = [
    ["-ngl", "999", "-sm", "none"],
    ["-ngl", "999", "-sm", "none", "-mg", "1"],
    ["-ngl", "999", "-sm", "none", "-mg", "1", "-ot", "exps=CPU,blk\\.0\\.attn_.*=@rpc0"],
    ["-ngl", "3", "-sm", "none", "-mg", "1"],
]


@pytest.mark.parametrize("key", sorted(TINY))
@pytest.mark.parametrize("cmd", SM_NONE, ids=" ".join)
def test_split_mode_none_uses_the_main_gpu(tiny_models: dict[str, Path], key: str, cmd: list[str]) -> None:
    model = tiny_models[key]
    inv = load_inventory(model)
    with rpc_servers(MAINLINE, 2) as endpoints:
        args = ["--rpc", ",".join(endpoints), "-fit", "off",
                *[a.replace("@rpc0", f"RPC0[{endpoints[0]}]") for a in cmd]]
        ex = explain(inv, engine("llama.cpp"), args, gpus=[])
        if "@rpc0" in " ".join(cmd):
            # -ot naming a device -sm none drops: the engine aborts at start, and explain says so
            run = run_engine(MAINLINE, model, args, None, endpoints)
            assert run.returncode != 0 and "cannot run the operation" in run.log
            assert any("-sm none" in r and "aborts at start" in r for r in ex.refusals), ex.refusals
            return
        got, _ = actual_placement(MAINLINE, model, inv, args, endpoints)
    want = ex.placement.devices
    mg = int(cmd[cmd.index("-mg") + 1]) if "-mg" in cmd else 0
    layered = {want[t.name] for t in inv.tensors if t.layer is not None and t.group not in ("experts",)}
    assert f"RPC0[{endpoints[mg]}]" in layered  # the simulation uses the main GPU ...
    diff = differences(MAINLINE, want, got)  # ... and the engine agrees, tensor by tensor
    assert not diff, f"{key} {cmd}: {dict(list(diff.items())[:8])}"


def test_env_override_tensor_beats_command_line(tiny_models: dict[str, Path]) -> None:
    build = BUILDS["llama.cpp"]
    model = tiny_models["tiny-qwen3moe"]
    inv = load_inventory(model)
    with rpc_servers(build, 1) as endpoints:
        args = ["--rpc", endpoints[0], "-ngl", "999", "-fit", "off", "-ot", f"exps=RPC0[{endpoints[0]}]"]
        env = {"LLAMA_ARG_OVERRIDE_TENSOR": "exps=CPU"}
        ex = explain(inv, engine("llama.cpp"), args, env=env, gpus=[])
        got, _ik = actual_placement(build, model, inv, args, endpoints, env)
    assert got["blk.0.ffn_up_exps.weight"] == "CPU" == ex.placement.devices["blk.0.ffn_up_exps.weight"]


@pytest.mark.parametrize("device", ["cuda0", "CUDA0", "RPC[127.0.0.1:1]", "CPU_REPACK", "CPU"])
def test_unknown_device_exactly_when_engine_refuses(build: EngineBuild, tiny_models: dict[str, Path],
                                                    device: str, tmp_path: Path) -> None:
    from moeconf.linting.linter import lint

    model = tiny_models["tiny-qwen3moe"]
    run = run_engine(build, model, ["-ot", f"exps={device}"])
    refused = run.returncode != 0 and ("Available buffer types" in run.log or "buffer type" in run.log)
    script = tmp_path / "run.sh"
    script.write_text(f"# moeconf: engine={build.name}\nllama-server -m {model} -fit off -ot 'exps={device}'\n")
    (tmp_path / ".moeconf.toml").write_text("gpus = []\n")
    fired = any(f.name == "unknown-device" for f in lint([str(script)]).findings)
    ex = explain(load_inventory(model), engine(build.name, build.version), ["-ot", f"exps={device}"], gpus=[])
    assert refused == fired == bool(ex.refusals), run.log[-2000:]


# --- ik_llama.cpp's layer split with -ts, predicted (no log fed in) --------------------------

# -ts (sizes by layer bytes + KV cache + compute), partial -ngl, cache settings that change the
# layer sizes, -ot and --n-cpu-moe (which do not: ik sizes layers from the file)
IK_TS: list[list[str]] = [
    ["-ngl", "999", "-ts", "1,1"],
    ["-ngl", "999", "-ts", "3,1"],
    ["-ngl", "999", "-ts", "1,3"],
    ["-ngl", "999", "-ts", "1/4"],
    ["-ngl", "3", "-ts", "1,1"],
    ["-ngl", "5", "-ts", "1,2", "-fa", "off"],
    ["-ngl", "999", "-ts", "1,1", "-c", "512"],
    ["-ngl", "999", "-ts", "5,1", "-c", "2048", "-ctk", "q8_0"],
    ["-ngl", "999", "-ts", "2,1", "-ctk", "q8_0", "-ctv", "q4_0", "-c", "1024"],
    ["-ngl", "999", "-ts", "2,3", "-ub", "128", "-b", "256"],
    ["-ngl", "999", "-ts", "1,1", "-mla", "1", "-fa", "off"],
    ["-ngl", "999", "-ts", "1,1", "-ot", "exps=CPU"],
    ["-ngl", "999", "-ts", "1,2", "--n-cpu-moe", "2"],
]


def with_ctx(args: list[str]) -> list[str]:
    """The command line as the engine runs it: the harness's context unless the case sets one."""
    return args if "-c" in args else [*args, "-c", str(DEFAULT_CTX)]


def moved_boundary(split: list[int], inv: Inventory) -> list[int]:
    """A wrong split: the first loaded layer on the second device goes to the first (with no
    boundary among loaded layers, the first loaded layer changes device)."""
    skipped = set(inv.layers_of_kind("nextn"))
    loaded = [il for il in range(len(split)) if il not in skipped]
    wrong = list(split)
    for a, b in pairwise(loaded):
        if wrong[a] != wrong[b]:
            wrong[b] = wrong[a]
            return wrong
    wrong[loaded[0]] = 1 - wrong[loaded[0]]
    return wrong


# architectures whose ik split moeconf refuses to predict (no ik tensor table for dots1
# and bailingmoe2; qwen3vlmoe's logged per-layer compute is not modelled, moeconf/iksplit.py)
IK_SPLIT_REFUSED = {"dots1", "bailingmoe2", "qwen3vlmoe"}


@pytest.mark.parametrize("key", sorted(TINY))
@pytest.mark.parametrize("cmd", IK_TS, ids=" ".join)
def test_ik_split_by_tensor_split_is_predicted(tiny_models: dict[str, Path], key: str, cmd: list[str]) -> None:
    model = tiny_models[key]
    inv = load_inventory(model)
    eng = engine(IK.name, IK.version)
    with rpc_servers(IK, 2) as endpoints:
        args = with_ctx(["--rpc", ",".join(endpoints), *cmd])
        got, ik_log = actual_placement(IK, model, inv, args, endpoints)
    assert ik_log is not None and ik_log.layer_devices is not None, "ik logged no split"
    ex = explain(inv, eng, args, gpus=[])  # no layer_devices: moeconf predicts the split
    predicted = ik_split(ex.invocation, inv, ex.invocation.n_gpu_layers(), ts_values(args), 2)
    if inv.arch in IK_SPLIT_REFUSED:  # moeconf says it cannot predict, and shows GPU(auto)
        assert isinstance(predicted, str) and "not modelled" in predicted, predicted
        assert AUTO_GPU in ex.placement.devices.values()
        return
    assert isinstance(predicted, list), predicted
    diff = differences(IK, ex.placement.devices, got)
    if predicted != ik_log.layer_devices:
        diff["(layer split)"] = (str(predicted), str(ik_log.layer_devices))
    takes = [t for t, _o, _k in invocation_ncmoe(ex.invocation, inv, 2, predicted)]
    if ik_log.shares != [share for t in takes for share in t.shares]:
        diff["(--n-cpu-moe shares)"] = (str([s for t in takes for s in t.shares]), str(ik_log.shares))
    RESULTS.append({"engine": IK.name, "package": IK.package, "model": key, "cmdline": cmd, "devices": 2,
                    "predicted_split": predicted, "tensors": compared(IK, ex.placement.devices),
                    "disagreements": len(diff)})
    assert not diff, f"{key} {cmd}: {dict(list(diff.items())[:8])}"
    # the comparison sees a wrong split: one layer moved across the boundary changes placements
    wrong = moved_boundary(ik_log.layer_devices, inv)
    bad = explain(inv, eng, args, gpus=[], layer_devices=wrong)
    assert differences(IK, bad.placement.devices, got), f"a wrong split {wrong} went unnoticed"


def ts_values(args: list[str]) -> list[float]:
    return [float(x) for x in args[args.index("-ts") + 1].replace("/", ",").split(",")]


# sparse full-size layouts (realistic layer sizes): ik's --dry-run computes the split and skips
# reading the data; -ot exps=CPU keeps the RPC buffers small (the split still weighs the experts)
FULL_SIZE: list[tuple[str, list[str]]] = [
    ("qwen3-30b-a3b", ["-ts", "1,1", "-c", "32768"]),
    ("qwen3-30b-a3b", ["-ts", "3,2", "-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"]),
    ("qwen3-30b-a3b", ["-ts", "1,1", "-c", "4096", "-ngl", "30"]),
    ("gpt-oss-20b", ["-ts", "2,1", "-c", "16384"]),
    ("gpt-oss-20b", ["-ts", "1,1", "-c", "131072", "-fa", "off"]),
    # DeepSeek-V3's blocks (MLA with attn_k_b/attn_v_b, 3 dense blocks), cut to 10 blocks and 16
    # experts so that ik's required memory stays under what the RPC servers report (ik logs the
    # split only then)
    ("deepseek-v3-cut", ["-ts", "1,1", "-c", "32768", "-mla", "3", "-fa", "on"]),
    ("deepseek-v3-cut", ["-ts", "2,1", "-c", "65536", "-mla", "3", "-fa", "off", "-amb", "512"]),
    ("deepseek-v3-cut", ["-ts", "1,2", "-c", "16384", "-mla", "1", "-fa", "off", "-ctk", "q8_0"]),
    ("deepseek-v3-cut", ["-ts", "1,1", "-c", "8192", "-ngl", "6", "-mla", "2"]),
]
CUT_LAYOUTS = {"deepseek-v3-cut": ("deepseek-v3", {"blocks": 10, "experts": 16})}


@pytest.fixture(scope="module")
def full_size_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.fixtures.writer import write_layout

    d = tmp_path_factory.mktemp("full")
    out = {}
    for name in dict.fromkeys(n for n, _ in FULL_SIZE):
        out[name] = d / f"{name}.gguf"
        base, changes = CUT_LAYOUTS.get(name, (name, {}))
        write_layout(replace(LAYOUTS[base], key=name, **changes), out[name])
    return out


@pytest.mark.parametrize(("name", "cmd"), FULL_SIZE, ids=lambda c: c if isinstance(c, str) else " ".join(c))
def test_ik_split_by_tensor_split_full_size(full_size_models: dict[str, Path], name: str, cmd: list[str]) -> None:
    model = full_size_models[name]
    inv = load_inventory(model)
    eng = engine(IK.name, IK.version)
    with rpc_servers(IK, 2) as endpoints:
        args = ["--rpc", ",".join(endpoints), *([] if "-ngl" in cmd else ["-ngl", "999"]), "-ot", "exps=CPU", *cmd]
        run = run_engine(IK, model, [*args, "--dry-run"], None, endpoints)
        ik_log = parse_ik(run.log, inv, endpoints)
    assert ik_log.layer_devices is not None, run.log[-3000:]
    ex = explain(inv, eng, args, gpus=[])
    predicted = ik_split(ex.invocation, inv, ex.invocation.n_gpu_layers(), ts_values(args), 2)
    RESULTS.append({"engine": IK.name, "package": IK.package, "model": name, "cmdline": cmd, "devices": 2,
                    "predicted_split": predicted, "disagreements": int(predicted != ik_log.layer_devices)})
    assert predicted == ik_log.layer_devices
