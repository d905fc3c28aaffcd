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

from typing import TYPE_CHECKING

from tests.engine import ik_compute_cases

if TYPE_CHECKING:
    from moeconf.model.inventory import Inventory

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


# MLA architectures whose ik compute is refused (moeconf/memory/ikarchs.py COMPUTE_DIFFERS) because ik's MLA
# attention model misses their measured buffers by far: the same lines, the model applied as a trial
# (tests/data/ik_mla_mistral4.json, held by tests/test_memory_ik_mistral4.py)
DIFFERS: tuple[str, ...] = ("mistral-small-4",)
# the lines CI re-measures for them: where the model under-sizes ik's buffer most, and over-sizes it most
DIFFERS_CI_LINES: tuple[str, ...] = ("-c 32768 -b 2048 -ub 2048", "-c 4096 -b 2048 -ub 2048")


def differs_cases(every: bool = True) -> list[tuple[str, str]]:
    return [(m, line) for m in DIFFERS for line in LINES if every or line in DIFFERS_CI_LINES]


def as_if_modelled(inv: Inventory, line: str, endpoints: list[str],
                   layer_devices: list[int] | None) -> dict[str, float]:
    """moeconf's compute figure per recorded device (CPU, GPUi; MiB, margin included) were ik's MLA
    attention model (memory/ikmla.py) applied to this architecture (a trial: it is refused)."""
    import moeconf.memory.ikarchs as ikarchs
    from moeconf.engines import engine
    from moeconf.explanation import explain
    from moeconf.memory import read_settings
    from moeconf.sizing import estimate_explained

    ik = engine("ik_llama.cpp", "0.1.5")
    args = user_args(line, endpoints)
    saved = ikarchs.MLA_MODELLED
    ikarchs.MLA_MODELLED = {**saved, inv.arch: "(trial)"}  # type: ignore[misc]
    try:
        est = estimate_explained(explain(inv, ik, args, gpus=[], layer_devices=layer_devices), read_settings(args, ik))
    finally:
        ikarchs.MLA_MODELLED = saved  # type: ignore[misc]
    assert est.complete, est.notes
    return {ik_compute_cases.device_key(d, endpoints): round(m.compute / 2**20, 2) for d, m in est.devices.items()}


def worst_under(rows: list[dict[str, object]], predicted: list[dict[str, float]]) -> float:
    """The most by which a device's logged compute buffer exceeded the trial model's figure (MiB)."""
    out = -1e9
    for row, pred in zip(rows, predicted, strict=True):
        compute = row["compute"]
        assert isinstance(compute, dict)
        out = max(out, *(mib - pred[key] for key, mib in compute.items()))
    return round(out, 2)
