"""ik_llama.cpp on the newer architectures (moeconf/memory/ikarchs.py): moeconf's weights and KV
cache held to the buffer sizes ik_llama.cpp 0.1.5 logged on real loads of cut layouts
(tests/data/ik_newer_figures.json, measured by tests/engine/test_ik_newer.py; the engine suite
measures them again). Their compute is llama.cpp's graph plus a margin measured on ik
(tests/test_memory_ik_compute.py).

Tolerances: weights within 1 MiB (all of ik's model buffers, plus the `wkv_b` it computes for
glm-dsa), KV within 0.01 MiB (ik logs two decimals)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.fixtures.writer import write_layout
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.memory.ikarchs import KV_ONLY, kv_only
from moeconf.memory.support import unmodelled
from moeconf.model.inventory import Inventory
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.engine import ik_newer_cases as cases

DATA = Path(__file__).parent / "data" / "ik_newer_figures.json"
ROWS: list[dict[str, Any]] = json.loads(DATA.read_text())
KV_ROWS = [r for r in ROWS if "line" in r]
MiB = 1024 * 1024
EP = "127.0.0.1:50052"
IK = engine("ik_llama.cpp", "0.1.5")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Inventory]:
    folder = tmp_path_factory.mktemp("iknewer")
    out = {}
    for name in [*cases.CUTS, *cases.KV_ONLY_CUTS]:
        path = cases.cut_path(folder, name)
        write_layout(cases.cut_layout(name), path, vocab=256)  # the tensors' shapes keep the real vocabulary
        out[name] = load_inventory(path)
    return out


def _estimate(inv: Inventory, line: str) -> tuple[MemoryEstimate, set[str]]:
    args = cases.engine_args(line, None if line.startswith("host") else EP)
    ex = explain(inv, IK, args, gpus=[])
    unused = {n for n, d in ex.placement.devices.items() if d is None}
    return estimate_explained(ex, read_settings(args, IK)), unused


def mismatches(row: dict[str, Any], est: MemoryEstimate, inv: Inventory, unused: set[str]) -> list[str]:
    """How moeconf's estimate differs from ik's logged figures of one line (empty: within tolerance)."""
    out = []
    if row.get("refused"):
        return [] if est.problems else ["ik refused the settings; moeconf did not say it would"]
    ik = row["ik"]
    weights = sum(m.weights for m in est.devices.values())
    if row["line"].startswith("host"):  # one mmap'ed host buffer: ik logs the file span (ik_newer_cases)
        weights += cases.skipped_in_span(inv, unused)
    if abs(weights / MiB - ik["weights"] - ik["computed"]) > 1.0:
        out.append(f"weights {weights / MiB:.2f} MiB, ik {ik['weights'] + ik['computed']:.2f}")
    kv = sum(m.kv for m in est.devices.values()) / MiB
    if abs(kv - ik["kv"]) > 0.01:
        out.append(f"KV {kv:.2f} MiB, ik {ik['kv']:.2f}")
    return out


def test_every_architecture_and_line_was_measured() -> None:
    assert {r["model"] for r in KV_ROWS} == set(cases.CUTS) | set(cases.KV_ONLY_CUTS)
    assert {(r["model"], r["line"]) for r in KV_ROWS} == set(cases.kv_cases())
    placed = {r["model"]: 0 for r in ROWS if "placement" in r}
    for r in ROWS:
        if "placement" in r:
            assert r["disagreements"] == 0, r
            placed[r["model"]] += 1
    assert placed == {m: len(cases.PLACEMENT_LINES) for m in cases.CUTS}
    assert {cases.cut_layout(m).arch for m in cases.CUTS} == set(KV_ONLY)


@pytest.mark.parametrize("row", KV_ROWS, ids=[f"{r['model']}:{r['line']}" for r in KV_ROWS])
def test_weights_and_kv_match_ik(row: dict[str, Any], models: dict[str, Inventory]) -> None:
    inv = models[row["model"]]
    assert unmodelled(inv, "ik_llama.cpp") == []
    est, unused = _estimate(inv, row["line"])
    assert mismatches(row, est, inv, unused) == []
    if kv_only(inv.arch, "ik_llama.cpp") and not row.get("refused"):
        # compute from llama.cpp's graph plus ik's margin, or (where llama.cpp's graph is not modelled
        # for the placement: every layer on the CPU) KV known and compute "?" with the next step
        assert est.complete or (est.kv_known and any(n.startswith("next step:") for n in est.notes)), est.notes


def test_a_wrong_figure_or_a_wrong_model_is_caught(models: dict[str, Inventory],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    row = next(r for r in KV_ROWS if r["model"] == "qwen3.5-35b-a3b" and r["line"] == "-c 5000 -fa off -np 3")
    inv = models["qwen3.5-35b-a3b"]
    est, unused = _estimate(inv, row["line"])
    assert mismatches(row, est, inv, unused) == []
    # a figure 0.5 MiB off, in KV or in weights
    for key, delta in (("kv", 0.5), ("weights", 1.5)):
        bad = {**row, "ik": {**row["ik"], key: row["ik"][key] + delta}}
        assert any(m.startswith(key if key == "weights" else "KV") for m in mismatches(bad, est, inv, unused))
    # a wrong model: the recurrent state kept for one sequence more than ik keeps
    import moeconf.memory.recurrent as rec

    monkeypatch.setattr(rec.RecurrentShape, "state_bytes",
                        lambda self, n: (self.n_embd_r + self.n_embd_s) * 4 * (max(1, n) + 1))
    wrong, _ = _estimate(inv, row["line"])
    assert any(m.startswith("KV") for m in mismatches(row, wrong, inv, unused))


def test_a_wrong_mla_figure_or_model_is_caught_on_mistral4(models: dict[str, Inventory],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Mistral-Small-4 (build_deepseek2 on ik): the wkv_b ik computes at load at the default -mla 3, and the
    # latent cache (kv_lora_rank + n_rot a cell); -mla 1 computes nothing and keeps K and V^T
    inv = models["mistral-small-4"]
    for line in ("-c 4096", "-c 8192 -mla 1 -fa off"):
        row = next(r for r in KV_ROWS if r["model"] == "mistral-small-4" and r["line"] == line)
        est, unused = _estimate(inv, line)
        assert mismatches(row, est, inv, unused) == []
        assert (row["ik"]["computed"] > 0) == (line == "-c 4096")
        for key, delta, what in (("kv", 0.5, "KV"), ("computed", 1.5, "weights")):
            bad = {**row, "ik": {**row["ik"], key: row["ik"][key] + delta}}
            assert any(m.startswith(what) for m in mismatches(bad, est, inv, unused)), (line, key)
    # a wrong model: the tensors ik computes at load left out
    import sys

    row = next(r for r in KV_ROWS if r["model"] == "mistral-small-4" and r["line"] == "-c 4096")
    monkeypatch.setattr(sys.modules["moeconf.memory.estimate"], "computed_weights", lambda *a, **k: {})
    wrong, unused = _estimate(inv, row["line"])
    assert any(m.startswith("weights") for m in mismatches(row, wrong, inv, unused))


def test_on_llama_cpp_nothing_changes() -> None:
    # the KV-only mode is ik's alone: on llama.cpp these architectures stay as modelled or refused
    for arch in KV_ONLY:
        assert not kv_only(arch, "llama.cpp")


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("full_attention_interval", 3, "qwen3next.full_attention_interval = 3 on ik_llama.cpp"),
    ("ssm.inner_size", 8192, "value head width (256) other than ssm.state_size (128)"),
    # a key ik's qwen3next loader reads (moeconf/engines/archkeys.py IK) that moeconf does not model; one it
    # does not read (attention.temperature_scale_x) changes nothing (test_an_unread_key_changes_nothing_on_ik)
    ("attention.key_length_swa", 128, "a key moeconf does not read"),
])
def test_what_ik_reads_differently_is_refused(tmp_path: Path, key: str, value: int, fragment: str) -> None:
    data = json.loads((Path(__file__).resolve().parent.parent / "examples" / "models"
                       / "qwen3-next-80b-a3b.manifest.json").read_text())
    data["metadata"]["hparams"][key] = value
    if key not in data["metadata"]["arch_keys"]:
        data["metadata"]["arch_keys"].append(key)
    p = tmp_path / "m.manifest.json"
    p.write_text(json.dumps(data))
    inv = load_inventory(p)
    why = unmodelled(inv, "ik_llama.cpp")
    assert any(fragment in w for w in why), why
    args = ["-ngl", "999", "-c", "8192"]
    est = estimate_explained(explain(inv, IK, args, gpus=["CUDA0"]), read_settings(args, IK))
    assert not est.complete and not est.kv_known and all(m.kv == 0 for m in est.devices.values())


def test_an_unread_key_changes_nothing_on_ik(tmp_path: Path) -> None:
    data = json.loads((Path(__file__).resolve().parent.parent / "examples" / "models"
                       / "qwen3-next-80b-a3b.manifest.json").read_text())
    data["metadata"]["hparams"]["attention.temperature_scale_x"] = 1
    data["metadata"]["arch_keys"].append("attention.temperature_scale_x")
    p = tmp_path / "m.manifest.json"
    p.write_text(json.dumps(data))
    assert unmodelled(load_inventory(p), "ik_llama.cpp") == []


# the MoE architectures in ik's tables that ik 0.1.5 fails to load (ikarchs.IK_FAILS): the layout, and what
# the refusal names (the ik function or table, and the engine's own error)
IK_FAILING = {"dbrx": ("dbrx", "create_std_ffn_exps"), "minicpm": ("minicpm-moe-8x2b", "LLM_TENSOR_NAMES"),
              "granite": ("granite-synthetic-moe", "'__missing__'"),
              "refact": ("refact-synthetic-moe", "'__missing__'")}


@pytest.mark.parametrize("arch", sorted(IK_FAILING))
def test_what_ik_cannot_load_is_refused_saying_why(arch: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from moeconf.cli import main
    from moeconf.fixtures.layouts import LAYOUTS
    from moeconf.memory.ikarchs import IK_FAILS

    assert set(IK_FAILS) == set(IK_FAILING) and not set(IK_FAILS) & KV_ONLY
    key, fragment = IK_FAILING[arch]
    path = tmp_path / f"{key}.gguf"
    write_layout(LAYOUTS[key], path, vocab=256)
    inv = load_inventory(path)
    assert inv.arch == arch
    why = unmodelled(inv, "ik_llama.cpp")
    assert len(why) == 1 and fragment in why[0] and "ik 0.1.5" in why[0], why
    assert unmodelled(inv, "llama.cpp") == []  # the next step it names
    rc = main(["fit", str(path), "--gpu", "24GiB", "--engine", "ik_llama.cpp", "--", "-c", "8192"])
    err = capsys.readouterr().err
    assert rc != 0 and fragment in err and "next step: run it on llama.cpp (--engine llama.cpp)" in err, err


@pytest.mark.parametrize(("key", "value"), [("attention.shared_kv_layers", 0), ("attention.shared_kv_layers", 4),
                                            ("embedding_length_per_layer_input", 256)])
def test_a_key_only_ik_reads_is_modelled_at_zero_only(key: str, value: int, models: dict[str, Inventory]) -> None:
    # Gemma 4 on ik: both loaders read these two keys, and moeconf models them at 0 only (keys.neutral), on ik as on
    # llama.cpp; every published file of the MoE has 0

    inv = models["gemma-4-26b-a4b"]
    assert inv.metadata.hparam(key) == 0 and unmodelled(inv, "ik_llama.cpp") == []
    hparams = tuple((k, value if k == key else v) for k, v in inv.metadata.hparams)
    changed = dataclasses.replace(inv, metadata=dataclasses.replace(inv.metadata, hparams=hparams))
    why = unmodelled(changed, "ik_llama.cpp")
    assert why == ([] if value == 0 else [f"memory is not modelled for gemma4.{key} on ik_llama.cpp (a key moeconf "
                                          "does not read for gemma4)"]), why


@pytest.mark.parametrize(("key", "drop", "fragment"), [
    ("step-3.5-flash", "", "step35.swiglu_clamp_exp or swiglu_limits"),
    ("step-3.5-flash", "", "step35.swiglu_clamp_shexp or swiglu_limits_shared"),
    ("step-3.5-flash", "", "step35.rope.freq_base_swa or rope.freq_base_per_layer"),
    ("mistral-small-4", "leading_dense_block_count", "mistral4.leading_dense_block_count"),
    ("mimo-v2-flash", "rope.freq_base_swa", "mimo2.rope.freq_base_swa"),
])
def test_a_file_ik_fails_to_load_is_refused_there(key: str, drop: str, fragment: str, tmp_path: Path) -> None:
    # a key ik 0.1.5 requires that llama.cpp does not (ikarchs.IK_REQUIRED_KEYS): the published conversions write
    # it; a file without it (the step-3.5-flash layout, which has no SwiGLU limits; the others with the key taken
    # out) fails to load on ik, and moeconf says so there; llama.cpp models it

    from moeconf.fixtures.layouts import LAYOUTS

    lay = LAYOUTS[key]
    if key == "mimo-v2-flash":
        lay = cases.cut_layout(key)  # no MTP block (refused on ik for that alone)
    path = tmp_path / f"{key}.gguf"
    write_layout(lay, path, vocab=256)
    inv = load_inventory(path)
    if drop:
        hparams = tuple((k, v) for k, v in inv.metadata.hparams if k != drop)
        keys = tuple(k for k in inv.metadata.arch_keys or () if k != drop)
        inv = dataclasses.replace(inv, metadata=dataclasses.replace(inv.metadata, hparams=hparams, arch_keys=keys))
    why = unmodelled(inv, "ik_llama.cpp")
    assert any(fragment in w and "it fails to load" in w for w in why), why
    assert unmodelled(inv, "llama.cpp") == []
    # the cut measured on ik has it, and nothing is refused
    assert unmodelled(load_inventory(_write(cases.cut_layout(key), tmp_path / "cut.gguf")), "ik_llama.cpp") == []


def _write(layout: Any, path: Path) -> Path:
    write_layout(layout, path, vocab=256)
    return path


def test_an_mtp_block_ik_does_not_load_is_refused(tmp_path: Path) -> None:
    # MiMo-V2-Flash with its MTP block (nextn_predict_layers 1) and Step-3.5-Flash with its 3: ik 0.1.5's loaders
    # create no nextn.* tensor, so the file does not load on ik ("wrong number of tensors", seen on MiMo-V2-Flash by
    # tests/engine/test_required_tensors.py): refused on ik with that reason; llama.cpp models it. The cut
    # measured on ik has no MTP block (tests/engine/ik_newer_cases.py)
    from moeconf.fixtures.layouts import LAYOUTS
    from tests.step35_variant import write_variant

    step35 = load_inventory(write_variant(tmp_path / "step35.gguf"))
    assert unmodelled(step35, "ik_llama.cpp")[0].startswith(
        "ik_llama.cpp refuses to load this file: its step35 loader never creates blk.45.nextn.eh_proj.weight")
    assert unmodelled(step35, "llama.cpp") == []

    path = tmp_path / "mimo-v2-flash.gguf"
    write_layout(LAYOUTS["mimo-v2-flash"], path, vocab=256)
    inv = load_inventory(path)
    assert inv.metadata.hparam("nextn_predict_layers") == 1 and kv_only(inv.arch, "ik_llama.cpp")
    assert unmodelled(inv, "ik_llama.cpp")[0].startswith(
        "ik_llama.cpp refuses to load this file: its mimo2 loader never creates blk.48.nextn.eh_proj.weight")
    assert unmodelled(inv, "llama.cpp") == []
    assert cases.cut_layout("mimo-v2-flash").nextn == 0
    # the key without nextn.* tensors: ik would load the block as a trunk layer, which is not modelled
    bare = dataclasses.replace(inv, tensors=tuple(t for t in inv.tensors if ".nextn." not in t.name))
    assert unmodelled(bare, "ik_llama.cpp") == [
        "memory is not modelled for mimo2.nextn_predict_layers on ik_llama.cpp (ik 0.1.5 does not read it: its MTP "
        "blocks would be taken as trunk layers)"]


def test_a_wrong_figure_is_caught_on_mimo2(models: dict[str, Inventory]) -> None:
    inv = models["mimo-v2-flash"]
    for row in [r for r in KV_ROWS if r["model"] == "mimo-v2-flash"]:
        est, unused = _estimate(inv, row["line"])
        assert mismatches(row, est, inv, unused) == []
        for key, delta, what in (("kv", 0.02, "KV"), ("weights", 1.5, "weights")):
            bad = {**row, "ik": {**row["ik"], key: row["ik"][key] + delta}}
            assert any(m.startswith(what) for m in mismatches(bad, est, inv, unused)), (row["line"], key)
