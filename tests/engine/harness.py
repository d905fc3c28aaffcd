"""Run the real engines (built by scripts/build-engines.sh) just far enough to load a model, and
read back from their logs where they put each tensor."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from moeconf.engines import engine
from moeconf.engines.simulate import home_layer
from moeconf.model.inventory import Inventory

CACHE = Path(os.environ.get("MOECONF_ENGINE_CACHE", Path.home() / ".cache" / "moeconf" / "engines"))


@dataclass(frozen=True)
class EngineBuild:
    name: str  # llama.cpp / ik_llama.cpp
    package: str  # PyPI package and version the build came from
    version: str | None  # what moeconf calls this version
    cli: Path
    rpc_server: Path

    def available(self) -> bool:
        return self.cli.is_file() and self.rpc_server.is_file()


MAINLINE = EngineBuild("llama.cpp", "llama-cpp-python 0.3.36", None,
                       CACHE / "llama-cpp-python-0.3.36" / "build" / "bin" / "llama-completion",
                       CACHE / "llama-cpp-python-0.3.36" / "build" / "bin" / "ggml-rpc-server")
IK = EngineBuild("ik_llama.cpp", "ik-llama-cpp-python 0.1.5", "0.1.5",
                 CACHE / "ik-llama-cpp-python-0.1.5" / "build" / "bin" / "llama-cli",
                 CACHE / "ik-llama-cpp-python-0.1.5" / "build" / "bin" / "rpc-server")
BUILDS = {b.name: b for b in (MAINLINE, IK)}
ML_ENGINE, IK_ENGINE = engine("llama.cpp"), engine("ik_llama.cpp", "0.1.5")


def compile_against_mainline(source: Path, out: Path) -> Path:
    """A C++ probe (`source`) built at `out` against the pinned llama.cpp build (a C++ compiler is
    needed: the engine suite builds the engines)."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise RuntimeError("no C++ compiler: the engine suite builds the engines and needs one")
    root = MAINLINE.cli.parent.parent.parent  # .../llama-cpp-python-0.3.36
    src = root / "src" / "vendor" / "llama.cpp"
    lib = MAINLINE.cli.parent
    subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(out), str(source), f"-I{src / 'include'}",
                    f"-I{src / 'ggml' / 'include'}", f"-I{src / 'common'}", f"-I{src / 'vendor'}", f"-L{lib}",
                    "-lllama-common", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"],
                   check=True, capture_output=True, timeout=300)
    return out


_PORTS_PER_WORKER = 500
_taken = 0


def free_port() -> int:
    """A port on 127.0.0.1 free now. Under pytest-xdist each worker takes ports from a range of its own
    (below Linux's ephemeral ports): two workers asking the kernel for any free port could both get one
    before either server binds it, and the second's readiness check would reach the first's server."""
    global _taken
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    first = 20000 + _PORTS_PER_WORKER * int(worker.removeprefix("gw"))
    for _ in range(_PORTS_PER_WORKER):
        port = first + _taken % _PORTS_PER_WORKER
        _taken += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + _PORTS_PER_WORKER - 1} for pytest-xdist worker {worker}")


@contextmanager
def rpc_servers(build: EngineBuild, n: int) -> Iterator[list[str]]:
    """Start n RPC servers on 127.0.0.1; yield their host:port endpoints."""
    procs = []
    endpoints = []
    scratch = tempfile.TemporaryDirectory(prefix="moeconf-rpc-")
    try:
        for _ in range(n):
            port = free_port()
            p = subprocess.Popen([str(build.rpc_server), "-H", "127.0.0.1", "-p", str(port)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=scratch.name)
            procs.append(p)
            endpoints.append(f"127.0.0.1:{port}")
            deadline = time.monotonic() + 20
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline or p.poll() is not None:
                        raise RuntimeError(f"rpc server on port {port} did not start") from None
                    time.sleep(0.1)
        yield endpoints
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        scratch.cleanup()


@dataclass(frozen=True)
class Run:
    returncode: int
    log: str


def user_devices(build: EngineBuild, endpoints: Sequence[str]) -> list[str]:
    """What makes the engine see exactly the devices a user with that many GPUs has. A CPU-only
    ik_llama.cpp build counts its CPU as a device (so one RPC server would make two devices and
    take ik's multi-device paths): name the RPC devices with -dev. Mainline does not count it."""
    if build.name == "ik_llama.cpp" and endpoints:
        return ["-dev", ",".join(f"RPC0[{e}]" for e in endpoints)]
    return []


DEFAULT_CTX = 256  # the context the engines run with unless a test's args give -c


def run_engine(build: EngineBuild, model: Path, args: Sequence[str], env: dict[str, str] | None = None,
               endpoints: Sequence[str] = ()) -> Run:
    """Load `model` with `args` (engine arguments, no binary, no -m) and generate one token; ik
    gets `-dev` naming the RPC `endpoints` (user_devices).

    The context is -c DEFAULT_CTX unless `args` set it. The engine runs in a temporary folder:
    ik_llama.cpp's llama-cli writes `main.log` into its working directory, which must never be
    the checkout."""
    ctx = [] if any(a in ("-c", "--ctx-size") for a in args) else ["-c", str(DEFAULT_CTX)]
    argv = [str(build.cli), "-m", os.path.abspath(model), *args, *user_devices(build, endpoints), "-n", "1",
            "-p", "hi", "--verbose", "-t", "1", *ctx, "--temp", "0"]
    if build.name == "llama.cpp":
        argv.append("-no-cnv")  # llama-completion would start a chat; ik's llama-cli does not know it
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    full_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="moeconf-engine-") as cwd:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=full_env,
                           stdin=subprocess.DEVNULL, cwd=cwd)
    return Run(p.returncode, p.stdout + "\n" + p.stderr)


