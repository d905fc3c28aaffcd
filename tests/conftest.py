from __future__ import annotations

import os
from pathlib import Path

import pytest

from moeconf.fixtures import LAYOUTS, write_layout

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


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
