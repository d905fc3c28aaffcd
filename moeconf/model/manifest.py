"""Manifests: a small JSON snapshot of an inventory, for repositories without the weights.

A manifest holds the raw facts (metadata and each tensor's name, type, shape, byte size);
loading it re-derives layers and groups exactly as reading the GGUF does. Its schema is
`schemas/manifest.schema.json`. Tensors are written one a line so diffs stay readable.
"""

from __future__ import annotations

import json
import os
from typing import Any

from moeconf.atomic import write_text_atomic
from moeconf.errors import ManifestError, read_text
from moeconf.model import ggml
from moeconf.model.inventory import Inventory, ModelMetadata, RawTensor, build_inventory

FORMAT = "moeconf-manifest"
VERSION = 2
# version 1 lacks the attention geometry (key/value lengths, MLA ranks, sliding window, vocab):
# still read, with a warning that memory cannot be computed
READS = (1, 2)

_INT_FIELDS = tuple(k for k in ModelMetadata.ARCH_KEYS if k not in ModelMetadata.ARRAY_KEYS)


def manifest_dict(inv: Inventory) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": {
            "file": os.path.basename(inv.source) if inv.source else None,
            "shards": len(inv.shards) or 1,
        },
        "metadata": inv.metadata.as_dict(),
        "tensors": [
            {"name": t.name, "type": t.type, "shape": list(t.shape), "nbytes": t.nbytes}
            for t in inv.tensors
        ],
    }


def dumps_manifest(inv: Inventory) -> str:
    d = manifest_dict(inv)
    tensors = d.pop("tensors")
    head = json.dumps(d, indent=2)
    lines = ",\n".join("    " + json.dumps(t, separators=(", ", ": ")) for t in tensors)
    return head[:-2] + ',\n  "tensors": [\n' + lines + "\n  ]\n}\n"


def write_manifest(inv: Inventory, path: str | os.PathLike[str]) -> None:
    write_text_atomic(path, dumps_manifest(inv))


def _fail(path: str, where: str, message: str) -> ManifestError:
    return ManifestError(f"{where}: {message}" if where else message, path=path)


def _want_int(path: str, where: str, v: Any, *, nullable: bool, minimum: int = 0) -> int | None:
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        kind = f"an integer >= {minimum}" + (" or null" if nullable else "")
        raise _fail(path, where, f"expected {kind}, got {json.dumps(v)}")
    return v


def parse_manifest(data: Any, path: str) -> Inventory:
    if not isinstance(data, dict):
        raise _fail(path, "", "a manifest is a JSON object")
    if data.get("format") != FORMAT:
        raise _fail(path, "format", f"expected {FORMAT!r}: is this a moeconf manifest?")
    version = data.get("version")
    if isinstance(version, bool) or version not in READS:
        raise _fail(path, "version", f"unsupported manifest version {version!r} (this moeconf reads "
                    f"{', '.join(map(str, READS))})")
    md = data.get("metadata")
    if not isinstance(md, dict):
        raise _fail(path, "metadata", "expected an object")
    known = {"arch", "name", "file_type", *ModelMetadata.ARCH_KEYS}
    if version == 1:
        known -= set(ModelMetadata.GEOMETRY_KEYS)
    extra = sorted(set(md) - known)
    if extra:
        raise _fail(path, f"metadata.{extra[0]}", f"unknown key (known: {', '.join(sorted(known))})")
    arch = md.get("arch")
    if not isinstance(arch, str) or not arch:
        raise _fail(path, "metadata.arch", "expected the architecture name, e.g. \"deepseek2\"")
    name = md.get("name")
    if name is not None and not isinstance(name, str):
        raise _fail(path, "metadata.name", "expected a string or null")
    values: dict[str, Any] = {}
    for k in _INT_FIELDS:
        values[k] = _want_int(path, f"metadata.{k}", md.get(k), nullable=k != "block_count")
    for k in ModelMetadata.ARRAY_KEYS:
        kv = md.get(k)
        if isinstance(kv, list):
            values[k] = tuple(
                _want_int(path, f"metadata.{k}[{i}]", x, nullable=False) for i, x in enumerate(kv)
            )
        else:
            values[k] = _want_int(path, f"metadata.{k}", kv, nullable=True)
    values["file_type"] = _want_int(path, "metadata.file_type", md.get("file_type"), nullable=True)
    metadata = ModelMetadata(arch=arch, name=name, geometry_known=version != 1, **values)

    tensors = data.get("tensors")
    if not isinstance(tensors, list):
        raise _fail(path, "tensors", "expected a list of tensors")
    raw: list[RawTensor] = []
    seen: set[str] = set()
    type_ids = ggml.type_ids()
    for i, t in enumerate(tensors):
        where = f"tensors[{i}]"
        if not isinstance(t, dict):
            raise _fail(path, where, "expected an object {name, type, shape, nbytes}")
        tname = t.get("name")
        if not isinstance(tname, str) or not tname:
            raise _fail(path, f"{where}.name", "expected a tensor name")
        where = f"tensor {tname!r}"
        if tname in seen:
            raise _fail(path, where, "appears twice")
        seen.add(tname)
        ttype = t.get("type")
        if not isinstance(ttype, str) or ttype not in type_ids:
            raise _fail(path, f"{where}.type", f"unknown ggml type {ttype!r}")
        shape = t.get("shape")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 4:
            raise _fail(path, f"{where}.shape", "expected 1 to 4 dimensions")
        dims = tuple(_want_int(path, f"{where}.shape", d, nullable=False, minimum=1) or 0 for d in shape)
        try:
            size = ggml.nbytes(type_ids[ttype], dims)
        except ValueError as e:
            raise _fail(path, f"{where}.shape", str(e)) from None
        nbytes = t.get("nbytes")
        if size is None or nbytes != size:
            raise _fail(path, f"{where}.nbytes", f"{nbytes!r} disagrees with {ttype} {list(dims)}: {size} bytes")
        extra_t = sorted(set(t) - {"name", "type", "shape", "nbytes"})
        if extra_t:
            raise _fail(path, f"{where}.{extra_t[0]}", "unknown key")
        raw.append(RawTensor(tname, ggml.type_names()[type_ids[ttype]], dims, size))
    src = data.get("source")
    shards: tuple[str, ...] = ()
    if isinstance(src, dict) and isinstance(src.get("shards"), int) and src["shards"] > 1:
        shards = tuple(f"shard {i + 1}" for i in range(src["shards"]))
    inv = build_inventory(metadata, raw, source=path, shards=shards)
    if version == 1:
        from dataclasses import replace

        inv = replace(inv, warnings=(*inv.warnings, (
            "manifest version 1 has no attention geometry (key/value lengths, MLA ranks, sliding window, "
            "vocabulary): weights per device are exact, KV cache and compute cannot be computed; regenerate "
            "it with `moeconf inspect MODEL.gguf --manifest`")))
    return inv


def read_manifest(path: str | os.PathLike[str]) -> Inventory:
    spath = os.fspath(path)
    text = read_text(spath, ManifestError, "a manifest")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(f"invalid JSON: {e.msg}", path=spath, line=e.lineno, column=e.colno) from None
    return parse_manifest(data, spath)
