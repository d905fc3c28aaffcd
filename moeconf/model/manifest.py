"""Manifests: a small JSON snapshot of an inventory, for repositories without the weights.

A manifest holds the raw facts (metadata and each tensor's name, type, shape, byte size);
loading it re-derives layers and groups exactly as reading the GGUF does. Its schema is
`schemas/manifest.schema.json`. Tensors are written one a line so diffs stay readable.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from moeconf.errors import ManifestError, read_text
from moeconf.model import ggml
from moeconf.model.inventory import MAX_HPARAM_ARRAY, Inventory, ModelMetadata, RawTensor, build_inventory

FORMAT = "moeconf-manifest"
VERSION = 3
# version 1 lacks the attention geometry (key/value lengths, MLA ranks, sliding window, vocab):
# still read, with a warning that memory cannot be computed. Version 3 adds every other integer
# `{arch}.*` key (`hparams`) and the names of all of them (`arch_keys`), which the memory model
# needs for architectures beyond the first five and to know what it does not model
READS = (1, 2, 3)

_INT_FIELDS = tuple(k for k in ModelMetadata.ARCH_KEYS if k not in ModelMetadata.ARRAY_KEYS)


def manifest_dict(inv: Inventory) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": {
            # shard 1's name (a remote model's source is its MODEL string; a local one may be a later shard)
            "file": os.path.basename(inv.shards[0]) if inv.shards and inv.shards[0].endswith(".gguf") else (
                os.path.basename(inv.source) if inv.source else None),
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
    from moeconf.atomic import write_text_atomic  # here: reading a model writes nothing (tempfile's import)

    write_text_atomic(path, dumps_manifest(inv))


def _fail(path: str, where: str, message: str) -> ManifestError:
    return ManifestError(f"{where}: {message}" if where else message, path=path)


def _short(v: Any) -> str:
    """A JSON value for a message, cut short (a wrong-typed value may be huge)."""
    try:
        text = json.dumps(v)
    except (ValueError, RecursionError):
        text = type(v).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _want_int(path: str, where: str, v: Any, *, nullable: bool, minimum: int = 0) -> int | None:
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        kind = f"an integer >= {minimum}" + (" or null" if nullable else "")
        raise _fail(path, where, f"expected {kind}, got {_short(v)}")
    return v


def _hparams(path: str, data: Any) -> tuple[tuple[str, int | tuple[int, ...]], ...]:
    if not isinstance(data, dict):
        raise _fail(path, "metadata.hparams", "expected an object of integer (or integer list) keys")
    out: list[tuple[str, int | tuple[int, ...]]] = []
    for k, v in data.items():
        where = f"metadata.hparams.{k}"
        if k in ModelMetadata.KEY_ATTRS and not isinstance(v, list):
            # a per-layer key's array is kept here, its first layer's entry in metadata
            raise _fail(path, where, f"a key of its own in metadata ({ModelMetadata.KEY_ATTRS[k]})")
        if isinstance(v, list):
            if len(v) > MAX_HPARAM_ARRAY:
                raise _fail(path, where, f"more than {MAX_HPARAM_ARRAY} entries")
            out.append((k, tuple(_want_int(path, f"{where}[{i}]", x, nullable=False, minimum=-(1 << 63)) or 0
                                 for i, x in enumerate(v))))
        else:
            out.append((k, _want_int(path, where, v, nullable=False, minimum=-(1 << 63)) or 0))
    return tuple(sorted(out))


def _floats(path: str, data: Any) -> tuple[tuple[str, float | tuple[float, ...]], ...]:
    """The float `{arch}.*` keys' values (a scalar or a per-layer list), as a GGUF holds them."""
    if not isinstance(data, dict):
        raise _fail(path, "metadata.floats", "expected an object of float (or float list) keys")
    out: list[tuple[str, float | tuple[float, ...]]] = []
    for k, v in data.items():
        where = f"metadata.floats.{k}"
        items = v if isinstance(v, list) else [v]
        if isinstance(v, list) and not 0 < len(v) <= MAX_HPARAM_ARRAY:
            raise _fail(path, where, f"expected 1 to {MAX_HPARAM_ARRAY} entries")
        if any(isinstance(x, bool) or not isinstance(x, int | float) for x in items):
            raise _fail(path, where, f"expected a number or a list of numbers, got {_short(v)}")
        out.append((k, tuple(float(x) for x in items) if isinstance(v, list) else float(v)))
    return tuple(sorted(out))


