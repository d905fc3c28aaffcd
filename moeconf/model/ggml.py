"""GGML type and name tables, taken from the `gguf` package's `constants` module.

`import gguf` pulls in numpy and the whole writer (about 150 ms); the constants module alone
has no dependencies and loads in a few milliseconds, so it is loaded by file path. The CLI's
start-up time depends on this."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from types import ModuleType
from typing import Any


@cache
def constants() -> ModuleType:
    """The `gguf.constants` module, without importing the `gguf` package (and numpy)."""
    already = sys.modules.get("gguf.constants")
    if already is not None:
        return already
    spec = importlib.util.find_spec("gguf")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = f"{folder}/constants.py"
            sub = importlib.util.spec_from_file_location("moeconf._gguf_constants", path)
            if sub is None or sub.loader is None:
                continue
            module = importlib.util.module_from_spec(sub)
            try:
                sub.loader.exec_module(module)
            except (OSError, ImportError):
                continue
            return module
    import gguf.constants as full  # fallback: the regular, slower import

    return full


def _c() -> Any:
    return constants()


@cache
def quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type id -> (elements per block, bytes per block)."""
    return {int(k): (int(v[0]), int(v[1])) for k, v in _c().GGML_QUANT_SIZES.items()}


@cache
def type_names() -> dict[int, str]:
    """ggml type id -> name as gguf spells it (`Q4_K`, `MXFP4`, `F32`)."""
    return {int(t): str(t.name) for t in _c().GGMLQuantizationType}


@cache
def type_ids() -> dict[str, int]:
    """Type name (any case) -> ggml type id."""
    out: dict[str, int] = {}
    for tid, name in type_names().items():
        out[name] = tid
        out[name.upper()] = tid
    return out


@cache
def file_type_names() -> dict[int, str]:
    """llama file type id -> short name (`Q4_K_M`, `MXFP4_MOE`, `F16`)."""
    out: dict[int, str] = {}
    for ft in _c().LlamaFileType:
        name = str(ft.name)
        for prefix in ("MOSTLY_", "ALL_"):
            if name.startswith(prefix):
                name = name[len(prefix):]
        out[int(ft)] = name
    return out


def nbytes(type_id: int, shape: tuple[int, ...]) -> int | None:
    """Byte size of a tensor of `type_id` and `shape` (ne order), or None for an unknown type.

    Raises ValueError when the first dimension is not a whole number of blocks."""
    sizes = quant_sizes().get(type_id)
    if sizes is None:
        return None
    block, size = sizes
    ne0 = shape[0] if shape else 1
    if ne0 % block:
        raise ValueError(f"first dimension {ne0} is not a multiple of the block size {block}")
    rows = 1
    for d in shape[1:]:
        rows *= d
    return ne0 // block * size * rows
