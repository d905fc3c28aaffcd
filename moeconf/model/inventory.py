"""The tensor inventory: a model exactly as the engines see it.

An `Inventory` is built from raw facts (architecture, placement-relevant metadata, and each
tensor's name, type and shape), read from a GGUF header (all shards of a split model) or from a
manifest. Everything else (byte sizes, layers, groups, layer kinds) is derived here, so a GGUF
and its manifest give identical inventories.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from moeconf.errors import GGUFError, MoeconfError
from moeconf.model import ggml
from moeconf.model.gguf_header import GGUFHeader, SkippedArray, read_header
from moeconf.model.homes import array_reading, router_optional
from moeconf.model.taxonomy import (
    Group,
    LayerKind,
    arch_tensor_kinds,
    classify_name,
    is_recurrent_layer,
    known_architectures,
)


@dataclass(frozen=True)
class ModelMetadata:
    """The metadata that matters for placement. Counts absent from the file are None."""

    arch: str
    block_count: int
    name: str | None = None
    file_type: int | None = None
    expert_count: int | None = None
    expert_used_count: int | None = None
    expert_shared_count: int | None = None
    leading_dense_block_count: int | None = None
    interleave_moe_layer_step: int | None = None
    moe_every_n_layers: int | None = None
    nextn_predict_layers: int | None = None
    embedding_length: int | None = None
    expert_feed_forward_length: int | None = None
    context_length: int | None = None
    head_count: int | None = None
    head_count_kv: int | tuple[int, ...] | None = None
    # attention geometry, for the memory model (manifest version 2)
    key_length: int | None = None
    value_length: int | None = None
    key_length_mla: int | None = None
    value_length_mla: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    rope_dimension_count: int | None = None
    sliding_window: int | None = None
    sliding_window_pattern: int | tuple[int, ...] | None = None
    vocab_size: int | None = None
    # False for a version-1 manifest, which predates the geometry keys above
    geometry_known: bool = True
    # every other integer (bool, integer array) `{arch}.*` key, by its name after `{arch}.`
    # (`ssm.state_size`, `full_attention_interval`): what architecture-specific memory reads
    hparams: tuple[tuple[str, int | tuple[int, ...]], ...] = ()
    # the name after `{arch}.` of every `{arch}.*` key in the file, whatever its type; None where
    # the source did not record them (a manifest before version 3)
    arch_keys: tuple[str, ...] | None = None
    # the float `{arch}.*` keys whose value is 0 or 1 (a scale the graph then leaves out); from a GGUF, or a
    # manifest that carries the values (`floats`; an older one does not: its float keys count as scales that run)
    unit_floats: tuple[str, ...] = field(default=(), compare=False)
    # the float `{arch}.*` keys' values, scalars and arrays (per-layer limits: Step-3.5's swiglu_clamp_exp);
    # from a GGUF or a manifest's `floats`, like `unit_floats`
    float_values: tuple[tuple[str, float | tuple[float, ...]], ...] = field(default=(), compare=False)
    # those of them whose value is 0 (a scale some graphs run whenever it is not 0: Granite's)
    zero_floats: tuple[str, ...] = field(default=(), compare=False)

    def hparam(self, key: str) -> int | tuple[int, ...] | None:
        """An `{arch}.KEY` integer (or integer array) from the file, by its name after `{arch}.`."""
        for k, v in self.hparams:
            if k == key:
                return v
        attr = self.KEY_ATTRS.get(key)
        if attr is not None:
            value: int | tuple[int, ...] | None = getattr(self, attr)
            return value
        return None

    @property
    def file_type_name(self) -> str | None:
        if self.file_type is None:
            return None
        return ggml.file_type_names().get(self.file_type, f"ftype#{self.file_type}")

    # Keys as they are spelled in a GGUF, `{arch}` replaced by the architecture.
    ARCH_KEYS: ClassVar[dict[str, str]] = {
        "block_count": "block_count",
        "expert_count": "expert_count",
        "expert_used_count": "expert_used_count",
        "expert_shared_count": "expert_shared_count",
        "leading_dense_block_count": "leading_dense_block_count",
        "interleave_moe_layer_step": "interleave_moe_layer_step",
        "moe_every_n_layers": "moe_every_n_layers",
        "nextn_predict_layers": "nextn_predict_layers",
        "embedding_length": "embedding_length",
        "expert_feed_forward_length": "expert_feed_forward_length",
        "context_length": "context_length",
        "head_count": "attention.head_count",
        "head_count_kv": "attention.head_count_kv",
        "key_length": "attention.key_length",
        "value_length": "attention.value_length",
        "key_length_mla": "attention.key_length_mla",
        "value_length_mla": "attention.value_length_mla",
        "kv_lora_rank": "attention.kv_lora_rank",
        "q_lora_rank": "attention.q_lora_rank",
        "rope_dimension_count": "rope.dimension_count",
        "sliding_window": "attention.sliding_window",
        "sliding_window_pattern": "attention.sliding_window_pattern",
        "vocab_size": "vocab_size",
    }
    # the attribute of each key (by its name after `{arch}.`)
    KEY_ATTRS: ClassVar[dict[str, str]] = {}
    # keys whose value may be a per-layer array
    ARRAY_KEYS: ClassVar[frozenset[str]] = frozenset({"head_count_kv", "sliding_window_pattern"})
    # keys a version-1 manifest does not have: without them, KV and compute cannot be computed
    GEOMETRY_KEYS: ClassVar[tuple[str, ...]] = (
        "key_length", "value_length", "key_length_mla", "value_length_mla", "kv_lora_rank", "q_lora_rank",
        "rope_dimension_count", "sliding_window", "sliding_window_pattern", "vocab_size",
    )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in ("arch", "name", "file_type", *self.ARCH_KEYS):
            v = getattr(self, k)
            out[k] = list(v) if isinstance(v, tuple) else v
        if self.hparams:
            out["hparams"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.hparams}
        if self.arch_keys is not None:
            out["arch_keys"] = list(self.arch_keys)
        if self.float_values:
            out["floats"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.float_values}
        return out


ModelMetadata.KEY_ATTRS.update({key: attr for attr, key in ModelMetadata.ARCH_KEYS.items()})

# integer arrays longer than this are not kept in `hparams` (a per-layer array is at most a few
# hundred entries; anything longer is no hyperparameter memory reads)
MAX_HPARAM_ARRAY = 4096


@dataclass(frozen=True)
class Tensor:
    """One tensor: name, ggml type name, shape (ggml order, as the engines print it), byte
    size, layer index (None outside `blk.N`), group, and the group it would have outside a
    nextn block (`role`: for `blk.46.ffn_up_exps.weight` of GLM-4.5-Air, group `nextn`, role
    `experts`), and its base name (`ffn_up_exps`)."""

    name: str
    type: str
    shape: tuple[int, ...]
    nbytes: int
    layer: int | None
    group: Group
    role: Group
    base: str
    known: bool = True  # False: no pinned engine knows the name (group `other`)


@dataclass(frozen=True)
class Layer:
    """A block: `kind` is its FFN (dense, moe, nextn); `recurrent` says its mixer keeps a
    recurrent state (SSM, gated delta-net, KDA, linear attention) instead of or beside attention."""

    index: int
    kind: LayerKind
    recurrent: bool = False


@dataclass(frozen=True)
class RawTensor:
    """What a source (GGUF or manifest) says of a tensor, before classification."""

    name: str
    type: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Inventory:
    """A model's tensors, layers and placement metadata. Equality ignores where it came from."""

    metadata: ModelMetadata
    tensors: tuple[Tensor, ...]
    layers: tuple[Layer, ...]
    warnings: tuple[str, ...] = ()
    source: str = field(default="", compare=False)
    shards: tuple[str, ...] = field(default=(), compare=False)
    from_manifest: bool = field(default=False, compare=False)  # read from a manifest: no weights, no GGUF path

    @property
    def arch(self) -> str:
        return self.metadata.arch

    @property
    def block_count(self) -> int:
        return self.metadata.block_count

    @cached_property
    def by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    def layers_of_kind(self, kind: LayerKind) -> list[int]:
        """Block indices of a layer kind; `recurrent` selects by mixer, the others by FFN."""
        if kind == "recurrent":
            return [layer.index for layer in self.layers if layer.recurrent]
        return [layer.index for layer in self.layers if layer.kind == kind]

    @property
    def unknown_tensors(self) -> tuple[str, ...]:
        """Names no pinned engine knows (grouped `other`; the engine would refuse the file)."""
        return tuple(t.name for t in self.tensors if not t.known)

    def layers_with(self, group: Group) -> list[int]:
        """Block indices that have at least one tensor whose role is `group`."""
        return sorted({t.layer for t in self.tensors if t.layer is not None and t.role == group})

    def total_bytes(self, tensors: Iterable[Tensor] | None = None) -> int:
        return sum(t.nbytes for t in (self.tensors if tensors is None else tensors))

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def build_inventory(
    metadata: ModelMetadata, raw: Iterable[RawTensor], *, source: str = "", shards: tuple[str, ...] = (),
    error: type[MoeconfError] = MoeconfError, from_manifest: bool = False,
) -> Inventory:
    """Classify raw tensors and layers; cross-check layer kinds against the metadata.

    Counts from the metadata are checked against the tensors present before anything loops
    over them: every block holds at least one tensor, so a `block_count` above the number of
    tensors (a corrupt or hostile header claiming billions of blocks) is an `error`."""
    raw = list(raw)
    check_count(f"{metadata.arch}.block_count", metadata.block_count, len(raw), "tensors",
                source, error, hint="every block holds at least one tensor (a vocabulary-only GGUF has no "
                "tensors to place)")
    if isinstance(metadata.head_count_kv, tuple) and len(metadata.head_count_kv) > max(metadata.block_count, 1):
        raise error(f"{metadata.arch}.attention.head_count_kv has {len(metadata.head_count_kv)} entries for "
                    f"{metadata.block_count} blocks", path=source or None)
    warnings: list[str] = []
    per_layer_roles: dict[int, set[str]] = {}
    per_layer_bases: dict[int, set[str]] = {}
    classified: list[tuple[RawTensor, Any]] = []
    unknown: list[str] = []
    for r in raw:
        parts = r.name.split(".", 2)
        if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() and len(parts[1]) > 9:
            raise error(f"tensor {r.name[:40]}...{r.name[-20:]}: a block number of {len(parts[1])} digits (no model "
                        "has that many blocks)", path=source or None)
        k = classify_name(r.name)
        classified.append((r, k))
        if not k.known:
            unknown.append(r.name)
        if k.layer is not None:
            roles = per_layer_roles.setdefault(k.layer, set())
            roles.add(k.group)
            per_layer_bases.setdefault(k.layer, set()).add(k.base)
    engines = known_architectures()
    if not any(metadata.arch in archs for archs in engines.values()):
        warnings.append(f"architecture {metadata.arch!r} is unknown to the pinned engines "
                        f"({', '.join(engines)}): they refuse to load it")
    foreign = _not_created(metadata.arch, classified)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        warnings.append(f"{len(foreign)} tensor(s) of kinds the pinned engines' {metadata.arch} loader does not create "
                        f"(the engines refuse a file with tensors they do not create): {shown}")
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        warnings.append(f"{len(unknown)} tensor name(s) unknown to the pinned engines, grouped as 'other' "
                        f"(the engines refuse a file with tensors they do not create): {shown}")

    kinds: dict[int, LayerKind] = {}
    for il, roles in per_layer_roles.items():
        if "nextn" in roles:
            kinds[il] = "nextn"
        elif "experts" in roles:
            kinds[il] = "moe"
        else:
            kinds[il] = "dense"

    nb = metadata.block_count
    top = max(per_layer_roles, default=-1)
    if top >= nb:
        warnings.append(f"tensors name block {top}, but {metadata.arch}.block_count is {nb}")
    missing = [il for il in range(nb) if il not in kinds]
    if missing:
        warnings.append(f"blocks without tensors: {format_ranges(missing)} (block_count {nb})")
    warnings.extend(_cross_check(metadata, kinds))

    tensors = tuple(
        Tensor(
            name=r.name, type=r.type, shape=r.shape, nbytes=r.nbytes, layer=k.layer,
            group="nextn" if k.layer is not None and kinds.get(k.layer) == "nextn" else k.group,
            role=k.group, base=k.base, known=k.known,
        )
        for r, k in classified
    )
    layers = tuple(
        Layer(il, kinds[il], is_recurrent_layer(metadata.arch, per_layer_roles[il], per_layer_bases.get(il, set())))
        for il in sorted(kinds))
    return Inventory(metadata, tensors, layers, tuple(warnings), source, shards, from_manifest)


