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


# ggml types that only ik_llama.cpp has (IQ4_KS, IQ2_KT, the _R4/_R8 repacked forms, ...): type id
# -> (name, elements per block, bytes per block), read from ik_llama.cpp 0.1.5's own
# ggml_blck_size / ggml_type_size. Their ids (97+) are unused by mainline ggml, so a file that
# has them comes from ik_llama.cpp's quantizer. Types gguf knows always take precedence.
IK_TYPES: dict[int, tuple[str, int, int]] = {
    97: ("Q8_0_X4", 32, 34),
    98: ("Q8_1_X4", 32, 36),
    99: ("Q8_2_X4", 32, 36),
    133: ("Q6_0", 32, 26),
    134: ("IQ1_BN", 64, 13),
    135: ("IQ2_BN", 64, 16),
    136: ("Q8_K64", 64, 68),
    137: ("IQ2_K", 256, 76),
    138: ("IQ3_K", 256, 110),
    139: ("IQ4_K", 256, 144),
    140: ("IQ5_K", 256, 176),
    141: ("IQ6_K", 256, 212),
    144: ("IQ4_KS", 256, 136),
    145: ("IQ2_KS", 256, 70),
    146: ("IQ4_KSS", 256, 128),
    147: ("Q8_K16", 64, 64),
    148: ("Q8_K32", 256, 296),
    149: ("Q8_KR8", 256, 296),
    150: ("Q8_K128", 128, 140),
    151: ("Q8_KV", 32, 32),
    152: ("IQ5_KS", 256, 168),
    153: ("IQ2_KT", 256, 68),
    154: ("IQ3_KT", 256, 100),
    155: ("IQ4_KT", 256, 128),
    156: ("IQ3_KS", 256, 102),
    157: ("IQ2_KL", 256, 86),
    158: ("IQ1_KT", 256, 56),
    202: ("Q4_0_R8", 32, 18),
    206: ("Q5_0_R4", 32, 22),
    208: ("Q8_0_R8", 32, 34),
    210: ("Q2_K_R4", 256, 84),
    211: ("Q3_K_R4", 256, 110),
    212: ("Q4_K_R4", 256, 144),
    213: ("Q5_K_R4", 256, 176),
    214: ("Q6_K_R4", 256, 210),
    216: ("IQ2_XXS_R4", 256, 66),
    217: ("IQ2_XS_R4", 256, 74),
    218: ("IQ3_XXS_R4", 256, 98),
    219: ("IQ1_S_R4", 32, 6),
    220: ("IQ4_NL_R4", 32, 18),
    221: ("IQ3_S_R4", 256, 110),
    222: ("IQ2_S_R4", 256, 82),
    223: ("IQ4_XS_R8", 256, 136),
    229: ("IQ1_M_R4", 32, 7),
    230: ("BF16_R16", 1, 2),
    233: ("Q6_0_R4", 32, 26),
    335: ("IQ2_BN_R4", 64, 16),
    337: ("IQ2_K_R4", 256, 76),
    338: ("IQ3_K_R4", 256, 110),
    339: ("IQ4_K_R4", 256, 144),
    340: ("IQ5_K_R4", 256, 176),
    344: ("IQ4_KS_R4", 256, 136),
    352: ("IQ5_KS_R4", 256, 168),
    397: ("Q8_K_R16", 256, 258),
    398: ("Q8_KV_R8", 32, 32),
    399: ("Q8_K_R8", 256, 258)
}


@cache
def quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type id -> (elements per block, bytes per block), gguf's types and ik_llama.cpp's."""
    out = {tid: (block, size) for tid, (_name, block, size) in IK_TYPES.items()}
    out.update({int(k): (int(v[0]), int(v[1])) for k, v in _c().GGML_QUANT_SIZES.items()})
    return out


@cache
def type_names() -> dict[int, str]:
    """ggml type id -> name as gguf spells it (`Q4_K`, `MXFP4`, `F32`; `IQ4_KS` for ik's)."""
    out = {tid: name for tid, (name, _block, _size) in IK_TYPES.items()}
    out.update({int(t): str(t.name) for t in _c().GGMLQuantizationType})
    return out


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


def pad(n: int, to: int) -> int:
    """`n` rounded up to a multiple of `to` (ggml's GGML_PAD)."""
    return -(-n // to) * to


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
