"""Host weights on a CPU with AMX (issue 17): which weights llama.cpp's CPU backend, built with AMX, puts in its
`AMX` buffer, and their packed size (docs/memory-architectures.md, "Host weights on a CPU with AMX")."""

from __future__ import annotations

import os

from moeconf.model import ggml
from moeconf.model.inventory import Tensor

# type -> (ne[0] alignment, extra bytes per block in the packed layout); F16 unpacked
AMX_TYPES: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 0), "Q4_1": (32, 0), "Q8_0": (32, 4), "Q4_K": (256, 4), "Q5_K": (256, 4), "Q6_K": (256, 0),
    "IQ4_XS": (256, 2), "F16": (16, 0),
}
HOST_CPUS = ("amx", "plain")
_NOT_MUL_MAT = ("token_embd",)  # GET_ROWS


def amx_bytes(t: Tensor) -> int | None:
    """The tensor's size in the AMX buffer, or None when the loader does not put it there."""
    spec = AMX_TYPES.get(t.type)
    if spec is None or not t.name.endswith(".weight") or len(t.shape) < 2:
        return None
    if t.base in _NOT_MUL_MAT or t.base.endswith("_exps") or t.role == "experts":
        return None
    align, extra = spec
    ne0, ne1 = t.shape[0], t.shape[1]
    if ne0 % align or ne1 % 32:
        return None
    if t.type == "F16":
        return ggml.pad(t.nbytes, 32)
    block, size = ggml.quant_sizes()[ggml.type_ids()[t.type]]
    # get_alloc_size counts ne[1] rows only (N = ne[1], whatever ne[2])
    return ggml.pad(ne1 * (ne0 // block) * (size + extra), 32)


def resolve_host_cpu(choice: str) -> str:
    """`auto` -> this machine's CPU (`MOECONF_HOST_CPU` overrides the detection): `amx` when it has
    AMX-INT8 (Linux /proc/cpuinfo), else `plain`; any other choice as it is."""
    if choice != "auto":
        return choice
    env = os.environ.get("MOECONF_HOST_CPU")
    if env in HOST_CPUS:
        return env
    from moeconf.machine_detect import read

    flags = next((ln.split() for ln in (read("/proc/cpuinfo") or "").splitlines() if ln.startswith("flags")), [])
    return "amx" if "amx_int8" in flags else "plain"
