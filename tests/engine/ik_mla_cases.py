"""The lines on which ik_llama.cpp 0.1.5's MLA compute buffers (deepseek2, glm-dsa) are measured:
shared by the engine test that measures them (tests/engine/test_ik_mla_compute.py) and the
default-suite test that holds moeconf's model of them to the recorded figures
(tests/test_memory_ik_mla.py, tests/data/ik_mla_figures.json).

The cut layouts are those of tests/engine/ik_compute_cases.py (real layer shapes and vocabulary,
fewer blocks and experts), the routed experts on the CPU, every layer on one or two RPC servers
(see that module's note on how a CPU-only ik build is given them). The lines cover the context
(4k to 32k), the ubatch (512, 2048), `-mla` 1/2/3, flash attention on and off, `-amb` and two
devices."""

from __future__ import annotations

from tests.engine import ik_compute_cases

MODELS: tuple[str, ...] = ("deepseek-v3", "glm-5")

# engine flags beyond `-ngl 999 -ot exps=CPU` and the devices; "2dev": two RPC servers
LINES: list[str] = [
    "-c 4096", "-c 8192", "-c 16384", "-c 32768",
    "-c 4096 -b 2048 -ub 2048", "-c 8192 -b 2048 -ub 2048", "-c 32768 -b 2048 -ub 2048",
    "-c 8192 -mla 2", "-c 32768 -mla 2",
    "-c 32768 -amb 512", "-c 32768 -b 2048 -ub 2048 -amb 512", "-c 16384 -amb 256",
    "-c 4096 -fa off", "-c 16384 -fa off", "-c 8192 -mla 2 -fa off", "-c 32768 -fa off -amb 512",
    "-c 32768 -mla 1", "-c 8192 -mla 1 -fa off",
    "2dev -c 16384 -b 2048 -ub 2048",
]


def cases() -> list[tuple[str, str]]:
    return [(m, line) for m in MODELS for line in LINES]


n_devices = ik_compute_cases.n_devices
user_args = ik_compute_cases.user_args
engine_args = ik_compute_cases.engine_args
cut_layout = ik_compute_cases.cut_layout
