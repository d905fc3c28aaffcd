from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from moeconf.fixtures import LAYOUTS, write_layout

# `explain` and `fit` detect the host CPU (AMX packs host weights larger, moeconf/memory/amx.py):
# the suite's outputs must not depend on the machine it runs on
os.environ.setdefault("MOECONF_HOST_CPU", "plain")
# nor on llama.cpp's config files of the machine (/etc/llama.cpp/config.ini, ~/.config/llama.cpp/
# config.ini): `explain`, `fit` and `lint` read none unless a test names them
# (engines/llamaconfig.py; tests of the discovery call `discover` with their own paths)
os.environ["MOECONF_LLAMA_CONFIG"] = ""

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def doc_pages() -> list[Path]:
    """The README and every page under docs/: the tests that check the README's examples and
    tables check these the same way."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.fixture(scope="session")
def layout_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every realistic layout written once as a sparse GGUF with its real vocabulary size."""
    d = tmp_path_factory.mktemp("layouts")
    for key, lay in LAYOUTS.items():
        write_layout(lay, d / f"{key}.gguf")
    return d


@pytest.fixture(scope="session")
def layout_paths(layout_dir: Path) -> dict[str, Path]:
    return {key: layout_dir / f"{key}.gguf" for key in LAYOUTS}


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("NO_COLOR", "1")
    if not hasattr(config, "workerinput"):  # the run itself (not one of pytest-xdist's workers)
        # the engine suite's results files hold this run's rows only, whatever an earlier one left
        from tests.engine.shards import RESULT_VARS, clear

        for var in RESULT_VARS:
            if os.environ.get(var):
                clear(os.environ[var])
        clear(Path.cwd() / "engine-results.json")  # test_engines' default target
    # remote models (moeconf.hub): never the user's caches, never the Hub
    import tempfile

    cache = tempfile.mkdtemp(prefix="moeconf-test-cache-")
    config._moeconf_cache = cache  # type: ignore[attr-defined]
    os.environ["MOECONF_CACHE_DIR"] = os.path.join(cache, "moeconf")
    os.environ["LLAMA_CACHE"] = os.path.join(cache, "hf-empty")
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens: a test that forgets the emulator fails fast
    # the engines the engine suite runs (llama.cpp b10398+) read ${XDG_CONFIG_HOME}/llama.cpp/config.ini
    # before anything else: an empty folder, never the user's (/etc/llama.cpp/config.ini: test_isolation)
    os.makedirs(os.path.join(cache, "xdg-config"), exist_ok=True)
    os.environ["XDG_CONFIG_HOME"] = os.path.join(cache, "xdg-config")


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    cache = getattr(config, "_moeconf_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)


@contextmanager
def address_space_cap(extra: int = 1 << 30) -> Iterator[None]:
    """At most `extra` bytes more address space than now: a blow-up fails fast instead of
    swapping (the defects the bounded-input and fuzz suites guard against allocated gigabytes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (now + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