def parse_manifest(data: Any, path: str) -> Inventory:
    if not isinstance(data, dict):
        raise _fail(path, "", "a manifest is a JSON object")
    if data.get("format") != FORMAT:
        raise _fail(path, "format", f"expected {FORMAT!r}: is this a moeconf manifest?")
    version = data.get("version")
    if isinstance(version, bool) or version not in READS:
        raise _fail(path, "version", f"unsupported manifest version {_short(version)} (this moeconf reads "
                    f"{', '.join(map(str, READS))})")
    md = data.get("metadata")
    if not isinstance(md, dict):
        raise _fail(path, "metadata", "expected an object")
    known = {"arch", "name", "file_type", *ModelMetadata.ARCH_KEYS}
    if version == 1:
        known -= set(ModelMetadata.GEOMETRY_KEYS)
    if version >= 3:
        known |= {"hparams", "arch_keys", "floats"}
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
    values["hparams"] = _hparams(path, md.get("hparams", {}))
    arch_keys = md.get("arch_keys")
    if arch_keys is not None:
        if not isinstance(arch_keys, list) or not all(isinstance(k, str) and k for k in arch_keys):
            raise _fail(path, "metadata.arch_keys", "expected a list of key names (after `{arch}.`)")
        values["arch_keys"] = tuple(sorted(set(arch_keys) | {k for k, _ in values["hparams"]}))
    floats = _floats(path, md.get("floats", {}))
    values["float_values"] = floats
    # as the GGUF reader keeps them: the scalar keys whose value is 0 or 1, and those that are 0
    values["unit_floats"] = tuple(k for k, v in floats if isinstance(v, float) and v in (0.0, 1.0))
    values["zero_floats"] = tuple(k for k, v in floats if isinstance(v, float) and v == 0.0)
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
            raise _fail(path, f"{where}.type", f"unknown ggml type {_short(ttype)}")
        shape = t.get("shape")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 4:
            raise _fail(path, f"{where}.shape", "expected 1 to 4 dimensions")
        dims = tuple(_want_int(path, f"{where}.shape", d, nullable=False, minimum=1) or 0 for d in shape)
        n_elements = 1
        for d in dims:
            n_elements *= d
        if n_elements >= 1 << 62:  # the same bound as the GGUF reader's
            raise _fail(path, f"{where}.shape", f"element count of {_short(list(dims))} overflows")
        try:
            size = ggml.nbytes(type_ids[ttype], dims)
        except ValueError as e:
            raise _fail(path, f"{where}.shape", str(e)) from None
        nbytes = t.get("nbytes")
        if size is None or nbytes != size:
            raise _fail(path, f"{where}.nbytes", f"{_short(nbytes)} disagrees with {ttype} {list(dims)}: {size} bytes")
        extra_t = sorted(set(t) - {"name", "type", "shape", "nbytes"})
        if extra_t:
            raise _fail(path, f"{where}.{extra_t[0]}", "unknown key")
        raw.append(RawTensor(tname, ggml.type_names()[type_ids[ttype]], dims, size))
    src = data.get("source", {})
    if not isinstance(src, dict):
        raise _fail(path, "source", "expected an object {file, shards}")
    extra_s = sorted(set(src) - {"file", "shards"})
    if extra_s:
        raise _fail(path, f"source.{extra_s[0]}", "unknown key (known: file, shards)")
    if src.get("file") is not None and not isinstance(src["file"], str):
        raise _fail(path, "source.file", f"expected a file name or null, got {_short(src['file'])}")
    n_shards = _want_int(path, "source.shards", src.get("shards", 1), nullable=False, minimum=1) or 1
    # a shard holds at least one tensor, except the first, which may hold only metadata
    if n_shards > len(raw) + 1:
        raise _fail(path, "source.shards", f"{n_shards} shards cannot hold {len(raw)} tensors (each shard but "
                    "the first holds at least one): the count is corrupt")
    shards = tuple(f"shard {i + 1}" for i in range(n_shards)) if n_shards > 1 else ()
    inv = build_inventory(metadata, raw, source=path, shards=shards, error=ManifestError, from_manifest=True)
    if version == 1:
        from dataclasses import replace

        inv = replace(inv, warnings=(*inv.warnings, (
            "manifest version 1 has no attention geometry (key/value lengths, MLA ranks, sliding window, "
            "vocabulary): weights per device are exact, KV cache and compute cannot be computed; regenerate "
            "it with `moeconf inspect MODEL.gguf --manifest`")))
    return inv


# A manifest of the largest models is well under a megabyte; anything far larger is not one.
MAX_MANIFEST_BYTES = 64 << 20
# A manifest nests four deep (object > tensors > tensor > shape); Python's json recursion fails
# somewhere near 1000.
MAX_NESTING = 64


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _nesting_error(text: str, path: str) -> ManifestError | None:
    """Where `text` first nests deeper than MAX_NESTING (strings skipped), or None."""
    depth = 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                line, col = _position(text, i)
                return ManifestError(f"JSON nested more than {MAX_NESTING} deep (a manifest nests 4 deep)",
                                     path=path, line=line, column=col)
        elif ch in "]}":
            depth -= 1
    return None


def loads_manifest_json(text: str, path: str) -> Any:
    """json.loads with every failure a ManifestError at line:col: syntax, nesting too deep for
    the parser, integers longer than Python converts (4300 digits)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(f"invalid JSON: {e.msg}", path=path, line=e.lineno, column=e.colno) from None
    except RecursionError:
        err = _nesting_error(text, path)
        raise (err or ManifestError("JSON nested too deeply", path=path)) from None
    except ValueError:  # int too long to convert: the decoder gives no position
        m = re.search(r"\d{" + str(sys.get_int_max_str_digits() + 1) + ",}", text)
        line, col = _position(text, m.start()) if m else (None, None)
        limit = sys.get_int_max_str_digits()
        raise ManifestError(f"a number in the JSON has more than {limit} digits", path=path, line=line,
                            column=col) from None


def read_manifest(path: str | os.PathLike[str]) -> Inventory:
    spath = os.fspath(path)
    text = read_text(spath, ManifestError, "a manifest", max_bytes=MAX_MANIFEST_BYTES)
    return parse_manifest(loads_manifest_json(text, spath), spath)