def _not_created(arch: str, classified: list[tuple[RawTensor, Any]]) -> list[str]:
    """Known names whose kinds no pinned engine's loader for `arch` creates (empty when neither
    engine knows the architecture: that is warned about on its own)."""
    loaders = [k for k in (arch_tensor_kinds("llama.cpp", arch), arch_tensor_kinds("ik_llama.cpp", arch)) if k]
    if not loaders:
        return []
    made = frozenset().union(*loaders)
    return [r.name for r, k in classified if k.known and not made.intersection(k.kinds)]


def check_count(what: str, value: int, limit: int, limit_what: str, source: str,
                error: type[MoeconfError] = MoeconfError, hint: str | None = None) -> None:
    """Raise `error` when a count read from a file exceeds what the file can hold."""
    if value > limit:
        raise error(f"{what} is {value}, but there are only {limit} {limit_what}: the count is corrupt",
                    path=source or None, hint=hint)


def _cross_check(md: ModelMetadata, kinds: dict[int, LayerKind]) -> list[str]:
    """Where the metadata's block arithmetic disagrees with the tensors present."""
    out: list[str] = []
    nb = md.block_count
    n_nextn = md.nextn_predict_layers or 0
    expected: dict[int, LayerKind] = {}
    lead = md.leading_dense_block_count or 0
    step = md.interleave_moe_layer_step or md.moe_every_n_layers or 1
    has_experts = bool(md.expert_count)
    # Nemotron-H gives each layer its FFN width; 0 = no FFN (a Mamba-2 or attention
    # layer: pinned llama.cpp src/models/nemotron-h.cpp, load_arch_hparams / load_arch_tensors,
    # the one loader of nemotron_h and nemotron_h_moe)
    ff = md.hparam("feed_forward_length") if md.arch in ("nemotron_h", "nemotron_h_moe") else None
    no_ffn = {il for il, w in enumerate(ff) if w == 0} if isinstance(ff, tuple) else set()
    for il in range(nb):
        if il >= nb - n_nextn:
            expected[il] = "nextn"
        elif has_experts and il >= lead and (il + 1) % step == 0 and il not in no_ffn:
            expected[il] = "moe"
        else:
            expected[il] = "dense"
    if not has_experts and any(k == "moe" for k in kinds.values()):
        out.append(f"tensors have routed experts but {md.arch}.expert_count is {md.expert_count}")
        return out
    if router_optional(md.arch):
        return out  # its loader reads which blocks are MoE from the tensors themselves
    by_pair: dict[tuple[str, str], list[int]] = {}
    for il, kind in sorted(kinds.items()):
        exp = expected.get(il)
        if exp is not None and exp != kind:
            by_pair.setdefault((kind, exp), []).append(il)
    for (found, meta), ils in by_pair.items():
        out.append(
            f"layers {format_ranges(ils)} are {found} by their tensors but {meta} by the metadata "
            f"(leading_dense_block_count={md.leading_dense_block_count}, "
            f"interleave step={md.interleave_moe_layer_step or md.moe_every_n_layers}, "
            f"nextn_predict_layers={md.nextn_predict_layers}); the tensors win"
        )
    return out


