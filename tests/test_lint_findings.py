"""What lint findings say and how they are shown: severities that follow the engine version,
every instance a finding, patterns quoted as written, nothing skipped without `gpus`, and lint and
explain simulating the same devices."""

from __future__ import annotations

from pathlib import Path

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.linting.linter import lint
from moeconf.linting.model import Config
from moeconf.model.load import load_inventory
from tests.conftest import EXAMPLES

DEEPSEEK = str(EXAMPLES / "models" / "deepseek-v3.manifest.json")


def run(tmp_path: Path, line: str, engine_name: str = "llama.cpp", version: str | None = None,
        gpus: list[str] | None = None) -> list[tuple[str, str, str]]:
    path = tmp_path / "launch.sh"
    path.write_text(line + "\n")
    cfg = Config(engine=engine_name, engine_version=version, gpus=gpus, models={"m.gguf": DEEPSEEK})
    return [(f.name, f.severity, f.message) for f in lint([str(path)], config=cfg).findings]


def test_space_after_comma_follows_the_ik_version(tmp_path: Path) -> None:
    line = 'llama-server -m m.gguf -ngl 999 -ot "exps=CPU, attn_kv_a_mqa=CUDA0"'
    old = [f for f in run(tmp_path, line, "ik_llama.cpp", "2025-08-15") if f[0] == "space-in-list"]
    assert [s for _, s, _ in old] == ["info"]  # that build trims: the line works as written
    assert not [f for f in run(tmp_path, line, "ik_llama.cpp", "b3869") if f[1] != "info"]
    for version in ("b3870", None):
        new = [f for f in run(tmp_path, line, "ik_llama.cpp", version)
               if f[0] in ("space-in-list", "unmatched-pattern")]
        assert [(n, s) for n, s, _ in new] == [("space-in-list", "warning")]
    trailing = run(tmp_path, 'llama-server -m m.gguf -ngl 999 -ot "exps=CPU ,attn=CUDA0"')
    assert ("space-in-list", "error") in [(n, s) for n, s, _ in trailing]


def test_ik_before_the_change_reads_items_as_words(tmp_path: Path) -> None:
    found = run(tmp_path, 'llama-server -m m.gguf -ngl 999 -ot "exps=CPU attn_q_b=CUDA0,"', "ik_llama.cpp",
                "2025-06-01")
    assert [(n, s) for n, s, _ in found if n in ("space-in-list", "trailing-comma")] == [("space-in-list", "error")]
    assert "attn_q_b=CUDA0" in next(m for n, _, m in found if n == "space-in-list")


def test_every_instance_on_one_value_is_a_finding(tmp_path: Path) -> None:
    found = run(tmp_path, r'llama-server -m m.gguf -ngl 999 -fit off -ot "blk\.3=CPU,blk\.4=CPU,blk\.5=CPU"')
    prefix = [m for n, _, m in found if n == "prefix-collision"]
    assert [m.split("'")[1] for m in prefix] == [r"blk\.3", r"blk\.4", r"blk\.5"]
    assert not any("more prefix-collision" in m for m in prefix)
    found = run(tmp_path, r'llama-server -m m.gguf -ngl 999 -fit off -ot "blk\.3=CPU" -ot "blk\.4=CPU"')
    assert len([n for n, _, _ in found if n == "prefix-collision"]) == 2


def test_prefix_collision_without_a_model(tmp_path: Path) -> None:
    path = tmp_path / "launch.sh"
    cases = {r"blk\.1=CPU": True, r"blk\.(1|2)\..*=CPU": False, "blk.(0|1|2).ffn.=CUDA0": False,
             "6.ffn_down_exps=CPU": True, "blk.1.*ffn=CPU": True}
    for value, fires in cases.items():
        path.write_text(f'llama-server -m unknown.gguf -ngl 999 -fit off -ot "{value}"\n')
        found = [f.name for f in lint([str(path)], config=Config()).findings]
        assert ("prefix-collision" in found) == fires, (value, found)


def test_messages_show_patterns_as_written(tmp_path: Path) -> None:
    found = run(tmp_path, r'llama-server -m m.gguf -ngl 999 -fit off -ot "exps=CPU,blk\.3\.ffn_up_exps=CUDA0"')
    shadowed = next(m for n, _, m in found if n == "shadowed-rule")
    assert r"'blk\.3\.ffn_up_exps=CUDA0'" in shadowed and "\\\\" not in shadowed
    assert "'exps=CPU'" in shadowed  # names the item that really takes the tensors


def test_without_gpus_every_well_formed_device_is_simulated(tmp_path: Path) -> None:
    # an item on CUDA3 whose regex has a space inside: reported, not left out
    line = r'llama-server -m m.gguf -ngl 999 -fit off -ot "blk\.3\. ffn_up_exps=CUDA3,exps=CPU"'
    found = run(tmp_path, line)
    assert [n for n, _, _ in found] == ["unmatched-pattern"]
    assert "contains a space" in found[0][2]
    # a well-formed name is not an unknown device when the machine's GPUs are not configured ...
    assert not [f for f in run(tmp_path, line.replace(" ffn", "ffn")) if f[0] == "unknown-device"]
    # ... but is when they are, and a malformed one always is
    assert [f[1] for f in run(tmp_path, line.replace(" ffn", "ffn"), gpus=["CUDA0"]) if f[0] == "unknown-device"] \
        == ["error"]
    assert [f[1] for f in run(tmp_path, line.replace("CUDA3", "cuda3")) if f[0] == "unknown-device"] == ["error"]


def test_lint_and_explain_agree_without_gpus(tmp_path: Path) -> None:
    value = r"blk\.(3|4)\.ffn_.*_exps=CUDA2,exps=CPU"
    ex = explain(load_inventory(DEEPSEEK), engine("llama.cpp"), ["-ngl", "999", "-ot", value])
    assert ex.placement.devices["blk.3.ffn_up_exps.weight"] == "CUDA2"
    assert not ex.refusals and all(it.hits for it in ex.items)
    assert not [f for f in run(tmp_path, f'llama-server -m m.gguf -ngl 999 -fit off -ot "{value}"')
                if f[0] in ("unknown-device", "item-not-simulated", "unmatched-pattern", "shadowed-rule")]


def test_ik_ignores_ot_without_offload(tmp_path: Path) -> None:
    found = run(tmp_path, 'llama-server -m m.gguf -ngl 0 -ot "exps=CPU"', "ik_llama.cpp")
    assert [(n, s) for n, s, _ in found if n == "item-not-simulated"] == [("item-not-simulated", "error")]


def test_long_items_are_quoted_by_their_ends_but_fixes_stay_whole(tmp_path: Path) -> None:
    """A llama-fit-params style item hundreds of characters long: the finding names it by its start
    and end (its column points into it), and the replacement it asks for is printed whole."""
    blocks = "|".join(str(i) for i in range(3, 61))
    item = f"blk\\.({blocks})\\.ffn.*=CPU"
    found = run(tmp_path, f'llama-server -m m.gguf -ngl 999 -fit off -ot "{item}"')
    moved = [m for n, _, m in found if n == "always-active-to-cpu"]
    assert moved, found
    msg = moved[0]
    pattern = item.removesuffix("=CPU")
    assert msg.startswith("'blk\\.(3|4|") and "\u2026" in msg and f"({len(pattern):,} chars)" in msg
    assert pattern not in msg
    assert msg.endswith(f"(write 'blk\\.({blocks})\\.ffn_.*_exps' to move only the routed experts)")  # whole
