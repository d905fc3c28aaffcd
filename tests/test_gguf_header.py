"""The header reader against gguf's own `GGUFReader`, and against every way a file can be bad."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeconf.errors import GGUFError
from moeconf.fixtures import write_gguf
from moeconf.model import ggml
from moeconf.model.gguf_header import MAX_DECODED_ARRAY, SkippedArray, read_header
from tests import rawgguf as R

VT = gguf.GGUFValueType


def reference(path: Path) -> tuple[dict[str, tuple[list[int], Any]], list[tuple[str, str, tuple[int, ...], int, int]]]:
    r = gguf.GGUFReader(path)
    fields = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        fields[name] = ([int(t) for t in f.types], f.contents())
    tensors = [
        (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes), int(t.data_offset))
        for t in r.tensors
    ]
    return fields, tensors


def _flatten(v: Any) -> list[Any]:
    if isinstance(v, list):
        return [y for x in v for y in _flatten(x)]
    return [v]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return bool(a == b or (math.isnan(a) and math.isnan(b)))
    return bool(a == b)


def assert_agrees(path: Path) -> None:
    ours = read_header(path)
    ref_fields, ref_tensors = reference(path)
    assert set(ours.metadata) == set(ref_fields)
    for key, (types, contents) in ref_fields.items():
        mv = ours.metadata[key]
        assert mv.value_type == types[0], key
        if mv.value_type == R.ARR:
            assert mv.element_type == types[1], key
            if isinstance(mv.value, SkippedArray):
                assert mv.value.count > MAX_DECODED_ARRAY
                if types[-1] != R.ARR and types[1] != R.ARR:
                    assert mv.value.count == len(contents), key
                    assert mv.value.element_type == types[-1]
                continue
            flat = _flatten(mv.value)
            assert len(flat) == len(contents), key
            assert all(_same(x, y) for x, y in zip(flat, contents, strict=True)), key
        else:
            assert _same(mv.value, contents), key
    got = [
        (t.name, t.type_name, t.shape, t.nbytes, ours.data_offset + t.offset) for t in ours.tensors
    ]
    assert got == ref_tensors


SCALARS = [
    ("u8", 200, VT.UINT8), ("i8", -100, VT.INT8), ("u16", 60000, VT.UINT16), ("i16", -30000, VT.INT16),
    ("u32", 4_000_000_000, VT.UINT32), ("i32", -2_000_000_000, VT.INT32), ("f32", 1.5, VT.FLOAT32),
    ("bool", True, VT.BOOL), ("str", "héllo wörld", VT.STRING), ("u64", 2**63 + 5, VT.UINT64),
    ("i64", -(2**62), VT.INT64), ("f64", math.pi, VT.FLOAT64),
]


def _array_values(vt: VT, n: int) -> list[Any]:
    if vt == VT.STRING:
        return [f"s{i}" for i in range(n)]
    if vt == VT.BOOL:
        return [i % 3 == 0 for i in range(n)]
    if vt in (VT.FLOAT32, VT.FLOAT64):
        return [i / 4 for i in range(n)]
    return [i % 100 for i in range(n)]


def test_every_value_type_and_array_type(tmp_path: Path) -> None:
    kv: list[tuple[str, Any, Any]] = [(f"t.{k}", v, vt) for k, v, vt in SCALARS]
    w_types = [VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.FLOAT32, VT.BOOL,
               VT.STRING, VT.UINT64, VT.INT64, VT.FLOAT64]
    for vt in w_types:
        for n in (1, 7, MAX_DECODED_ARRAY, MAX_DECODED_ARRAY + 1, 5000):
            kv.append((f"arr.{vt.name}.{n}", _array_values(vt, n), VT.ARRAY))
    kv.append(("arr.nested", [[1, 2], [3, 4, 5]], VT.ARRAY))
    # gguf infers array element types; force the typed ones through GGUFWriter's typed API
    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(path, "llama")
    for key, v, vt in kv:
        if vt == VT.ARRAY:
            sub = key.split(".")[1]
            if sub in VT.__members__ and VT[sub] != VT.STRING:
                w.add_key_value(key, list(v), VT.ARRAY, sub_type=VT[sub])
            else:
                w.add_array(key, v)
        else:
            w.add_key_value(key, v, vt)
    w.add_tensor("blk.0.attn_norm.weight", np.zeros(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_agrees(path)
    h = read_header(path)
    assert h.get("t.str") == "héllo wörld"
    assert h.get("t.u64") == 2**63 + 5
    assert isinstance(h.get("arr.STRING.5000"), SkippedArray)
    assert h.get(f"arr.UINT8.{MAX_DECODED_ARRAY}") == _array_values(VT.UINT8, MAX_DECODED_ARRAY)


def test_every_quant_type(tmp_path: Path) -> None:
    tensors = []
    for tid, name in sorted(ggml.type_names().items()):
        if name not in gguf.GGMLQuantizationType.__members__:
            continue  # ik_llama.cpp's own types: gguf's writer and reader do not know them
        block = ggml.quant_sizes()[tid][0]
        tensors.append((f"t.{name}", name, (block * 3, 5, 2)))
        tensors.append((f"t1.{name}", name, (block,)))
    path = tmp_path / "quants.gguf"
    write_gguf(path, "llama", [("llama.block_count", 1, VT.UINT32)], tensors, data="zeros")
    assert_agrees(path)
    h = read_header(path)
    assert {t.type_name for t in h.tensors} == set(gguf.GGMLQuantizationType.__members__)


@pytest.mark.parametrize("alignment", [32, 64, 4096])
def test_custom_alignment(tmp_path: Path, alignment: int) -> None:
    path = tmp_path / "a.gguf"
    write_gguf(path, "llama", [("llama.block_count", 1, VT.UINT32)],
               [("a", "F32", (3,)), ("b", "Q8_0", (64, 2))], alignment=alignment, data="zeros")
    assert_agrees(path)
    assert read_header(path).alignment == alignment


def test_layouts_agree_with_reference(layout_paths: dict[str, Path]) -> None:
    # The reference reader decodes whole vocabularies: check two layouts, the biggest included.
    for key in ("deepseek-v3", "gpt-oss-120b"):
        assert_agrees(layout_paths[key])


def test_split_shards_agree(tmp_path: Path) -> None:
    from moeconf.fixtures import LAYOUTS, write_layout

    files = write_layout(LAYOUTS["qwen3-30b-a3b"], tmp_path / "q.gguf", split_max_tensors=200, vocab=300)
    assert len(files) == 3
    for f in files:
        assert_agrees(f)


# --- property: random metadata and tensors round-trip through the real writer --------------

scalar_values = st.one_of(
    st.tuples(st.just(VT.UINT32), st.integers(0, 2**32 - 1)),
    st.tuples(st.just(VT.INT64), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(VT.FLOAT32), st.floats(width=32, allow_nan=False)),
    st.tuples(st.just(VT.STRING), st.text(max_size=40)),
    st.tuples(st.just(VT.BOOL), st.booleans()),
    st.tuples(st.just(VT.ARRAY), st.lists(st.text(max_size=5), min_size=1, max_size=20)),
    st.tuples(st.just(VT.ARRAY), st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=20)),
)
type_names = sorted(n for n in ggml.type_names().values() if n in gguf.GGMLQuantizationType.__members__)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kv=st.dictionaries(st.from_regex(r"[a-z]{1,8}\.[a-z_]{1,10}", fullmatch=True), scalar_values, max_size=8),
    tensors=st.lists(
        st.tuples(st.sampled_from(type_names), st.integers(1, 4), st.lists(st.integers(1, 5), min_size=0, max_size=3)),
        min_size=0, max_size=12,
    ),
)
def test_random_files_agree(tmp_path: Path, kv: dict[str, tuple[VT, Any]], tensors: list[Any]) -> None:
    path = tmp_path / "r.gguf"
    items = [(k, v, vt) for k, (vt, v) in kv.items() if k != "general.architecture"]
    tl = []
    for i, (tname, blocks, rest) in enumerate(tensors):
        block = ggml.quant_sizes()[ggml.type_ids()[tname]][0]
        tl.append((f"blk.{i}.t", tname, (block * blocks, *rest)))
    write_gguf(path, "llama", items, tl)
    assert_agrees(path)


# --- bad files ------------------------------------------------------------------------------


def write(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def expect_error(path: Path, *fragments: str) -> GGUFError:
    with pytest.raises(GGUFError) as ei:
        read_header(path)
    err = ei.value
    text = str(err)
    assert str(path) in text
    for f in fragments:
        assert f in text, text
    return err


def test_minimal_valid(tmp_path: Path) -> None:
    h = read_header(write(tmp_path, R.minimal().build()))
    assert h.get("qwen3moe.block_count") == 1
    assert h.tensors[0].name == "blk.0.attn_norm.weight"


@pytest.mark.parametrize(
    ("mutate", "fragments"),
    [
        (lambda g: setattr(g, "magic", b"GGML"), ["not a GGUF file", "byte offset 0"]),
        (lambda g: setattr(g, "magic", b"FUGG"), ["big-endian"]),
        (lambda g: setattr(g, "version", 1), ["version 1 is not supported"]),
        (lambda g: setattr(g, "version", 7), ["unsupported GGUF version 7"]),
        (lambda g: setattr(g, "n_tensors", 2**60), ["corrupt tensor count"]),
        (lambda g: setattr(g, "n_kv", 2**40), ["corrupt metadata count"]),
        (lambda g: (setattr(g, "n_tensors", 3), setattr(g, "data_size", 0), setattr(g, "alignment", 1)), ["truncated"]),
        (lambda g: setattr(g, "n_tensors", 3), ["tensor 1 has an empty name"]),
        (lambda g: g.kv.append(("x.bad", 13, 0)), ["unknown value type 13"]),
        (lambda g: g.kv.append(("x.arr", R.ARR, (99, []))), ["unknown array element type 99"]),
        (lambda g: g.kv.append(("general.architecture", R.STR, "x")), ["duplicate metadata key"]),
        (lambda g: g.tensors.append(("blk.0.attn_norm.weight", (64,), 0, 256)), ["duplicate tensor name"]),
        (lambda g: g.tensors.append(("t", (64,), 77, 256)), ["ggml type 77", "does not know"]),
        (lambda g: g.tensors.append(("t", (1, 1, 1, 1, 1), 0, 256)), ["5 dimensions"]),
        (lambda g: g.tensors.append(("t", (0,), 0, 256)), ["invalid dimension 0"]),
        (lambda g: g.tensors.append(("t", (2**40, 2**40), 0, 256)), ["overflows"]),
        (lambda g: g.tensors.append(("t", (100,), 12, 256)), ["not a multiple of the Q4_K block size 256"]),
        (lambda g: g.tensors.append(("t", (64,), 0, 13)), ["not aligned"]),
        (lambda g: g.tensors.append(("t", (1 << 20,), 0, 256)), ["tensor 't' ends at byte", "incomplete download"]),
        (lambda g: g.kv.append(("general.alignment", R.U32, 48)), ["power-of-two"]),
    ],
)
def test_bad_headers(tmp_path: Path, mutate: Any, fragments: list[str]) -> None:
    g = R.minimal()
    mutate(g)
    expect_error(write(tmp_path, g.build()), *fragments)


def test_big_endian_file(tmp_path: Path) -> None:
    g = R.minimal()
    g.endian = ">"
    g.magic = b"GGUF"
    expect_error(write(tmp_path, g.build()), "big-endian GGUF (version 3)", "byte offset 4")


def test_huge_string_length_is_not_allocated(tmp_path: Path) -> None:
    data = bytearray(R.minimal().build())
    # corrupt the length of the first key ("general.architecture") to 2**62
    struct.pack_into("<Q", data, 24, 2**62)
    expect_error(write(tmp_path, bytes(data)), "truncated", "byte offset 32")


def test_huge_array_length(tmp_path: Path) -> None:
    g = R.minimal()
    g.kv.append(("tokenizer.ggml.tokens", R.ARR, (R.STR, ["a", "b"])))
    data = bytearray(g.build())
    at = data.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 4 + 4
    struct.pack_into("<Q", data, at, 2**61)
    expect_error(write(tmp_path, bytes(data)), "array of 2305843009213693952 STRING does not fit")


def test_invalid_utf8_tensor_name(tmp_path: Path) -> None:
    g = R.minimal()
    g.tensors.append((b"\xff\xfe".decode("latin-1"), (64,), 0, 256))
    data = g.build().replace("ÿþ".encode(), b"\xff\xfe")
    # the length prefix changed with the encoding: rebuild by hand
    g2 = R.minimal()
    raw = bytearray(g2.build())
    raw[8:16] = struct.pack("<Q", 2)
    body = R.s(b"\xff\xfe") + struct.pack("<I", 1) + struct.pack("<Q", 64) + struct.pack("<IQ", 0, 256)
    end_ti = raw.index(b"blk.0.attn_norm.weight") + len(b"blk.0.attn_norm.weight") + 4 + 8 + 4 + 8
    raw[end_ti:end_ti] = body
    assert data
    expect_error(write(tmp_path, bytes(raw)), "not valid UTF-8")


@pytest.mark.parametrize("content", [b"", b"GG", b"GGUF\x03\x00"])
def test_tiny_files(tmp_path: Path, content: bytes) -> None:
    expect_error(write(tmp_path, content), "not a GGUF file")


def test_missing_and_directory(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.gguf", "no such file")
    expect_error(tmp_path, "directory")


def test_every_truncation_point_is_a_clean_error(tmp_path: Path) -> None:
    g = R.minimal()
    g.kv.append(("tokenizer.ggml.tokens", R.ARR, (R.STR, [f"t{i}" for i in range(1500)])))
    g.kv.append(("x.scores", R.ARR, (R.F32, [0.5] * 1500)))
    g.tensors.append(("blk.0.ffn_up_exps.weight", (256, 4, 2), 12, 256))
    g.data_size = 256 + 144 * 8
    full = g.build()
    read_header(write(tmp_path, full))
    step = max(1, len(full) // 400)
    for cut in range(0, len(full) - 1, step):
        p = write(tmp_path, full[:cut], f"cut{cut}.gguf")
        with pytest.raises(GGUFError):
            read_header(p)


def test_sparse_file_of_700_gb(tmp_path: Path) -> None:
    g = R.minimal()
    g.tensors.append(("blk.0.ffn_up_exps.weight", (7168, 2048, 256), 12, 256))
    p = write(tmp_path, g.build())
    nb = 7168 // 256 * 144 * 2048 * 256
    with open(p, "r+b") as f:
        f.truncate(f.seek(0, 2) + 256 + nb + 700 * 10**9)
    h = read_header(p)
    assert h.tensors[1].nbytes == nb


def test_version_2_reads_like_3(tmp_path: Path) -> None:
    g = R.minimal()
    g.version = 2
    h = read_header(write(tmp_path, g.build()))
    assert h.version == 2
    assert h.get("general.architecture") == "qwen3moe"


def test_ik_llama_cpp_quant_types(tmp_path: Path) -> None:
    """ik_llama.cpp's own types (IQ4_KS = 144, IQ2_KT = 153, Q8_K_R8 = 399) read with the
    right sizes, so ik quants of DeepSeek and Kimi can be inspected."""
    from moeconf.model.load import load_inventory

    g = R.minimal("deepseek2")
    g.tensors.append(("blk.0.ffn_up_exps.weight", (7168, 2048, 4), 144, 256))
    g.tensors.append(("blk.0.ffn_down_exps.weight", (2048, 7168, 4), 153, 256 + 7168 // 256 * 136 * 2048 * 4))
    size = 256 + 7168 // 256 * 136 * 2048 * 4 + 2048 // 256 * 68 * 7168 * 4
    g.data_size = size
    p = write(tmp_path, g.build(), "ik.gguf")
    h = read_header(p)
    up, down = h.tensors[1], h.tensors[2]
    assert (up.type_name, up.nbytes) == ("IQ4_KS", 7168 // 256 * 136 * 2048 * 4)
    assert (down.type_name, down.nbytes) == ("IQ2_KT", 2048 // 256 * 68 * 7168 * 4)
    inv = load_inventory(p)
    assert inv.by_name["blk.0.ffn_up_exps.weight"].group == "experts"
    # and a manifest keeps them
    from moeconf.model.manifest import read_manifest, write_manifest

    write_manifest(inv, tmp_path / "ik.json")
    assert read_manifest(tmp_path / "ik.json") == inv


# bits per weight of ik_llama.cpp's own types, as its quantize tool lists them
# (examples/quantize/quantize.cpp, rounded there to 2-3 digits): an oracle for the size table
IK_BPW = {"Q6_0": 6.5, "IQ1_BN": 1.62, "IQ2_BN": 2.0, "IQ2_K": 2.375, "IQ3_K": 3.44, "IQ4_K": 4.5, "IQ5_K": 5.5,
          "IQ6_K": 6.6, "IQ4_KS": 4.25, "IQ2_KS": 2.1875, "IQ4_KSS": 4.0, "IQ5_KS": 5.25, "IQ2_KT": 2.125,
          "IQ3_KT": 3.125, "IQ4_KT": 4.0, "IQ3_KS": 3.19, "IQ2_KL": 2.69, "IQ1_KT": 1.75, "IQ1_S_R4": 1.5,
          "Q8_KV": 8.0}
# repacked forms whose blocks are not the base type's (they drop or merge per-block sums)
_REPACK_OWN = {"IQ1_S_R4", "Q8_K_R8", "Q8_K_R16", "Q8_KR8"}


def test_ik_type_sizes_match_ik_bits_per_weight() -> None:
    from moeconf.model.ggml import IK_TYPES, quant_sizes, type_ids

    sizes, ids = quant_sizes(), type_ids()
    for name, bpw in IK_BPW.items():
        block, size = sizes[ids[name]]
        assert abs(size * 8 / block - bpw) < 0.03, name  # one byte a block is 0.03+
    for _tid, (name, block, size) in IK_TYPES.items():
        base = name.rsplit("_R", 1)[0]
        if "_R" not in name or name in _REPACK_OWN or base not in ids:
            continue
        b_block, b_size = sizes[ids[base]]
        assert size / block == b_size / b_block, name  # a repacked type keeps its base's bytes per weight
