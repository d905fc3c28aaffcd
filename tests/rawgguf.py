"""A byte-level GGUF builder for tests that need files the real writer refuses to make:
truncated, corrupt, big-endian, odd versions, every value type."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
       U64: "Q", I64: "q", F64: "d"}


def s(text: str | bytes, e: str = "<") -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(e + "Q", len(raw)) + raw


def value(vtype: int, v: Any, e: str = "<") -> bytes:
    if vtype == STR:
        return s(v, e)
    if vtype == ARR:
        etype, items = v
        out = struct.pack(e + "IQ", etype, len(items))
        return out + b"".join(value(etype, x, e) for x in items)
    return struct.pack(e + FMT.get(vtype, "I"), v)


@dataclass
class RawGGUF:
    kv: list[tuple[str, int, Any]] = field(default_factory=list)
    tensors: list[tuple[str, tuple[int, ...], int, int]] = field(default_factory=list)  # name, ne, type, offset
    version: int = 3
    magic: bytes = b"GGUF"
    endian: str = "<"
    n_tensors: int | None = None
    n_kv: int | None = None
    data_size: int = 0
    alignment: int = 32

    def build(self) -> bytes:
        e = self.endian
        out = bytearray(self.magic)
        out += struct.pack(e + "I", self.version)
        out += struct.pack(e + "Q", len(self.tensors) if self.n_tensors is None else self.n_tensors)
        out += struct.pack(e + "Q", len(self.kv) if self.n_kv is None else self.n_kv)
        for key, vtype, v in self.kv:
            out += s(key, e) + struct.pack(e + "I", vtype) + value(vtype, v, e)
        for name, ne, ttype, off in self.tensors:
            out += s(name, e) + struct.pack(e + "I", len(ne))
            out += b"".join(struct.pack(e + "Q", d) for d in ne)
            out += struct.pack(e + "IQ", ttype, off)
        pad = (-len(out)) % self.alignment
        out += b"\0" * pad
        out += b"\0" * self.data_size
        return bytes(out)


def minimal(arch: str = "qwen3moe", blocks: int = 1) -> RawGGUF:
    """A valid small file: architecture, block count and one F32 tensor."""
    g = RawGGUF()
    g.kv = [("general.architecture", STR, arch), (f"{arch}.block_count", U32, blocks)]
    g.tensors = [("blk.0.attn_norm.weight", (64,), 0, 0)]
    g.data_size = 256
    return g
