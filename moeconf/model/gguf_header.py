"""Read a GGUF file's header: metadata and tensor infos, never tensor data.

The file is memory-mapped and walked with `struct`; long arrays (tokenizer tokens, merges,
scores) are stepped over without being decoded, so a header of a 700 GB model with a 130k-token
vocabulary reads in tens of milliseconds. Every read is bounds-checked: a bad file is a
`GGUFError` naming the file and the byte offset, never a traceback, a hang or a huge allocation.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from moeconf.errors import GGUFError, open_regular
from moeconf.model import ggml

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32

# Arrays longer than this are stepped over, not decoded: only their element type and count are
# kept. Placement-relevant arrays (per-layer head counts, SWA patterns) are far shorter.
MAX_DECODED_ARRAY = 1024

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

VALUE_TYPE_NAMES = {
    UINT8: "UINT8", INT8: "INT8", UINT16: "UINT16", INT16: "INT16", UINT32: "UINT32",
    INT32: "INT32", FLOAT32: "FLOAT32", BOOL: "BOOL", STRING: "STRING", ARRAY: "ARRAY",
    UINT64: "UINT64", INT64: "INT64", FLOAT64: "FLOAT64",
}

_SCALAR = {
    UINT8: struct.Struct("<B"), INT8: struct.Struct("<b"), UINT16: struct.Struct("<H"),
    INT16: struct.Struct("<h"), UINT32: struct.Struct("<I"), INT32: struct.Struct("<i"),
    FLOAT32: struct.Struct("<f"), BOOL: struct.Struct("<?"), UINT64: struct.Struct("<Q"),
    INT64: struct.Struct("<q"), FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")
_MAX_NESTING = 4


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array that was stepped over: its element type and length, not its values."""

    element_type: int
    count: int


@dataclass(frozen=True)
class MetadataValue:
    """One metadata entry: its GGUF value type, and the decoded value (a `SkippedArray` for
    long arrays). For arrays, `element_type` is the type of the elements."""

    value_type: int
    value: Any
    element_type: int | None = None


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the header describes it. `shape` is in ggml order (ne0 first), as the
    engines print it; `offset` is relative to the start of the data section."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int
    info_offset: int = field(compare=False)  # byte offset of this entry, for error messages

    @property
    def type_name(self) -> str:
        return ggml.type_names().get(self.type_id, f"type#{self.type_id}")

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        size = ggml.nbytes(self.type_id, self.shape)
        if size is None:  # the reader rejects unknown types, so this is a bug
            raise AssertionError(f"unknown type {self.type_id} for {self.name}")
        return size


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, MetadataValue]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        entry = self.metadata.get(key)
        return default if entry is None else entry.value


class NeedMore(Exception):
    """A header read from a prefix of the file (a remote range read) stopped at the prefix's end:
    `offset` is the first byte it still needs, `estimate` how far the header probably reaches."""

    def __init__(self, offset: int, estimate: int, in_metadata: bool = True) -> None:
        super().__init__(offset)
        self.offset = offset
        self.estimate = max(offset, estimate)
        self.in_metadata = in_metadata  # stopped before the tensor infos


class _Cursor:
    """Bounds-checked little-endian reads over a buffer, raising GGUFError with offsets. `end` is
    the bytes the buffer holds; `size` the file's size (larger when only a prefix was read: a read
    past `end` but within `size` raises NeedMore instead of "truncated")."""

    __slots__ = ("buf", "end", "in_tensors", "off", "path", "size", "tensor_room")

    def __init__(self, buf: Any, path: str, end: int, size: int | None = None) -> None:
        self.buf = buf
        self.path = path
        self.end = end
        self.size = end if size is None else size
        self.off = 0
        self.tensor_room = 0  # bytes the tensor infos probably take, once the counts are known
        self.in_tensors = False

    def more(self, upto: int) -> NeedMore | None:
        """NeedMore when byte `upto` lies beyond the prefix but within the file."""
        if self.end < self.size and upto <= self.size:
            return NeedMore(upto, upto + self.tensor_room + (64 << 10), not self.in_tensors)
        return None

    def fail(self, message: str, offset: int | None = None) -> GGUFError:
        return GGUFError(message, path=self.path, offset=self.off if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.off + n > self.end:
            if n >= 0:
                more = self.more(self.off + n)
                if more is not None:
                    raise more
            raise self.fail(
                f"file is truncated: {what} needs {n} bytes but only {max(self.end - self.off, 0)} remain"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.off)
        self.off += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.off)
        self.off += 8
        return int(v)

    def string(self, what: str, strict: bool) -> str:
        start = self.off
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.off : self.off + n])
        self.off += n
        try:
            return raw.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8", start) from None

    def scalar(self, vtype: int, what: str) -> Any:
        st = _SCALAR[vtype]
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.off)
        self.off += st.size
        return v

    def skip_strings(self, count: int, what: str) -> None:
        # Hot loop: a DeepSeek vocabulary is ~230k strings (tokens + merges), each a length read and
        # stepped over, eight to a pass (a sixth faster than one); where that walk reads past the
        # buffer, the walk below does it again one string at a time, to say how far it got.
        buf, off, unpack = self.buf, self.off, _U64.unpack_from
        try:
            for _ in range(count >> 3):
                off += 8 + unpack(buf, off)[0]
                off += 8 + unpack(buf, off)[0]
                off += 8 + unpack(buf, off)[0]
                off += 8 + unpack(buf, off)[0]
                off += 8 + unpack(buf, off)[0]
                off += 8 + unpack(buf, off)[0]
                off += 8 + unpack(buf, off)[0]
                off += 8 + unpack(buf, off)[0]
            for _ in range(count & 7):
                off += 8 + unpack(buf, off)[0]
        except struct.error:
            pass
        else:
            if off <= self.end:
                self.off = off
                return
        # Reading past the buffer raises struct.error; a corrupt length only makes `off` large,
        # checked after.
        off = self.off
        start, done = off, 0
        try:
            for done in range(count):  # noqa: B007 - `done` is read after the loop
                off += 8 + unpack(buf, off)[0]
            done = count
        except struct.error:
            pass
        if done < count or off > self.end:
            if self.end < self.size:
                # a prefix: the strings read so far tell how far the rest of the array reaches
                avg = (off - start) / max(done, 1)
                estimate = int(off + avg * (count - done) * 1.1) + self.tensor_room + (64 << 10)
                raise NeedMore(min(off, self.end) + 8, estimate, not self.in_tensors)
            raise self.fail(f"file is truncated inside {what}", min(off, self.end))
        self.off = off


