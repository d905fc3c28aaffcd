"""The real engines place tensors exactly where moeconf says they will.

For each tiny model, plan and engine: compile with moeconf (devices: CPU and one or two RPC
servers on 127.0.0.1), load the model with the engine's own binary, read every tensor's
placement from its logs, and compare tensor by tensor. Also through `explain`, for hand-written
command lines. Run with `pytest -m engine` after `scripts/build-engines.sh`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeconf.compile import compile_plan
from moeconf.engines import AUTO_GPU, engine
from moeconf.explanation import explain
from moeconf.fixtures.layouts import TINY
from moeconf.fixtures.tiny import write_tiny
from moeconf.model.inventory import Inventory, Tensor, load_inventory
from moeconf.plan import plan_from_text
from tests.engine.harness import BUILDS, EngineBuild, parse_ik_overrides, parse_mainline, rpc_servers, run_engine
from tests.strategies import rules

pytestmark = pytest.mark.engine

RESULTS: list[dict[str, object]] = []


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
        out = Path(os.environ.get("MOECONF_ENGINE_RESULTS", Path.cwd() / "engine-results.json"))
        out.write_text(json.dumps(RESULTS, indent=1))


def actual_placement(build: EngineBuild, model: Path, inv: Inventory, args: list[str], endpoints: list[str],
                     env: dict[str, str] | None = None) -> dict[str, str]:
    run = run_engine(build, model, args, env)
    assert run.returncode == 0, run.log[-3000:]
    if build.name == "llama.cpp":
        return parse_mainline(run.log, inv, endpoints)
    return ik_placement(run.log, inv, endpoints)


def ik_placement(log: str, inv: Inventory, endpoints: list[str]) -> dict[str, str]:
    overrides = parse_ik_overrides(log)
    return {t.name: overrides.get(t.name, "(default)") for t in inv.tensors}


def checked(build: EngineBuild, tensors: list[Tensor], got: dict[str, str]) -> int:
    """How many tensors the engine's log told us about: all of them on mainline (override lines
    and layer assignments); on ik_llama.cpp only those an override line names, because with
    RPC-only devices its defaults stay in its CPU buffer and are not logged per tensor."""
    if build.name == "llama.cpp":
        return len(tensors)
    return sum(1 for t in tensors if got[t.name] != "(default)")


def same(want: str | None, got: str) -> bool:
    """moeconf's device against the engine's; GPU(auto) (the engine's own split over several
    devices) stands for any accelerator."""
    if want == AUTO_GPU:
        return got not in ("CPU", "?")
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
        got = actual_placement(build, model, inv, args, endpoints)
    want = c.placement.devices
    created = [t for t in inv.tensors if want[t.name] is not None]
    if build.name == "llama.cpp":
        diff = {t.name: (want[t.name], got[t.name]) for t in created if not same(want[t.name], got[t.name])}
    else:
        # ik_llama.cpp logs only overridden tensors: each must be overridden to moeconf's device,
        # and exactly the tensors moeconf moved off their default are overridden
        diff = {}
        for t in created:
            moved = want[t.name] != c.placement.defaults[t.name]
            if moved and got[t.name] != want[t.name]:
                diff[t.name] = (want[t.name], got[t.name])
            if not moved and got[t.name] != "(default)" and got[t.name] != want[t.name]:
                diff[t.name] = (want[t.name], got[t.name])
    RESULTS.append({"engine": build.name, "package": build.package, "model": key, "rules": rules_,
                    "ot": c.ot, "tensors": checked(build, created, got), "disagreements": len(diff)})
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

CMDLINES = [
    # unanchored and overbroad patterns
    ["-ngl", "999", "-ot", "blk\\.1=CPU"],
    ["-ngl", "999", "-ot", "ffn.*=CPU"],
    ["-ngl", "999", "-ot", "exps=CPU, attn=CPU"],
    # partial -ngl
    ["-ngl", "3"],
    ["-ngl", "4", "-ot", "blk\\.0\\.attn.*=@rpc0"],
    # the built-in MoE flags, and their order against -ot
    ["-ngl", "999", "--cpu-moe"],
    ["-ngl", "999", "--n-cpu-moe", "2"],
    ["-ngl", "999", "-ot", "blk\\.2\\.ffn_up_exps=@rpc0", "--cpu-moe"],
    ["-ngl", "999", "--cpu-moe", "-ot", "blk\\.2\\.ffn_up_exps=@rpc0"],
]


@pytest.mark.parametrize("key", ["tiny-qwen3moe", "tiny-glm4moe", "tiny-deepseek2"])
@pytest.mark.parametrize("cmd", CMDLINES, ids=lambda c: " ".join(c))
def test_explain_matches_engine(build: EngineBuild, tiny_models: dict[str, Path], key: str, cmd: list[str]) -> None:
    model = tiny_models[key]
    inv = load_inventory(model)
    with rpc_servers(build, 1) as endpoints:
        args = ["--rpc", endpoints[0], *[a.replace("@rpc0", f"RPC0[{endpoints[0]}]") for a in cmd]]
        if build.name == "llama.cpp":
            args += ["-fit", "off"]
        ex = explain(inv, engine(build.name, build.version), args, gpus=[])
        got = actual_placement(build, model, inv, args, endpoints)
    want = ex.placement.devices
    if build.name == "llama.cpp":
        diff = {n: (want[n], got[n]) for n in want if want[n] is not None and not same(want[n], got[n])}
    else:
        diff = {n: (want[n], got[n]) for n in want if want[n] is not None and got[n] != "(default)"
                and got[n] != want[n]}
    live = [t for t in inv.tensors if want[t.name] is not None]
    RESULTS.append({"engine": build.name, "package": build.package, "model": key, "cmdline": cmd,
                    "tensors": checked(build, live, got), "disagreements": len(diff)})
    assert not diff, f"{build.name} {key} {cmd}: {dict(list(diff.items())[:8])}"


def test_env_override_tensor_beats_command_line(tiny_models: dict[str, Path]) -> None:
    build = BUILDS["llama.cpp"]
    model = tiny_models["tiny-qwen3moe"]
    inv = load_inventory(model)
    with rpc_servers(build, 1) as endpoints:
        args = ["--rpc", endpoints[0], "-ngl", "999", "-fit", "off", "-ot", f"exps=RPC0[{endpoints[0]}]"]
        env = {"LLAMA_ARG_OVERRIDE_TENSOR": "exps=CPU"}
        ex = explain(inv, engine("llama.cpp"), args, env=env, gpus=[])
        got = actual_placement(build, model, inv, args, endpoints, env)
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
