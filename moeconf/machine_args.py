"""The machine's flags, apart from moeconf/machine.py so that building the CLI's parser imports
nothing more than argparse (`moeconf --help` starts in milliseconds), and whether any is given (an
explain or fit without one never imports moeconf/machine.py)."""

from __future__ import annotations

import argparse
from typing import Any


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    """The machine's flags (explain, fit, machine): each figure a speed prediction reads."""
    g = parser.add_argument_group("machine (for speed; docs/speed.md \"The machine\")")
    g.add_argument("--gpu-model", metavar="NAME[,NAME...]",
                   help="each GPU's card as nvidia-smi names it or the card table does (RTX 4090, NVIDIA H200): one "
                   "for every GPU, or one per GPU in order (`moeconf machine --cards` lists the table)")
    g.add_argument("--gpu-bandwidth", metavar="BW[,BW...]", help="GPU memory bandwidth, e.g. 1008GB/s (over the table)")
    g.add_argument("--gpu-tflops", metavar="N[,N...]", help="GPU dense FP16 tensor TFLOP/s (over the table)")
    g.add_argument("--pcie", metavar="GEN[xLANES][,...]",
                   help="each GPU's PCIe link, e.g. 4x16 or 5x8 (over nvidia-smi and the table)")
    g.add_argument("--host-bandwidth", metavar="BW", help="system RAM bandwidth, e.g. 90GB/s")
    g.add_argument("--ram-speed", metavar="DDRn-MTSxCHANNELS",
                   help="system RAM as kind, speed and populated channels, e.g. DDR5-6000x2 (peak: 8 bytes per channel "
                   "per transfer)")
    g.add_argument("--cores", metavar="N", help="physical CPU cores the engine's threads run on")
    g.add_argument("--probe-ram", action="store_true",
                   help="measure the host's memory bandwidth with a short copy (about 0.5 s; a lower bound of the "
                   "peak)")
    if parser.prog.split()[-1] != "machine":  # `machine` reads a plan with --plan
        g.add_argument("--machine-plan", metavar="FILE",
                       help="read the machine from this plan's [machine] table (flags override it; docs/speed.md)")
    g.add_argument("--no-detect", action="store_true",
                   help="read nothing from this machine (nvidia-smi, /proc, lscpu): flags and the plan only")


# option dest -> (flag, [machine] key)
FIELDS = {"gpu_model": ("--gpu-model", "gpu_model"), "gpu_bandwidth": ("--gpu-bandwidth", "gpu_bandwidth"),
          "gpu_tflops": ("--gpu-tflops", "gpu_tflops"), "pcie": ("--pcie", "pcie"),
          "host_bandwidth": ("--host-bandwidth", "host_bandwidth"), "ram_speed": ("--ram-speed", "ram_speed"),
          "cores": ("--cores", "cores")}


def machine_flags_given(args: argparse.Namespace | dict[str, Any]) -> bool:
    """Whether any machine flag is set (explain and fit build the machine only then, or when speed is asked)."""
    get = args.get if isinstance(args, dict) else (lambda k, d=None: getattr(args, k, d))
    return any(get(k) not in (None, "", False) for k in (*FIELDS, "probe_ram", "no_detect", "machine_plan"))
