"""The plan file (`plan.toml`), modelled with pydantic. `schemas/plan.schema.json` is generated
from these models (`moeconf schema`); a test fails when it is stale."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# host:port with no comma or space anywhere (what `_rpc_form` accepts)
RPC_PATTERN = r"^[^, ]+:[0-9]+$"
# The engines read integer flags with std::stoi: larger values stop them at start-up.
INT_MAX = 2**31 - 1


def _least(flag: str) -> int:
    """moeconf's lower bound for the option's value (the option table, engines/options.py)."""
    from moeconf.engines.options import row

    least = row(flag).minimum
    assert least is not None
    return least

DockerBackend = Literal["cpu", "cuda", "cuda13", "rocm", "vulkan", "intel", "musa"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    """The model whose tensors the rules place."""

    path: str = Field(
        description="A .gguf file (first or any shard of a split model) or a moeconf manifest .json, "
        "relative to the plan file."
    )
    serve_path: str | None = Field(
        default=None,
        description="The model path as the engine sees it (`-m`), e.g. inside a container. "
        "Defaults to `path` when that is a .gguf; required when `path` is a manifest and a target "
        "needs `-m`.",
    )


class EngineSection(_Section):
    """Which engine the compiled rules are for."""

    name: Literal["llama.cpp", "ik_llama.cpp"] = Field(default="llama.cpp", description="The engine.")
    version: str | None = Field(
        default=None,
        description="Engine version: a mainline build like `b7600`, or an ik_llama.cpp version. "
        "Default: the newest known.",
    )
    gpus: list[str] = Field(
        default=["CUDA0"],
        description="Buffer-type names of the GPUs, in order: `gpu` and `gpu0` are the first, `gpu1` "
        "the second. An empty list means a CPU-only machine.",
    )


class Flags(_Section):
    """Engine flags that bear on placement. moeconf emits them in the engine's own spelling."""

    n_gpu_layers: Annotated[int, Field(le=INT_MAX)] | Literal["all"] = Field(
        default="all",
        description="`-ngl`: layers offloaded by default. Tensors no rule selects stay where this puts "
        "them. `all` (the default) is emitted as `-ngl 999`.",
    )
    fit: bool | None = Field(
        default=None,
        description="llama.cpp `--fit`. Unset: moeconf emits `-fit off` whenever the plan places "
        "tensors by hand (fit would give up anyway, after possibly cutting the context). ik_llama.cpp "
        "refuses `--fit` together with `-ot`.",
    )
    ctx_size: int | None = Field(default=None, ge=_least("-c"), le=INT_MAX, description="`-c`: context size in tokens.")
    batch: int | None = Field(default=None, ge=_least("-b"), le=INT_MAX, description="`-b`: logical batch size.")
    ubatch: int | None = Field(default=None, ge=_least("-ub"), le=INT_MAX, description="`-ub`: physical batch size.")
    flash_attn: Literal["on", "off", "auto"] | None = Field(default=None, description="`-fa`.")
    cache_type_k: str | None = Field(default=None, description="`-ctk`: K cache type (f16, q8_0, ...).")
    cache_type_v: str | None = Field(default=None, description="`-ctv`: V cache type.")
    no_mmap: bool = Field(default=False, description="`--no-mmap`: read the weights instead of mapping them.")
    mlock: bool = Field(default=False, description="`--mlock`.")
    merge_qkv: bool = Field(default=False, description="ik_llama.cpp `-mqkv`: merge Q, K, V where their types agree.")
    merge_up_gate: bool = Field(
        default=False, description="ik_llama.cpp `-muge`: merge up and gate experts where both land together."
    )
    split_mode: Literal["none", "layer", "row", "graph", "attn"] | None = Field(default=None, description="`-sm`.")
    tensor_split: list[Annotated[float, Field(ge=0)]] | None = Field(
        default=None, description="`-ts`: proportions per GPU; also used to predict default placement. Unset "
        "with a fill rule over several GPUs (llama.cpp), moeconf chooses it from the budgets."
    )
    main_gpu: int | None = Field(default=None, ge=_least("-mg"), le=INT_MAX, description="`-mg`.")
    rpc: list[str] = Field(
        default=[], description="`--rpc` servers, `host:port` each.",
        # the same check as `_rpc_form`, for validators that read only the schema
        json_schema_extra={"items": {"type": "string", "pattern": RPC_PATTERN}},
    )
    threads: int | None = Field(default=None, ge=_least("-t"), le=INT_MAX, description="`-t`.")
    extra: list[str] = Field(default=[], description="More arguments, appended as given.")

    @field_validator("tensor_split")
    @classmethod
    def _finite(cls, v: list[float] | None) -> list[float] | None:
        import math

        for x in v or ():
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"{x} is not a proportion (a finite number >= 0)")
        return v

    @field_validator("rpc")
    @classmethod
    def _rpc_form(cls, v: list[str]) -> list[str]:
        for s in v:
            if not re.fullmatch(RPC_PATTERN, s):
                raise ValueError(f"{s!r} is not host:port")
        return v


