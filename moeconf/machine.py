"""The machine a command runs on, as the speed predictor needs it (issue 26, item 2).

A `Machine` holds what moves a command's bytes: each GPU's memory bandwidth, PCIe link and matrix
rate, the host's memory bandwidth and cores. Every figure carries where it came from (a card
table row and its source, what the machine itself reported, a flag, a plan's `[machine]`), so a
prediction can print its assumptions; a figure nothing gave is None, and `missing()` names it so
that the user is asked for it instead of given a number from a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One number and where it came from."""

    value: float
    source: str  # "table: <row> (<url>)", "nvidia-smi", "/proc/cpuinfo", "--host-bandwidth", "plan [machine]", ...

    def json(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


@dataclass(frozen=True)
class GPU:
    """One GPU as the predictor reads it (the device name is the engine's, CUDA0 ...)."""

    device: str
    name: str | None = None  # the card's model, as a table row names it
    memory_bandwidth: Figure | None = None  # bytes/s, the card's peak
    pcie_bandwidth: Figure | None = None  # bytes/s one way, from PCIe generation x lanes
    matrix_flops: Figure | None = None  # dense FP16 tensor FLOP/s, the card's peak

    def missing(self) -> list[str]:
        need = (("memory_bandwidth", self.memory_bandwidth), ("pcie_bandwidth", self.pcie_bandwidth),
                ("matrix_flops", self.matrix_flops))
        return [f"{self.device}: {what}" for what, fig in need if fig is None]

    def json(self) -> dict[str, Any]:
        def fig(f: Figure | None) -> dict[str, Any] | None:
            return None if f is None else f.json()
        return {"device": self.device, "name": self.name, "memory_bandwidth": fig(self.memory_bandwidth),
                "pcie_bandwidth": fig(self.pcie_bandwidth), "matrix_flops": fig(self.matrix_flops)}


@dataclass(frozen=True)
class Host:
    """The CPU side: system RAM's bandwidth and the cores the engine's threads run on."""

    memory_bandwidth: Figure | None = None  # bytes/s
    cores: Figure | None = None  # physical cores

    def missing(self) -> list[str]:
        need = (("memory_bandwidth", self.memory_bandwidth), ("cores", self.cores))
        return [f"host: {what}" for what, fig in need if fig is None]

    def json(self) -> dict[str, Any]:
        return {"memory_bandwidth": None if self.memory_bandwidth is None else self.memory_bandwidth.json(),
                "cores": None if self.cores is None else self.cores.json()}


@dataclass(frozen=True)
class Machine:
    gpus: tuple[GPU, ...] = ()
    host: Host = field(default_factory=Host)

    def gpu(self, device: str) -> GPU | None:
        return next((g for g in self.gpus if g.device == device), None)

    def missing(self, devices: tuple[str, ...] | None = None) -> list[str]:
        """What a prediction over `devices` (every GPU when None) lacks, as 'DEVICE: figure'."""
        out = self.host.missing()
        for g in self.gpus:
            if devices is None or g.device in devices:
                out += g.missing()
        return out

    def json(self) -> dict[str, Any]:
        return {"gpus": [g.json() for g in self.gpus], "host": self.host.json()}
