"""The lines on which ik_llama.cpp 0.1.5's MLA compute buffers (deepseek2, glm-dsa) are measured:
shared by the engine test that measures them (tests/engine/test_ik_mla_compute.py) and the
default-suite test that holds moeconf's model of them to the recorded figures
(tests/test_memory_ik_mla.py, tests/data/ik_mla_figures.json).

The cut layouts are those of tests/engine/ik_compute_cases.py (real layer shapes and vocabulary,
fewer blocks and experts), the routed experts on the CPU, every layer on one or two RPC servers
(see that module's note on how a CPU-only ik build is given them), or on one line the first layers
on the host. The lines cover the context (4k to 32k), the ubatch (512, 2048), `-mla` 1/2/3, flash
attention on and off, `-amb`, two devices and attention on the host."""

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


# "host": the first three of the DeepSeek-V3 cut's five layer slots on the host (ik's -ts 1,1 over the CPU and
# the RPC server; a user's -ngl 1), so that the host runs attention too
HOST_LINES: dict[str, list[str]] = {"deepseek-v3": ["host -c 16384"]}


# the lines the engine suite re-measures in CI (one of each form: the context, the worst ubatch line,
# -amb, flash attention off, -mla 1, the host), to keep .ci/run's time; MOECONF_IK_MLA_ALL=1 re-measures
# every line (about 40 real loads). The default suite holds the model to every recorded line.
CI_LINES: tuple[str, ...] = ("-c 8192", "-c 32768 -b 2048 -ub 2048", "-c 32768 -amb 512", "-c 16384 -fa off",
                             "-c 32768 -mla 1", "host -c 16384")


def cases(every: bool = True) -> list[tuple[str, str]]:
    return [(m, line) for m in MODELS for line in [*LINES, *HOST_LINES.get(m, [])] if every or line in CI_LINES]


def _host(line: str) -> bool:
    return line.split()[0] == "host"


def n_devices(line: str) -> int:
    return 1 if _host(line) else ik_compute_cases.n_devices(line)


def user_args(line: str, endpoints: list[str]) -> list[str]:
    """The line as a user with one or two GPUs writes it (what moeconf explains)."""
    if _host(line):
        return ["--rpc", endpoints[0], "-dev", f"RPC0[{endpoints[0]}]", "-ngl", "1", "-ot", "exps=CPU",
                *line.split()[1:]]
    return ik_compute_cases.user_args(line, endpoints)


def engine_args(line: str, endpoints: list[str]) -> list[str]:
    """The line as the measuring run gives it to a CPU-only ik build (ik_compute_cases' note)."""
    if _host(line):
        return ["--rpc", endpoints[0], "-ngl", "999", "-ts", "1,1", "-ot", "exps=CPU", *line.split()[1:]]
    return ik_compute_cases.engine_args(line, endpoints)


cut_layout = ik_compute_cases.cut_layout