class Targets(_Section):
    """Deployment details for the emitted forms."""

    binary: str | None = Field(default=None, min_length=1, pattern=r"^[^-]",
                               description="Server binary (not starting with `-`, which the engine would read "
                               "as an option). Default: `llama-server`.")
    host: str | None = Field(default=None, description="`--host`.")
    port: int | None = Field(default=None, ge=_least("--port"), le=65535, description="`--port`.")
    docker_image: str | None = Field(
        default=None, description="Image for `docker`/`compose`. Default: the engine's official server image."
    )
    docker_backend: DockerBackend = Field(default="cuda", description="Which official image flavour.")
    docker_volumes: list[str] = Field(default=[], description="`-v` mounts, `host:container`.")
    compose_service: str = Field(
        default="llama", pattern=r"^[a-zA-Z0-9._-]+$",
        description="Service name in the compose snippet: letters, digits, `.`, `_` and `-` (compose's own rule).",
    )
    llama_swap_model: str | None = Field(
        default=None, description="Model name in the llama-swap `models` entry. Default: the plan's file name."
    )


class BudgetSection(BaseModel):
    """Memory per device, for fill rules (`experts -> gpu, gpu1, cpu`): each device takes the
    selected tensors layer by layer while its predicted memory (weights, KV cache, compute,
    reserve) stays within its budget; the last device of the rule takes the rest. Keys are
    devices as rules name them (`gpu`, `gpu1`, `CUDA1`, `RPC0[host:port]`, `cpu`), values sizes."""

    model_config = ConfigDict(extra="allow", frozen=True, json_schema_extra={
        "additionalProperties": {"type": "string", "pattern": r"^\s*[0-9.]+\s*([KMGT]i?B?|B)?\s*$",
                                 "description": "A device's memory: \"24 GiB\", \"16GiB\", \"512MiB\"."}})

    reserve: str = Field(default="1GiB", description="Kept free on each GPU for what no engine reports "
                         "(CUDA context, cuBLAS workspace).")
    policy: Literal["first", "last"] = Field(
        default="first", description="Which layers fill first: the lowest blocks (`first`, the guides' layout) or "
        "the highest (`last`).")
    split: bool = Field(default=False, description="Let one more layer per device split by tensor kind to use "
                        "the remainder: the subset of its expert kinds (down, gate, up) with the most bytes that "
                        "still fits.")


_BW = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B)\s*(/\s*s)?\s*$"  # moeconf.machine.BANDWIDTH_PATTERN
_PCIE = r"^\s*([Gg][Ee][Nn]\s*)?[1-6](\.0)?\s*([xX]\s*[0-9]+)?\s*$"  # moeconf.machine.PCIE_PATTERN
_RAM = r"^\s*[Dd][Dd][Rr][345]\s*-\s*[0-9]+\s*[xX]\s*[0-9]+\s*$"  # moeconf.machine.RAM_PATTERN


class MachineSection(_Section):
    """The machine the plan runs on, for speed (docs/speed.md "The machine"): the same figures as
    the flags of `explain` and `fit`, which override them; what is left out is read from the
    machine itself (nvidia-smi, /proc) or the card table. A list gives one value per GPU, in order;
    a single value is every GPU's."""

    gpu_model: str | list[str] | None = Field(
        default=None, description="The card, as nvidia-smi or the card table names it: `RTX 4090`, `NVIDIA H200`.")
    gpu_bandwidth: Annotated[str, Field(pattern=_BW)] | list[Annotated[str, Field(pattern=_BW)]] | None = Field(
        default=None, description="GPU memory bandwidth, e.g. `1008GB/s`.")
    gpu_tflops: Annotated[float, Field(gt=0, le=100_000)] | list[Annotated[float, Field(gt=0, le=100_000)]] | None \
        = Field(default=None, description="GPU dense FP16 tensor TFLOP/s.")
    pcie: Annotated[str, Field(pattern=_PCIE)] | list[Annotated[str, Field(pattern=_PCIE)]] | None = Field(
        default=None, description="PCIe link, `GEN[xLANES]`: `4x16`, `5x8`.")
    host_bandwidth: str | None = Field(default=None, pattern=_BW, description="System RAM bandwidth, e.g. `90GB/s`.")
    ram_speed: str | None = Field(default=None, pattern=_RAM,
                                  description="System RAM as kind, MT/s and populated channels: `DDR5-6000x2`.")
    cores: int | None = Field(default=None, ge=1, le=4096, description="Physical CPU cores.")
    detect: bool = Field(default=True, description="Read what the machine reports (nvidia-smi, /proc); false: "
                         "this table and the flags only.")


class PlanModel(BaseModel):
    """A moeconf plan: which tensors go where, in the user's words."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="moeconf plan")

    rules: list[str] = Field(
        default=[],
        description="Placement rules, `SELECTOR -> DEVICE`, in order: later rules refine earlier ones. "
        "Write `rules` before the first [table].",
    )
    model: ModelSection
    engine: EngineSection = Field(default_factory=EngineSection)
    flags: Flags = Field(default_factory=Flags)
    targets: Targets = Field(default_factory=Targets)
    budget: BudgetSection | None = Field(default=None, description="Memory per device, for fill rules.")
    machine: MachineSection | None = Field(default=None, description="The machine, for speed: GPUs' cards and links, "
                                           "system RAM, cores.")
