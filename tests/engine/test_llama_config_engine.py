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
