"""Placement of every tensor, those outside `blk.N` included, against llama.cpp itself: the sparse
full-size layouts of this year's architectures (moeconf/fixtures/layouts_loaders.py) loaded by
tests/engine/placement.cpp, compiled against the pinned build (the model loaded as
llama-fit-params loads it: no_alloc, nothing read), which prints each tensor with the buffer
type holding it (once per buffer type: a tied output's copy of token_embd, rope_freqs copied
into later blocks' buffers), with RPC servers on 127.0.0.1 as GPUs, on the usual four lines
(tests/engine/ik_newer_cases.py PLACEMENT_LINES; two devices split evenly with -ts 1,1, since
without -ts llama.cpp splits by free memory). moeconf's `explain` must name the same device for
every tensor, and the engine's extra copies must be the ones moeconf knows of. The layouts of the
architectures modelled before are checked the same way on two of the lines. Architectures whose
loader never creates the routed experts its tensor table names are shown refusing a file with them."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.engines.simulate import home_layer
from moeconf.explanation import explain
from moeconf.fixtures.layouts import LAYOUTS
from moeconf.fixtures.layouts_loaders import LOADER_LAYOUTS
from moeconf.fixtures.writer import write_layout
from moeconf.model import layertable
from moeconf.model.homes import _kinds
from moeconf.model.inventory import Inventory
from tests.engine import oracle
from tests.engine.harness import MAINLINE, compile_against_mainline, rpc_servers

pytestmark = pytest.mark.engine

SRC = Path(__file__).parent / "placement.cpp"
MODELS = tuple(LOADER_LAYOUTS)
# the layouts of the architectures modelled before (moeconf/fixtures/layouts*.py), on two of the lines
EARLIER = tuple(k for k in LAYOUTS if k not in LOADER_LAYOUTS)
EARLIER_LINES = ["-ngl {half}", "2rpc -ngl 999 -ts 1,1 --n-cpu-moe 1"]
LINES = [
    "-ngl 999 -ot exps=CPU",
    "-ngl 999 --n-cpu-moe 2",
    "-ngl {half}",
    "2rpc -ngl 999 -ts 1,1 --n-cpu-moe 1",
]


@functools.lru_cache(maxsize=1)
def probe() -> Path:
    return compile_against_mainline(SRC, Path(tempfile.mkdtemp(prefix="moeconf-placement-probe-")) / "placement")


def engine_placement(model: Path, args: list[str], eps: list[str]) -> dict[str, set[str]]:
    """Each tensor the engine created -> the buffer types holding it (host buffers as CPU)."""
    p = subprocess.run([str(probe()), "-m", str(model), *args], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, set[str]] = {}
    for line in p.stdout.splitlines():
        name, _, buft = line.partition(" ")
        m = re.fullmatch(r"RPC\d+\[(.*)\]", buft)
        dev = f"RPC0[{m.group(1)}]" if m else "CPU" if buft.startswith("CPU") else buft
        out.setdefault(name, set()).add(dev)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Inventory]]:
    if not MAINLINE.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {MAINLINE.cli})")
    return oracle.write_sparse(tmp_path_factory.mktemp("homes"), {k: LAYOUTS[k] for k in (*MODELS, *EARLIER)})


@pytest.fixture(scope="module")
def endpoints() -> Iterator[list[str]]:
    with rpc_servers(MAINLINE, 2) as eps:
        yield eps


def copies(inv: Inventory, name: str, block_devices: dict[int, str]) -> set[str]:
    """The devices where the loader also puts a tensor it copies (TENSOR_DUPLICATED) into later
    blocks' buffers (moeconf.model.layertable ML_BLOCK_HOMES), by the blocks' devices."""
    homed = layertable.ML_BLOCK_HOMES.get(inv.arch, {})
    for k in _kinds("llama.cpp", inv.arch, name):
        if k in homed and homed[k][2]:
            guard = homed[k][1]
            swa = inv.metadata.sliding_window_pattern
            ok = [il for il in block_devices if il < inv.block_count and (
                guard != "full_attention" or not (isinstance(swa, tuple) and il < len(swa) and swa[il]))]
            return {block_devices[il] for il in ok}
    return set()


CASES = [(m, line) for m in MODELS for line in LINES] + [(m, line) for m in EARLIER for line in EARLIER_LINES]


@pytest.mark.parametrize(("model", "line"), CASES)
def test_every_tensor_where_llama_cpp_puts_it(models: dict[str, tuple[Path, Inventory]], endpoints: list[str],
                                              model: str, line: str) -> None:
    path, inv = models[model]
    words = shlex.split(line.format(half=inv.block_count // 2))
    n = 2 if "2rpc" in words else 1
    eps = endpoints[:n]
    args = ["--rpc", ",".join(eps), "-fit", "off", *[w for w in words if w != "2rpc"]]
    got = engine_placement(path, args, eps)
    ex = explain(inv, engine("llama.cpp"), args, gpus=[])
    pl = ex.placement
    eng = engine("llama.cpp")
    # the device of each block as moeconf places its block tensors (for the copies' devices)
    block_dev = {t.layer: pl.devices[t.name] for t in inv.tensors
                 if t.layer is not None and t.base == "attn_norm" and pl.devices[t.name] is not None}
    diff: dict[str, tuple[object, object]] = {}
    checked_globals = 0
    for t in inv.tensors:
        want = pl.devices[t.name]
        theirs = got.get(t.name, set())
        if want is None:
            if theirs:
                diff[t.name] = (None, sorted(theirs))
            continue
        extra = {pl.tied_output()} - {None} if t.name == "token_embd.weight" else set()
        if t.layer is None:
            checked_globals += 1
            if home_layer(t, inv, eng) >= 0:
                extra |= {d for d in copies(inv, t.name, block_dev) if d is not None}
        if want not in theirs or not theirs <= {want} | extra:
            diff[t.name] = (want, sorted(theirs))
    assert checked_globals > 0
    assert not diff, f"{model} {line}: {len(diff)} tensors differ, e.g. {dict(list(diff.items())[:8])}"


def test_a_wrong_home_is_seen(models: dict[str, tuple[Path, Inventory]], endpoints: list[str]) -> None:
    """The comparison sees a tensor moeconf would put in the input layer (today's main put
    DeepSeek-V4's output_hc_* there): the engine holds it on the output layer's GPU."""
    path, _inv = models["deepseek-v4-flash"]
    got = engine_placement(path, ["--rpc", endpoints[0], "-fit", "off", "-ngl", "999"], endpoints[:1])
    assert got["output_hc_fn.weight"] == {f"RPC0[{endpoints[0]}]"} != {"CPU"}
    assert got["token_embd.weight"] == {"CPU"}


@pytest.mark.parametrize("arch", ["ernie4_5", "paddleocr", "ernie4_5-moe"])
def test_loaders_without_experts_refuse_them(tmp_path: Path, arch: str) -> None:
    """ernie4_5 and paddleocr (whose loader is ernie4_5's) name routed experts in the engine's tensor
    table but create them only for ernie4_5-moe: ERNIE-4.5-21B-A3B's layout written under their
    name does not load, the first block with experts wanting a dense FFN; under its own name it
    loads (docs/memory-architectures.md says so in their rows: no layout can check them)."""
    if not MAINLINE.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {MAINLINE.cli})")
    path = tmp_path / f"{arch}.gguf"
    write_layout(replace(LAYOUTS["ernie-4.5-21b-a3b"], key=f"ernie-4.5-as-{arch}", arch=arch), path)
    p = subprocess.run([str(probe()), "-m", str(path), "-fit", "off", "-ngl", "0"], capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    if arch == "ernie4_5-moe":
        assert p.returncode == 0, p.stderr[-3000:]
        assert "blk.1.ffn_gate_exps.weight CPU" in p.stdout
    else:
        assert p.returncode != 0
        assert "check_tensor_dims: tensor 'blk.1.ffn_gate.weight' not found" in p.stderr


def test_qwen4exp_hash_constants_must_be_uint64(tmp_path: Path) -> None:
    """Why the fixture writer has `u64[]`: Qwen3.8-Flash-Next's layout with its PLE head offsets
    written as gguf-py infers them (int32 items) does not load."""
    from moeconf.fixtures.layouts import metadata, tensors
    from moeconf.fixtures.writer import header_values, write_gguf

    if not MAINLINE.available():
        pytest.fail(f"llama.cpp is not built: run scripts/build-engines.sh (looked for {MAINLINE.cli})")
    lay = LAYOUTS["qwen3.8-flash-next"]
    md = dict(metadata(lay))
    md["qwen4exp.ple.head_offsets"] = ("u32[]", md["qwen4exp.ple.head_offsets"][1])
    path = tmp_path / "int32-offsets.gguf"
    write_gguf(path, lay.arch, header_values(md, lay.file_type), tensors(lay), vocab=lay.vocab)
    p = subprocess.run([str(probe()), "-m", str(path), "-fit", "off", "-ngl", "0"], capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode != 0
    assert "qwen4exp.ple.head_offsets has wrong array element type i32" in p.stderr