def format_ranges(values: Iterable[int], sep: str = "-") -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (with sep='..': '0..2, 5, 7..8', the plan's form)."""
    vs = sorted(set(values))
    if not vs:
        return "none"
    parts: list[str] = []
    start = prev = vs[0]
    for v in vs[1:]:
        if v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}{sep}{prev}")
        start = prev = v
    parts.append(str(start) if start == prev else f"{start}{sep}{prev}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# From GGUF files

_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _int_meta(header: GGUFHeader, key: str) -> int | None:
    v = header.get(key)
    if v is None or isinstance(v, SkippedArray):
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    return None


def _int_array(header: GGUFHeader, arch: str, key: str, v: list[Any], block_count: int) -> tuple[int, ...]:
    """An array value of `{arch}.KEY`, read as the loaders read it (moeconf.model.homes
    array_reading, from the pinned sources): a per-layer key (get_key_or_arr) holds one integer or
    bool per layer, exactly `block_count` of them; an array key (get_arr) integers or bools of any
    length (a bool reads as 0/1). Anything else the engines refuse to load, and so does this."""
    reading = array_reading(key)
    where = f"{arch}.{key}"
    if reading is None:
        raise GGUFError(f"{where} is an array, but the engines read it as a single number (they refuse the "
                        "file: \"wrong type\")", path=header.path)
    odd = next((x for x in v if not isinstance(x, int)), None)
    if odd is not None:
        raise GGUFError(f"{where} is an array holding {type(odd).__name__} values ({odd!r:.40}); the engines "
                        "read it as integers or bools (one per block)", path=header.path)
    if reading == "per_layer" and len(v) != block_count:
        raise GGUFError(f"{where} has {len(v)} entries but {arch}.block_count is {block_count}: the engines "
                        "refuse the file (\"wrong array length\")", path=header.path)
    if len(v) > MAX_HPARAM_ARRAY:
        raise GGUFError(f"{where} has {len(v)} entries (at most {MAX_HPARAM_ARRAY} are read)", path=header.path)
    return tuple(int(x) for x in v)


def metadata_from_header(header: GGUFHeader) -> ModelMetadata:
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError("no general.architecture string in the metadata", path=header.path)
    block_count = _int_meta(header, f"{arch}.block_count")
    if block_count is None:
        raise GGUFError(f"no {arch}.block_count in the metadata", path=header.path)
    values: dict[str, Any] = {}
    per_layer: dict[str, tuple[int, ...]] = {}
    for attr, key in ModelMetadata.ARCH_KEYS.items():
        if attr == "block_count":
            continue
        v = header.get(f"{arch}.{key}")
        if isinstance(v, list):
            arr = _int_array(header, arch, key, v, block_count)
            if attr in ModelMetadata.ARRAY_KEYS:
                values[attr] = arr
            else:
                # the loader's scalar view of a per-layer key is its first layer's entry
                # (llama_hparams::n_head(), n_ff_exp(), n_expert_used(): il = 0); the whole
                # array is kept with the other integer keys
                values[attr] = arr[0] if arr else None
                per_layer[key] = arr
            continue
        if attr in ModelMetadata.ARRAY_KEYS:
            if isinstance(v, int):
                values[attr] = int(v)
            continue
        values[attr] = _int_meta(header, f"{arch}.{key}")
    if values.get("vocab_size") is None:
        tokens = header.get("tokenizer.ggml.tokens")
        if isinstance(tokens, SkippedArray):
            values["vocab_size"] = tokens.count
        elif isinstance(tokens, list):
            values["vocab_size"] = len(tokens)
    name = header.get("general.name")
    prefix = f"{arch}."
    read = set(ModelMetadata.ARCH_KEYS.values())
    arch_keys: list[str] = []
    hparams: list[tuple[str, int | tuple[int, ...]]] = []
    unit_floats: list[str] = []
    float_values: list[tuple[str, float | tuple[float, ...]]] = []
    zero_floats: list[str] = []
    for key, entry in header.metadata.items():
        if not key.startswith(prefix):
            continue
        suffix = key[len(prefix):]
        arch_keys.append(suffix)
        if suffix in per_layer:
            hparams.append((suffix, per_layer[suffix]))
            continue
        if suffix in read:
            continue
        v = entry.value
        if isinstance(v, float) and v in (0.0, 1.0):
            unit_floats.append(suffix)
            if v == 0.0:
                zero_floats.append(suffix)
        if isinstance(v, float):
            float_values.append((suffix, v))
        elif isinstance(v, list) and 0 < len(v) <= MAX_HPARAM_ARRAY and all(isinstance(x, float) for x in v):
            float_values.append((suffix, tuple(v)))
        if isinstance(v, bool | int):
            hparams.append((suffix, int(v)))
        elif (isinstance(v, list) and len(v) <= MAX_HPARAM_ARRAY
              and all(isinstance(x, bool | int) for x in v)):
            hparams.append((suffix, tuple(int(x) for x in v)))
    return ModelMetadata(
        arch=arch, block_count=block_count,
        name=name if isinstance(name, str) else None,
        file_type=_int_meta(header, "general.file_type"),
        hparams=tuple(sorted(hparams)), arch_keys=tuple(sorted(arch_keys)), unit_floats=tuple(sorted(unit_floats)),
        float_values=tuple(sorted(float_values)),
        zero_floats=tuple(sorted(zero_floats)),
        **values,
    )


def shard_paths(path: str) -> tuple[str, list[str]]:
    """For `X-0000k-of-0000n.gguf`, (first shard, all shard paths); else (path, [path])."""
    folder, base = os.path.split(path)
    m = _SPLIT_RE.match(base)
    if not m:
        return path, [path]
    count = int(m.group("count"))
    prefix = m.group("prefix")
    paths = [os.path.join(folder, f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    return paths[0], paths


def first_shard(path: str) -> str:
    """The path the engines must be given for a split model: `X-00002-of-00003.gguf` ->
    `X-00001-of-00003.gguf` (llama.cpp refuses "model must be loaded with the first split");
    any other path unchanged. Works on the name alone (for paths as a server sees them)."""
    return shard_paths(path)[0]


def read_gguf_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read a GGUF (any shard of a split model: every shard's tensor table is read)."""
    spath = os.fspath(path)
    first, expected_paths = shard_paths(spath)
    if first != spath and not os.path.exists(first):
        raise GGUFError(
            "this is a later shard of a split model, and its first shard is missing",
            path=first, hint=f"the metadata lives in shard 1; expected {first}",
        )
    head = read_header(first)
    count = _int_meta(head, "split.count")
    headers = [head]
    if count is not None and count > 1:
        if len(expected_paths) == 1:
            # A split model whose first shard was renamed: shard names cannot be derived.
            raise GGUFError(
                f"split.count is {count}, but the file name is not NAME-00001-of-{count:05d}.gguf, "
                "so the other shards cannot be found", path=first,
            )
        if len(expected_paths) == count:
            for i, p in enumerate(expected_paths[1:], start=1):
                if not os.path.lexists(p):  # a link is read (and refused) by read_header
                    raise GGUFError(f"shard {i + 1} of {count} is missing", path=p)
                headers.append(read_header(p))
    return inventory_from_headers(headers, spath, n_named=len(expected_paths))


def inventory_from_headers(headers: list[GGUFHeader], source: str, n_named: int) -> Inventory:
    """The inventory of a model from its shards' headers, in order (shard 1 first), checked
    against each other: split.no and split.count of each, split.tensors.count, no tensor twice.
    `n_named`: how many shards the file names say there are (1 for a name without -0000k-of-0000n)."""
    head = headers[0]
    first = head.path
    count = _int_meta(head, "split.count")
    if count is None or count <= 1:
        if n_named > 1:
            raise GGUFError(
                f"the file name says {n_named} shards but the metadata has no split.count > 1",
                path=first,
            )
        headers = [head]
    else:
        no = _int_meta(head, "split.no")
        if no not in (0, None):
            raise GGUFError(f"expected shard 1 (split.no 0), found split.no {no}", path=first)
        if n_named != count:
            raise GGUFError(
                f"split.count is {count} but the file name says {n_named} shards", path=first
            )
        for i, h in enumerate(headers[1:], start=1):
            sno = _int_meta(h, "split.no")
            scount = _int_meta(h, "split.count")
            if sno != i or scount != count:
                raise GGUFError(
                    f"shard mismatch: expected split.no {i} of split.count {count}, found "
                    f"split.no {sno} of split.count {scount}", path=h.path,
                )
        if len(headers) != count:
            raise GGUFError(f"{len(headers)} of the {count} shards were read", path=first)
        total = _int_meta(head, "split.tensors.count")
        found = sum(len(h.tensors) for h in headers)
        if total is not None and total != found:
            raise GGUFError(
                f"split.tensors.count is {total} but the {count} shards hold {found} tensors",
                path=first,
            )
    metadata = metadata_from_header(head)
    raw: list[RawTensor] = []
    seen: dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            if t.name in seen:
                raise GGUFError(f"tensor {t.name!r} appears in two shards (also in {seen[t.name]})", path=h.path)
            seen[t.name] = h.path
            raw.append(RawTensor(t.name, t.type_name, t.shape, t.nbytes))
    return build_inventory(metadata, raw, source=source, shards=tuple(h.path for h in headers), error=GGUFError)

