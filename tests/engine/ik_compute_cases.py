"""The cut layouts and command lines on which ik_llama.cpp 0.1.5's compute buffers are measured
against moeconf's estimate for ik (llama.cpp's graph of the same placement, moeconf/memory/
ikarchs.py): shared by the engine test that measures them (tests/engine/test_ik_compute.py) and
the default-suite test that holds the margin to the recorded figures
(tests/test_memory_ik_compute.py, tests/data/ik_compute_figures.json).

One cut layout per architecture of the shipped manifests that ik loads (real layer shapes and
vocabulary, fewer blocks and experts: compute depends on the shapes, the ubatch and the context,
not on how many blocks or experts there are). Each line runs with every layer on the RPC
device(s), the routed experts on the CPU (all but one line) or with their layer: the two ends of
what `fit` chooses.

A CPU-only ik build counts its CPU as device 0 and hands a layer given to device index i the
buffer type of raw device i (src/llama.cpp, llama_default_buffer_type_offload), so with `-dev`
naming the RPC servers every layer lands in CPU buffers. The measuring runs therefore give no
`-dev` and `-ts 0,1[,1]`: the CPU takes no layer, the RPC servers every layer (and the output), and
the KV cache follows the layers. The test checks from ik's logged buffers that weights and KV land
where moeconf puts them for the user's line (`user_args`: one or two GPUs, `-dev` naming them)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from moeconf.fixtures.layouts import LAYOUTS, ModelLayout
from tests.engine import ik_newer_cases

# layout -> its cut (blocks, nextn block included; experts); the newer architectures' cuts are
# those ik's weights and KV are checked on (ik_newer_cases)
CUTS: dict[str, dict[str, int]] = {
    "qwen3-30b-a3b": {"blocks": 8, "experts": 16},
    "glm-4.5-air": {"blocks": 4, "experts": 16},  # 1 dense + 2 MoE + the MTP block
    "deepseek-v3": {"blocks": 4, "experts": 8},  # 3 dense + 1 MoE
    "gpt-oss-20b": {"blocks": 4, "experts": 16},
    "llama-4-maverick": {"blocks": 4, "experts": 16},
    **ik_newer_cases.CUTS,
}

# the measured lines: engine flags beyond `-ngl 999 -ot exps=CPU` and the devices; "2dev": two
# RPC servers, the layers split between them; "gpu": no -ot (the routed experts on the RPC device)
LINES: list[str] = [
    "-c 32768",
    "-c 32768 -ctk q8_0 -ctv q8_0",  # Grok: ik forces flash attention off and refuses a quantized V
    "-c 32768 -b 2048 -ub 2048",
    "2dev -c 32768",
    "gpu -c 32768",
]
_WORDS = ("2dev", "gpu")
# the MLA architectures at shorter contexts: ik's buffer grows with the context (memory/ikmla.py models it)
EXTRA_LINES: dict[str, list[str]] = {"deepseek-v3": ["-c 8192", "-c 16384"], "glm-5": ["-c 8192", "-c 16384"]}


def cut_layout(name: str) -> ModelLayout:
    if name in ik_newer_cases.CUTS:  # its per-block patterns cut with it
        return ik_newer_cases.cut_layout(name)
    return dataclasses.replace(LAYOUTS[name], key=f"{name}-cut", **CUTS[name])


def cases() -> list[tuple[str, str]]:
    return [(m, line) for m in CUTS for line in [*LINES, *EXTRA_LINES.get(m, [])]]


def n_devices(line: str) -> int:
    return 2 if line.split()[0] == "2dev" else 1


def flags(line: str) -> list[str]:
    return [w for w in line.split() if w not in _WORDS]


def overrides(line: str) -> list[str]:
    return [] if "gpu" in line.split() else ["-ot", "exps=CPU"]


def user_args(line: str, endpoints: list[str], layer_split: str | None = None) -> list[str]:
    """The line as a user with one or two GPUs writes it (what moeconf explains)."""
    eps = endpoints[:n_devices(line)]
    ts = ["-ts", layer_split or ",".join("1" for _ in eps)] if len(eps) > 1 else []
    return ["--rpc", ",".join(eps), "-dev", ",".join(f"RPC0[{e}]" for e in eps), "-ngl", "999", *ts,
            *overrides(line), *flags(line)]


def engine_args(line: str, endpoints: list[str]) -> list[str]:
    """The line as the measuring run gives it to a CPU-only ik build (see the module's note)."""
    eps = endpoints[:n_devices(line)]
    return ["--rpc", ",".join(eps), "-ngl", "999", "-ts", ",".join(["0", *("1" for _ in eps)]), *overrides(line),
            *flags(line)]


def cut_path(folder: Path, name: str) -> Path:
    return folder / f"{name}-cut.gguf"


# --- reading ik's log: each buffer's size per device -------------------------------------------------
COMPUTE_LOG = re.compile(r"llama_init_from_model: +(\S+) compute buffer size = +([\d.]+) MiB")
KV_LOG = re.compile(r"llama_kv_cache_init: +(\S+) KV buffer size = +([\d.]+) MiB")


def device_key(name: str, endpoints: list[str]) -> str:
    """A buffer's device as recorded: CPU, or GPUi for the i-th RPC server (ports change per run)."""
    for i, e in enumerate(endpoints):
        if name == f"RPC0[{e}]":
            return f"GPU{i}"
    return name


def by_device(pattern: re.Pattern[str], log: str, endpoints: list[str]) -> dict[str, float]:
    """The sizes `pattern` finds in ik's log (device, MiB), summed per device."""
    out: dict[str, float] = {}
    for m in pattern.finditer(log):
        key = device_key(m.group(1), endpoints)
        out[key] = round(out.get(key, 0.0) + float(m.group(2)), 2)
    return out
