"""What the memory model does not model, it says so and refuses (issue 17): an architecture outside
`moeconf.memory.support.MODELLED`, or a `{arch}.*` key it does not read, makes memory incomplete
with a note naming it; `explain` prints the note and no KV or compute figure; `fit` refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import engine
from moeconf.explanation import explain
from moeconf.memory import estimate, read_settings
from moeconf.memory.ikarchs import kv_only
from moeconf.memory.support import MODELLED, NO_MEMORY_EFFECT, REFUSED, unmodelled
from moeconf.model.load import load_inventory
from moeconf.model.manifest import dumps_manifest, read_manifest

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "examples" / "models"


def _variant(tmp_path: Path, name: str, *, arch: str | None = None, key: tuple[str, int] | None = None) -> Path:
    data = json.loads((MODELS / "qwen3-30b-a3b.manifest.json").read_text())
    if arch is not None:
        data["metadata"]["arch"] = arch
    if key is not None:
        data["metadata"]["hparams"][key[0]] = key[1]
        data["metadata"]["arch_keys"].append(key[0])
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.manifest.json")), ids=lambda p: p.name)
@pytest.mark.parametrize("eng", ["llama.cpp", "ik_llama.cpp"])
def test_shipped_models_are_modelled(path: Path, eng: str) -> None:
    inv = read_manifest(path)
    assert inv.metadata.arch_keys, "a version-3 manifest records its architecture keys"
    if kv_only(inv.arch, eng):  # ik_llama.cpp: weights and KV by memory/ikarchs.py, compute from llama.cpp's graph
        assert unmodelled(inv, eng) == []
    elif inv.arch in REFUSED:  # measured and refused with its reason
        assert unmodelled(inv, eng) == [REFUSED[inv.arch]]
    elif eng in MODELLED[inv.arch].engines:
        assert unmodelled(inv, eng) == []
    else:  # modelled for llama.cpp only: a refusal naming the engine
        assert unmodelled(inv, eng) == [f"memory is not modelled for {inv.arch!r} on {eng}"]


def test_every_modelled_key_is_a_real_engine_key() -> None:
    # a typo in the tables would silently refuse (or, in NO_MEMORY_EFFECT, silently accept) a key
    src = Path.home() / ".cache/moeconf/engines/llama-cpp-python-0.3.36/src/vendor/llama.cpp/src/llama-arch.cpp"
    if not src.exists():
        pytest.skip("the pinned llama.cpp source is not unpacked (scripts/build-engines.sh llama)")
    text = src.read_text()
    for key in NO_MEMORY_EFFECT | {k for spec in MODELLED.values() for k in spec.keys}:
        assert f'"%s.{key}"' in text, key


@pytest.mark.parametrize(("arch", "key", "fragment"), [
    ("afmoe", None, "not modelled for the 'afmoe' architecture"),
    # a modelled hybrid whose file lacks what its model reads (memory/recurrent.py, replay_glm5next.py)
    ("glm5-next", None, "it lacks glm5-next.ssm.conv_kernel"),
    # a modelled architecture whose file lacks what its model reads (memory/replay_dsa.py)
    ("glm-dsa", None, "no attention.indexer.top_k (the engine needs them)"),
    ("qwen3moe", ("full_attention_interval", 4), "not modelled for qwen3moe.full_attention_interval"),
    ("qwen3moe", ("attn_logit_softcapping", 30), "not modelled for qwen3moe.attn_logit_softcapping"),
])
def test_unmodelled_is_incomplete_explained_and_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, key: tuple[str, int] | None,
        fragment: str) -> None:
    p = _variant(tmp_path, "m.manifest.json", arch=arch, key=key)
    inv = load_inventory(p)
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "32768"]
    eng = engine("llama.cpp")
    est = estimate(explain(inv, eng, argv, gpus=("CUDA0",)).placement, read_settings(argv, eng))
    assert not est.complete
    assert any(fragment in n for n in est.notes)
    assert all(m.kv == 0 and m.compute == 0 for m in est.devices.values())

    assert main(["explain", str(p), "--", *argv]) == 0
    out = capsys.readouterr().out
    assert fragment in out
    row = next(line for line in out.splitlines() if line.strip().startswith("CUDA0"))
    assert row.split()[2:4] == ["?", "?"] and ">=" in row

    for gpus in (["--gpu", "24GiB"], ["--gpu", "120GiB", "--gpu", "120GiB"]):
        assert main(["fit", str(p), *gpus, "-c", "32768"]) == 2
        captured = capsys.readouterr()
        assert fragment in captured.err and "-ot" not in captured.out


def test_manifest_keeps_hparams_and_arch_keys(tmp_path: Path) -> None:
    p = _variant(tmp_path, "m.manifest.json", key=("ssm.state_size", 128))
    inv = read_manifest(p)
    assert inv.metadata.hparam("ssm.state_size") == 128
    assert inv.metadata.hparam("attention.head_count") == 32  # a key with an attribute of its own
    assert "ssm.state_size" in (inv.metadata.arch_keys or ())
    again = tmp_path / "again.manifest.json"
    again.write_text(dumps_manifest(inv))
    assert read_manifest(again) == inv


@pytest.mark.parametrize(("value", "fragment"), [
    ("x", "metadata.hparams.k: expected an integer"),
    (["1", 2], "metadata.hparams.k[0]: expected an integer"),
])
def test_manifest_rejects_bad_hparams(tmp_path: Path, value: object, fragment: str) -> None:
    data = json.loads((MODELS / "qwen3-30b-a3b.manifest.json").read_text())
    data["metadata"]["hparams"]["k"] = value
    p = tmp_path / "bad.manifest.json"
    p.write_text(json.dumps(data))
    with pytest.raises(Exception, match=r"hparams") as e:
        read_manifest(p)
    assert fragment in str(e.value)
