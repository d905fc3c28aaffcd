"""Files a launch loads beside the model (a multimodal projector, LoRA adapters, control vectors)
are a refused setting family (engines/extrafiles.py): every flag and variable that loads one in the
pinned engines makes the memory estimate incomplete with a note naming it, `explain` prints "?",
`fit` refuses; the options of those files that load nothing alone leave the estimate complete and
equal to the one without them."""

from __future__ import annotations

import pytest

import moeconf.memory.families as families
from moeconf.cli import main
from moeconf.engines import engine as engine_from_name
from moeconf.engines.argvread import known_flags
from moeconf.explanation import explain
from moeconf.memory import read_settings
from moeconf.memory.estimate import MemoryEstimate
from moeconf.model.load import load_inventory
from moeconf.sizing import estimate_explained
from tests.conftest import EXAMPLES

VL = str(EXAMPLES / "models" / "qwen3-vl-30b-a3b.manifest.json")
# ik_llama.cpp's compute is modelled on the classic architectures only (memory/ikarchs.py)
MODEL = {"llama.cpp": VL, "ik_llama.cpp": str(EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json")}
BASE = ["-c", "8192", "-ngl", "99", "-ot", "exps=CPU"]


def _estimate(engine: str, flags: list[str], env: dict[str, str] | None = None,
              binary: str = "llama-server") -> MemoryEstimate:
    inv = load_inventory(MODEL[engine])
    eng = engine_from_name(engine)
    argv = [binary, *BASE, *flags]
    return estimate_explained(explain(inv, eng, argv), read_settings(argv, eng, env))


def _refused(est: MemoryEstimate, *words: str) -> None:
    assert not est.complete, est.notes
    notes = [n for n in est.notes if n.startswith("memory is not modelled with files loaded beside the model")]
    assert notes and all(any(w in n for n in notes) for w in words), est.notes
    assert all(m.kv == 0 and m.compute == 0 for m in est.devices.values())


def _modelled(est: MemoryEstimate, engine: str = "llama.cpp", binary: str = "llama-server") -> None:
    assert est.complete, est.notes
    base = _estimate(engine, [], binary=binary)  # the same binary: llama-server reserves fewer output rows
    assert {d: m.total for d, m in est.devices.items()} == {d: m.total for d, m in base.devices.items()}


@pytest.mark.parametrize(("engine", "flag", "value"), [
    ("llama.cpp", "-mm", "mmproj-F16.gguf"), ("llama.cpp", "--mmproj", "mmproj-F16.gguf"),
    ("llama.cpp", "-mmu", "https://example.org/mmproj.gguf"), ("llama.cpp", "--mmproj-url", "https://x/m.gguf"),
    ("llama.cpp", "--lora", "adapter.gguf"), ("llama.cpp", "--lora-scaled", "adapter.gguf:0.5"),
    ("llama.cpp", "--control-vector", "happy.gguf"), ("llama.cpp", "--control-vector-scaled", "happy.gguf:0.8"),
    ("ik_llama.cpp", "--mmproj", "mmproj-F16.gguf"), ("ik_llama.cpp", "--mmproj-url", "https://x/m.gguf"),
    ("ik_llama.cpp", "--lora", "adapter.gguf"), ("ik_llama.cpp", "--control-vector", "happy.gguf"),
])
def test_each_file_flag_is_refused(engine: str, flag: str, value: str) -> None:
    assert flag in known_flags(engine_from_name(engine)), "the flag is not in the pinned parser's table"
    _refused(_estimate(engine, [flag, value]), f"{flag} {value}")


@pytest.mark.parametrize(("engine", "flags"), [
    ("llama.cpp", ["--lora-init-without-apply"]), ("llama.cpp", ["--no-mmproj"]),
    ("llama.cpp", ["--mmproj-offload"]), ("llama.cpp", ["--no-mmproj-offload"]),
    ("llama.cpp", ["--control-vector-layer-range", "1", "10"]), ("ik_llama.cpp", ["--no-mmproj-offload"]),
])
def test_options_that_load_nothing_alone_change_nothing(engine: str, flags: list[str]) -> None:
    _modelled(_estimate(engine, flags), engine)


def test_the_projector_kept_in_host_memory_is_still_refused_and_says_where() -> None:
    for flags in (["--mmproj", "m.gguf", "--no-mmproj-offload"], ["--mmproj", "m.gguf", "-mmdev", "none"]):
        _refused(_estimate("llama.cpp", flags), "in host memory")
    # the last of --mmproj-offload / --no-mmproj-offload wins
    _refused(_estimate("llama.cpp", ["--no-mmproj-offload", "--mmproj", "m.gguf", "--mmproj-offload"]),
             "on the GPU unless")
    _refused(_estimate("llama.cpp", ["--mmproj", "m.gguf"], env={"LLAMA_ARG_MMPROJ_OFFLOAD": "0"}), "in host memory")


def test_variables_as_the_engine_reads_them() -> None:
    env = {"LLAMA_ARG_MMPROJ": "mmproj-F16.gguf"}
    _refused(_estimate("llama.cpp", [], env), "LLAMA_ARG_MMPROJ=mmproj-F16.gguf")
    # the command line replaces the variable's projector: one note, naming the flag
    est = _estimate("llama.cpp", ["--mmproj", "other.gguf"], env)
    _refused(est, "--mmproj other.gguf")
    assert not any("LLAMA_ARG_MMPROJ=" in n for n in est.notes)
    # llama-completion's option set has no projector options: it reads no variable for them
    _modelled(_estimate("llama.cpp", [], env, binary="llama-completion"), binary="llama-completion")
    # ik_llama.cpp reads no LLAMA_ARG_ variable for the projector
    _modelled(_estimate("ik_llama.cpp", [], env), "ik_llama.cpp")


def test_without_the_family_check_the_estimate_would_print_a_complete_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # the wrong answer: the check removed, explain prints numbers that leave the projector out
    monkeypatch.setattr(families, "unmodelled_extra_files", lambda _extra: [])
    assert _estimate("llama.cpp", ["--mmproj", "m.gguf"]).complete


def test_explain_prints_question_marks_and_fit_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", VL, "--", "llama-server", *BASE, "--mmproj", "m.gguf"]) == 0
    out = capsys.readouterr().out
    assert "multimodal projector" in out and "?" in out
    assert main(["fit", VL, "--gpu", "24GiB", "--", "--mmproj", "m.gguf"]) != 0
    assert "multimodal projector" in capsys.readouterr().err