def _read_value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> MetadataValue:
    if vtype in _SCALAR:
        v = cur.scalar(vtype, f"value of {key!r}")
        return MetadataValue(vtype, v)
    if vtype == STRING:
        return MetadataValue(vtype, cur.string(f"value of {key!r}", strict=False))
    if vtype == ARRAY:
        if depth >= _MAX_NESTING:
            raise cur.fail(f"metadata {key!r}: arrays nested more than {_MAX_NESTING} deep")
        etype_at = cur.off
        etype = cur.u32(f"array type of {key!r}")
        count = cur.u64(f"array length of {key!r}")
        if etype not in VALUE_TYPE_NAMES:
            raise cur.fail(f"metadata {key!r}: unknown array element type {etype}", etype_at)
        remaining = cur.size - cur.off
        if etype in _SCALAR:
            width = _SCALAR[etype].size
            if count > remaining // width:
                raise cur.fail(
                    f"metadata {key!r}: array of {count} {VALUE_TYPE_NAMES[etype]} does not fit "
                    f"in the {remaining} bytes left (corrupt length or truncated file)"
                )
            if count > MAX_DECODED_ARRAY:
                cur.off += count * width
                return MetadataValue(vtype, SkippedArray(etype, count), etype)
            fmt = struct.Struct(f"<{count}{_SCALAR[etype].format[-1]}")
            cur.need(fmt.size, f"array {key!r}")
            values = list(fmt.unpack_from(cur.buf, cur.off))
            cur.off += fmt.size
            return MetadataValue(vtype, values, etype)
        # strings and nested arrays take at least 8 bytes each
        if count > remaining // 8:
            raise cur.fail(
                f"metadata {key!r}: array of {count} {VALUE_TYPE_NAMES[etype]} does not fit "
                f"in the {remaining} bytes left (corrupt length or truncated file)"
            )
        if etype == STRING and count > MAX_DECODED_ARRAY:
            cur.skip_strings(count, f"array {key!r}")
            return MetadataValue(vtype, SkippedArray(etype, count), etype)
        items = [_read_value(cur, etype, key, depth + 1).value for _ in range(count)]
        if count > MAX_DECODED_ARRAY:
            return MetadataValue(vtype, SkippedArray(etype, count), etype)
        return MetadataValue(vtype, items, etype)
    raise cur.fail(f"metadata {key!r}: unknown value type {vtype}")


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the header of one GGUF file (one shard of a split model)."""
    spath = os.fspath(path)
    try:
        with open_regular(spath, GGUFError, "a GGUF file") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _HEADER.size:
                raise GGUFError(
                    f"not a GGUF file: only {size} bytes (a GGUF header has at least {_HEADER.size})",
                    path=spath, offset=0,
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(mm, spath, size)
    except GGUFError:
        raise
    except IsADirectoryError:
        raise GGUFError("is a directory, not a GGUF file", path=spath) from None
    except FileNotFoundError:
        raise GGUFError("no such file", path=spath) from None
    except PermissionError:
        raise GGUFError("permission denied", path=spath) from None
    except (OSError, ValueError) as e:
        raise GGUFError(f"cannot read: {e}", path=spath) from None


def parse_prefix(buf: bytes, path: str, file_size: int) -> GGUFHeader:
    """The header from the first len(buf) bytes of a file of `file_size` bytes (a remote range
    read). Raises NeedMore when the header reaches past the prefix, GGUFError when it is bad."""
    if file_size < _HEADER.size:
        raise GGUFError(f"not a GGUF file: only {file_size} bytes (a GGUF header has at least {_HEADER.size})",
                        path=path, offset=0)
    if len(buf) < _HEADER.size:
        raise NeedMore(_HEADER.size, 1 << 20)
    return _parse(buf, path, file_size, available=min(len(buf), file_size))


def _parse(buf: Any, path: str, size: int, available: int | None = None) -> GGUFHeader:
    cur = _Cursor(buf, path, size if available is None else available, size)
    magic, version, n_tensors, n_kv = _HEADER.unpack_from(buf, 0)
    if magic != GGUF_MAGIC:
        if magic[::-1] == GGUF_MAGIC:
            raise cur.fail("GGUF magic is byte-swapped: big-endian GGUF files are not supported", 0)
        raise cur.fail(f"not a GGUF file: starts with {bytes(magic)!r}, expected b'GGUF'", 0)
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise cur.fail(
                f"big-endian GGUF (version {swapped}) is not supported; the engines here read "
                "little-endian files", 4,
            )
        if version == 1:
            raise cur.fail("GGUF version 1 is not supported (only 2 and 3); re-convert the model", 4)
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
    cur.off = _HEADER.size
    remaining = size - cur.off
    # each kv pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info 8 + 4 + 4 + 8
    if n_kv > remaining // 13:
        raise cur.fail(f"corrupt metadata count {n_kv}: the file has room for far fewer", 16)
    if n_tensors > remaining // 24:
        raise cur.fail(f"corrupt tensor count {n_tensors}: the file has room for far fewer", 8)
    cur.tensor_room = n_tensors * 128  # a tensor info is ~60-120 bytes (name, dims, type, offset)

    metadata: dict[str, MetadataValue] = {}
    for i in range(n_kv):
        key_at = cur.off
        key = cur.string(f"key of metadata entry {i}", strict=True)
        if key in metadata:
            raise cur.fail(f"duplicate metadata key {key!r}", key_at)
        vtype_at = cur.off
        vtype = cur.u32(f"type of metadata {key!r}")
        if vtype not in VALUE_TYPE_NAMES:
            raise cur.fail(f"metadata {key!r}: unknown value type {vtype}", vtype_at)
        metadata[key] = _read_value(cur, vtype, key)

    alignment = DEFAULT_ALIGNMENT
    align_entry = metadata.get("general.alignment")
    if align_entry is not None:
        a = align_entry.value
        if align_entry.value_type != UINT32 or a == 0 or a & (a - 1):
            raise cur.fail(f"general.alignment must be a power-of-two UINT32, got {a!r}")
        alignment = int(a)

    sizes = ggml.quant_sizes()
    names = ggml.type_names()
    cur.in_tensors = True
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        at = cur.off
        name = cur.string(f"name of tensor {i}", strict=True)
        if not name:
            raise cur.fail(f"tensor {i} has an empty name (corrupt tensor count or table)", at)
        if name in seen:
            raise cur.fail(f"duplicate tensor name {name!r}", at)
        seen.add(name)
        n_dims = cur.u32(f"dimension count of {name!r}")
        if n_dims > GGML_MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (at most {GGML_MAX_DIMS})", at)
        dims = tuple(cur.u64(f"dimensions of {name!r}") for _ in range(n_dims))
        n = 1
        for d in dims:
            if d == 0 or d >= 1 << 62:
                raise cur.fail(f"tensor {name!r} has an invalid dimension {d} in {list(dims)}", at)
            n *= d
            if n >= 1 << 62:
                raise cur.fail(f"tensor {name!r}: element count of {list(dims)} overflows", at)
        type_at = cur.off
        type_id = cur.u32(f"type of {name!r}")
        if type_id not in sizes:
            raise cur.fail(
                f"tensor {name!r} has ggml type {type_id}, which moeconf does not know (it knows the "
                "installed gguf package's types and ik_llama.cpp's); a newer gguf package may",
                type_at,
            )
        block = sizes[type_id][0]
        if dims and dims[0] % block:
            raise cur.fail(
                f"tensor {name!r}: first dimension {dims[0]} is not a multiple of the "
                f"{names[type_id]} block size {block}", at,
            )
        offset = cur.u64(f"data offset of {name!r}")
        if offset % alignment:
            raise cur.fail(f"tensor {name!r}: data offset {offset} is not aligned to {alignment}", at)
        tensors.append(TensorInfo(name, dims, type_id, offset, at))
        cur.tensor_room = (n_tensors - i - 1) * 128

    data_offset = (cur.off + alignment - 1) // alignment * alignment
    header = GGUFHeader(path, version, metadata, tuple(tensors), alignment, data_offset, size)
    for t in header.tensors:
        end = data_offset + t.offset + t.nbytes
        if end > size:
            raise GGUFError(
                f"file is truncated: tensor {t.name!r} ends at byte {end} but the file has {size} "
                "bytes (incomplete download?)",
                path=path, offset=t.info_offset,
            )
    return header
