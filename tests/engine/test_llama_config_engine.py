"""llama.cpp's config files against the pinned engine: for each config.ini, whether
llama-fit-params (which reads them, common_params_parse) starts its parse or stops on the file,
and whether moeconf's reader (engines/llamaconfig.py) refuses the same files. No model is loaded:
with a file it accepts, the program stops at "--model is required"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from moeconf.engines import engine
from moeconf.engines.llamaconfig import apply, load
from moeconf.errors import MoeconfError
from tests.engine.oracle import FIT_PARAMS

pytestmark = pytest.mark.engine

CASES = [
    # (config.ini, the engine accepts it)
    ("ctx-size = 4096\n", True),
    ("  ctx-size = 5\n", False),  # indented: the whole file fails to parse
    ("ctx-size 4096\n", False),
    ("[*\nctx-size = 1\n", False),
    ("[*] x\nctx-size = 1\n", False),
    ("= 3\n", False),
    ("ctx-size =\n", False),  # an empty value reaches std::stoi
    ("ctx-size = big\n", False),
    ("ctx-size = 4096abc\n", True),
    ("c = big\n", False),  # the short name is a key
    ("LLAMA_ARG_CTX_SIZE = big\n", False),  # so is the variable
    ("ctx_size = big\n", True),  # not a key: ignored
    ("[ * ]\nctx-size = big\n", True),  # a named section: ignored
    ("[ default ]\nctx-size = big\n", True),
    ("[*]\nctx-size = big\n[*]\nbatch-size = 5\n", True),  # the second header drops the first's keys
    ("ctx-size = big\n[default]\nbatch-size = 5\n", True),  # [default] drops the keys before any header
    ("ctx-size = 5 ; big\nbatch-size = 3#x\n", True),
    ("cache-type-k = q8\n", False),
    ("flash-attn = ON\n", False),
    ("fit = maybe\n", False),
    ("split-mode = rows\n", False),
    ("n-cpu-moe = -1\n", False),
    ("override-tensor = exps\n", False),
    ("n-gpu-layers = all\nno-kv-offload = whatever\ncpu-moe = false\n", True),
    ("version = x\nport = x\n", True),  # reserved; an option llama-fit-params does not have
]


@pytest.mark.skipif(not FIT_PARAMS.exists(), reason="pinned llama.cpp not built")
@pytest.mark.skipif(os.path.exists("/etc/llama.cpp/config.ini"), reason="this machine has a system config file")
@pytest.mark.parametrize(("text", "accepted"), CASES)
def test_engine_and_moeconf_refuse_the_same_files(tmp_path: Path, text: str, accepted: bool) -> None:
    cfg_dir = tmp_path / "xdg" / "llama.cpp"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.ini").write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    p = subprocess.run([str(FIT_PARAMS)], capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    assert ("--model is required" in out) == accepted, out[-2000:]
    try:
        apply(load([str(cfg_dir / "config.ini")]), engine("llama.cpp"), "llama-fit-params")
        moeconf_accepts = True
    except MoeconfError:
        moeconf_accepts = False
    assert moeconf_accepts == accepted


# --- placement: the engine's own log against explain with the same config file ------------------

PLACEMENT_CASES = [
    # (config.ini, the command line's engine arguments (RPC0 stands for the server, EP for its
    # address), env, whether the file changes the placement)
    ("[*]\ncpu-moe = on\nn-gpu-layers = 99\n", ["--rpc", "EP", "-ot", r"blk\.1\.ffn_.*_exps=RPC0"], {}, True),
    # the file's --rpc comes first, so its -ot may name the server; the environment's -ot follows it
    ("rpc = EP\noverride-tensor = blk\\.1\\.ffn_up_exps=CPU\n", ["-ngl", "99"],
     {"LLAMA_ARG_OVERRIDE_TENSOR": r"blk\.1\.ffn_(up|down)_exps=RPC0,exps=CPU"}, True),
    ("n-gpu-layers = 2\nn-cpu-moe = 1\n", ["--rpc", "EP", "-ot", r"blk\.2\.ffn_up_exps=CPU"], {}, True),
    # a value option: the environment replaces the file's, the command line the environment's
    ("n-gpu-layers = 2\n", ["--rpc", "EP", "-ngl", "99"], {"LLAMA_ARG_N_GPU_LAYERS": "1"}, False),
    ("n-gpu-layers = 2\n", ["--rpc", "EP"], {"LLAMA_ARG_N_GPU_LAYERS": "1"}, False),
]


@pytest.mark.skipif(not FIT_PARAMS.exists(), reason="pinned llama.cpp not built")
@pytest.mark.skipif(os.path.exists("/etc/llama.cpp/config.ini"), reason="this machine has a system config file")
@pytest.mark.parametrize(("text", "args", "env", "changes"), PLACEMENT_CASES)
def test_placement_with_a_config_file(tmp_path: Path, text: str, args: list[str], env: dict[str, str],
                                      changes: bool) -> None:
    from moeconf.engines.argvread import Arg
    from moeconf.engines.cmdline import parse_invocation
    from moeconf.explanation import explain_invocation
    from moeconf.fixtures.layouts import TINY
    from moeconf.fixtures.tiny import write_tiny
    from moeconf.model.load import load_inventory
    from tests.engine.harness import MAINLINE, parse_mainline, rpc_servers, run_engine

    key = "qwen3moe" if "qwen3moe" in TINY else sorted(TINY)[0]
    model = write_tiny(TINY[key], tmp_path / "m.gguf")
    inv = load_inventory(model)
    cfg_dir = tmp_path / "xdg" / "llama.cpp"
    cfg_dir.mkdir(parents=True)
    with rpc_servers(MAINLINE, 1) as endpoints:
        dev = f"RPC0[{endpoints[0]}]"
        def fill(t: str) -> str:
            return t.replace("RPC0", dev).replace("EP", endpoints[0])

        (cfg_dir / "config.ini").write_text(fill(text))
        line = [fill(a) for a in args]
        run_env = {k: fill(v) for k, v in env.items()}
        run = run_engine(MAINLINE, model, line, {**run_env, "HOME": str(tmp_path),
                                                 "XDG_CONFIG_HOME": str(tmp_path / "xdg")}, endpoints)
        assert run.returncode == 0, run.log[-3000:]
        got = parse_mainline(run.log, inv, endpoints)
    invocation = parse_invocation([Arg(a) for a in ["llama-completion", *line]], engine("llama.cpp"),
                                  {k: Arg(v) for k, v in run_env.items()}, load([str(cfg_dir / "config.ini")]))
    want = explain_invocation(inv, invocation, []).placement.devices
    without = explain_invocation(inv, parse_invocation(invocation.args, engine("llama.cpp"), invocation.env),
                                 []).placement.devices
    diff = {n: (w, got[n]) for n, w in want.items() if w is not None and w != got[n]}
    assert not diff, diff
    assert (want != without) == changes


# --- the INI examples the pinned llama.cpp ships (docs/preset.md, tools/server/README.md) -------

SRC = FIT_PARAMS.parent.parent.parent / "src" / "vendor" / "llama.cpp"


def _ini_blocks() -> list[tuple[str, str]]:
    import re

    out = []
    for rel in ("docs/preset.md", "tools/server/README.md"):
        path = SRC / rel
        if path.exists():
            for k, m in enumerate(re.finditer(r"```ini\n(.*?)```", path.read_text(), re.S)):
                out.append((f"{rel}#{k}", m.group(1)))
    return out


# keys of those examples that the pinned build no longer has: `mmap` went with --load-mode (b10108),
# so llama-server ignores `mmap = 1` (with a warning) though its own docs still show it
STALE = {"mmap"}


@pytest.mark.skipif(not _ini_blocks(), reason="pinned llama.cpp source not present")
def test_the_engines_own_ini_examples(tmp_path: Path) -> None:
    """Every INI example of the pinned source parses, and every key in it names an option of
    llama-server (or is `version`), but for the known stale ones: the key table (configtable.py)
    and the reader agree with the engine's own documentation."""
    from moeconf.engines.llamaconfig import option_for_key, parse_ini

    unknown: set[str] = set()
    for name, text in _ini_blocks():
        f = parse_ini(text, name)
        keys = [e.key for sec in f.sections.values() for e in sec.values()]
        assert keys, name
        unknown |= {k for k in keys if k != "version" and option_for_key(k, "SERVER") is None}
        (tmp_path / "c.ini").write_text(text)
        applied = apply(load([str(tmp_path / "c.ini")]), engine("llama.cpp"), "llama-server")
        assert {e.key for e, _why in applied.ignored} <= STALE
    assert unknown == STALE