_MAIN_OVERRIDE = re.compile(r"tensor (\S+) \([^)]*\) buffer type overridden to (\S+)")
_MAIN_LAYER = re.compile(r"load_tensors: layer +(\d+) assigned to device (\S+?),")
_IK_OVERRIDE = re.compile(r"Tensor (\S+)(?: \(size = [^)]*\))? buffer type overr?idd?en to (\S+)")


def device_names(endpoints: Sequence[str]) -> dict[str, str]:
    """Engine device names (as the layer log prints them) -> buffer-type names."""
    out = {"CPU": "CPU"}
    for i, ep in enumerate(endpoints):
        out[f"RPC{i}"] = f"RPC0[{ep}]"
        out[f"RPC0[{ep}]"] = f"RPC0[{ep}]"
    return out


def parse_mainline(log: str, inv: Inventory, endpoints: Sequence[str]) -> dict[str, str]:
    """Every tensor's buffer type: the override lines, else the device of its layer; the input
    layer (token_embd) is on the CPU. The log does not say which layer a tensor outside `blk.N`
    belongs to: that is the generated table's (moeconf.model.homes), which
    tests/engine/test_placement_homes.py checks against the engine tensor by tensor."""
    names = device_names(endpoints)
    layer_dev: dict[int, str] = {}
    for m in _MAIN_LAYER.finditer(log):
        layer_dev[int(m.group(1))] = names.get(m.group(2), m.group(2))
    overrides = {m.group(1): m.group(2) for m in _MAIN_OVERRIDE.finditer(log)}
    out: dict[str, str] = {}
    for t in inv.tensors:
        if t.name in overrides:
            out[t.name] = overrides[t.name]
        else:
            home = home_layer(t, inv, ML_ENGINE)
            out[t.name] = "CPU" if home < 0 else layer_dev.get(home, "?")
    return out


def parse_ik_overrides(log: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _IK_OVERRIDE.finditer(log)}


_IK_OFFLOAD = re.compile(r"offloading (\d+) repeating layers to GPU")
_IK_OUTPUT = re.compile(r"offloading non-repeating layers to GPU")
_IK_LAYER = re.compile(r"Setting default device in layer +(\d+) to (\d+)")
_IK_UNUSED = re.compile(r"model has unused tensor (\S+) ")
_IK_SHARE = re.compile(r"device (\d+): (\d+) layers -> (\d+) overrides")


@dataclass(frozen=True)
class IkLog:
    """What ik_llama.cpp's log says about placement."""

    placement: dict[str, str | None]  # tensor -> buffer type; None: not loaded (skipped)
    layer_devices: list[int] | None  # per block, then the output layer: its device index (2+ devices)
    shares: list[tuple[int, int]]  # --n-cpu-moe per device: (layers, overrides)


def parse_ik(log: str, inv: Inventory, endpoints: Sequence[str]) -> IkLog:
    """Every tensor's buffer type from ik_llama.cpp's log: its per-tensor override lines, else its
    layer's default: `offloading N repeating layers to GPU` puts the last N blocks on the GPU
    (with 2+ devices, on the device of `Setting default device in layer L to D`), and
    `offloading non-repeating layers to GPU` the output layer; token_embd stays on the CPU.
    Tensors ik skips (`model has unused tensor`) are not loaded, though an override line may
    name them first. With a CPU-only build the default layers' buffers are not the RPC device's
    (ik maps device indices past its CPU), so the logical device is read from these lines."""
    n_layer = inv.block_count
    m = _IK_OFFLOAD.search(log)
    n_gpu = int(m.group(1)) if m else 0
    output_on_gpu = bool(_IK_OUTPUT.search(log))
    set_dev = {int(a): int(b) for a, b in _IK_LAYER.findall(log)}
    devices = [f"RPC0[{e}]" for e in endpoints]
    layer_devices = None
    if len(devices) > 1 and set_dev:
        layer_devices = [set_dev.get(il, len(devices) - 1) for il in range(n_layer + 1)]
    overrides = parse_ik_overrides(log)
    unused = set(_IK_UNUSED.findall(log))

    def gpu_of(il: int) -> str:
        if not devices:
            return "CPU"
        if len(devices) == 1:
            return devices[0]
        return devices[layer_devices[il]] if layer_devices else "GPU(auto)"

    out: dict[str, str | None] = {}
    for t in inv.tensors:
        if t.name in unused:
            out[t.name] = None
        elif t.name in overrides:
            out[t.name] = overrides[t.name]
        else:
            home = home_layer(t, inv, IK_ENGINE)
            if home == n_layer:
                out[t.name] = gpu_of(n_layer) if output_on_gpu else "CPU"
            elif home >= 0:
                out[t.name] = gpu_of(home) if home >= n_layer - n_gpu else "CPU"
            else:
                out[t.name] = "CPU"
    shares = [(int(c), int(k)) for _d, c, k in _IK_SHARE.findall(log)]
    return IkLog(out, layer_devices, shares)
