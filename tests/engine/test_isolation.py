"""The engine suite measures the pinned engines as they are built, with nothing the machine adds:
llama.cpp b10398+ reads /etc/llama.cpp/config.ini and ${XDG_CONFIG_HOME}/llama.cpp/config.ini before
its environment and command line (common/arg.cpp common_params_apply_system_config). The user's
file is kept out by tests/conftest.py (XDG_CONFIG_HOME is an empty folder); the system-wide one
cannot be, so its presence fails the suite rather than skew every figure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def test_no_llama_cpp_config_file_reaches_the_engines() -> None:
    system = Path("/etc/llama.cpp/config.ini")
    assert not system.exists(), f"{system} exists: the engines apply it to every run of this suite; move it away"
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "llama.cpp" / "config.ini"
    assert not user.exists() and "moeconf-test-cache-" in os.environ["XDG_CONFIG_HOME"]
