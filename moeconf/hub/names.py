"""Model strings and the pinned llama.cpp's `-hf` resolution, as facts from its source.

Every rule here is read from llama.cpp 0.3.36 (llama-cpp-python's vendor tree):

- `common/download.cpp` `common_download_split_repo_tag`: the `-hf` value is split on ':'; the
  repo is the first part, the tag the LAST part (empty without ':'); the repo must have exactly
  one '/'.
- `common/hf-cache.cpp` `is_valid_repo_id`: [A-Za-z0-9_] plus '/', '.', '-' each between base
  characters, exactly one '/', at most 256 characters.
- `download.cpp` `get_gguf_split_info`: a name ending in `.gguf`; `-NNNNN-of-NNNNN` before it
  (case-insensitive) gives index and count; the tag is the last `[-.]([A-Z0-9_]+)` of the rest,
  upper-cased.
- `download.cpp` `gguf_filename_is_model`: `.gguf`, and the file name (after the last '/') holds
  none of `mmproj`, `imatrix`, `mtp-`, `eagle3-`, `dflash-`, `dspark-` (case-sensitive).
- `download.cpp` `find_best_model`: tags = [TAG] or, with no tag, [Q4_K_M, Q8_0]; for each tag in
  turn the first model file (in listing order) whose whole path matches the regex `TAG[.-]`
  case-insensitively (the tag is used as a regex, unescaped), skipping shards other than 1; with
  no tag and no match, the first model file (shard 1). Nothing otherwise.
- `download.cpp` `get_split_files`: the shards of the chosen file are every listed file with the
  same split prefix (the path before `-NNNNN-of-NNNNN`) and the same count.
- `download.cpp` `common_download_get_hf_plan`: a `preset.ini` at the repo root wins over any model
  (the engine then reads a preset, which moeconf does not model); `--hf-file` must equal a listed
  path exactly.
- `common/common.cpp` `common_get_model_endpoint`: `MODEL_ENDPOINT`, else `HF_ENDPOINT`, else
  https://huggingface.co/.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
SIDECAR_WORDS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)


@dataclass(frozen=True)
class SplitInfo:
    prefix: str  # the path without `.gguf` and without `-NNNNN-of-NNNNN`
    tag: str  # upper-cased, '' when none
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """`get_gguf_split_info`; None for a name not ending in `.gguf`."""
    if not path.endswith(".gguf"):
        return None
    prefix = path[: -len(".gguf")]
    index = count = 1
    m = _SPLIT.match(prefix)
    if m:
        index, count, prefix = int(m.group(2)), int(m.group(3)), m.group(1)
    t = _TAG.search(prefix)
    return SplitInfo(prefix, t.group(1).upper() if t else "", index, count)


def is_model_file(path: str) -> bool:
    """`gguf_filename_is_model`."""
    if not path.endswith(".gguf"):
        return False
    name = path.rsplit("/", 1)[-1]
    return not any(w in name for w in SIDECAR_WORDS)


def is_valid_repo_id(repo: str) -> bool:
    """`hf_cache::is_valid_repo_id`."""
    if not repo or len(repo) > 256:
        return False
    slash, special = 0, True
    for c in repo:
        if c.isascii() and (c.isalnum() or c == "_"):
            special = False
        elif c in "/.-":
            if special:
                return False
            slash += c == "/"
            special = True
        else:
            return False
    return not special and slash == 1


def split_repo_tag(value: str) -> tuple[str, str]:
    """`common_download_split_repo_tag`: (repo, tag); ValueError for a repo without one '/'."""
    parts = value.split(":")
    tag = parts[-1] if len(parts) > 1 else ""
    repo = parts[0]
    if len(repo.split("/")) != 2:
        raise ValueError(f"invalid HF repo {value!r}: expected <user>/<model>[:quant]")
    return repo, tag


def _first_shard_ok(path: str) -> bool:
    info = split_info(path)
    return info is None or info.count <= 1 or info.index == 1


def find_best_model(files: Sequence[str], tag: str) -> str | None:
    """`find_best_model` over the listing's paths, in listing order."""
    tags = [tag] if tag else list(DEFAULT_TAGS)
    for t in tags:
        try:
            pattern = re.compile(t + "[.-]", re.I)
        except re.error:
            return None  # llama.cpp's std::regex throws on it: no file is chosen
        for f in files:
            if is_model_file(f) and pattern.search(f) and _first_shard_ok(f):
                return f
    if not tag:
        for f in files:
            if is_model_file(f) and _first_shard_ok(f):
                return f
    return None


def split_files(files: Sequence[str], chosen: str) -> list[str]:
    """`get_split_files`: the chosen file's shards in listing order (sorted by index here, which
    is the order they are read in)."""
    info = split_info(chosen)
    if info is None or info.count <= 1:
        return [chosen]
    out = []
    for f in files:
        fi = split_info(f)
        if fi is not None and fi.count == info.count and fi.prefix == info.prefix:
            out.append(f)
    return sorted(out, key=lambda f: split_info(f).index)  # type: ignore[union-attr]


def expected_shards(chosen: str) -> list[str]:
    """The names every shard of `chosen` must have (NAME-0000k-of-0000n.gguf, k = 1..n)."""
    info = split_info(chosen)
    if info is None or info.count <= 1:
        return [chosen]
    m = _SPLIT.match(chosen[: -len(".gguf")])
    assert m is not None
    return [f"{m.group(1)}-{k:05d}-of-{m.group(3)}.gguf" for k in range(1, info.count + 1)]


def repo_tags(files: Sequence[str]) -> list[str]:
    """The tags a repo offers (each model's `get_gguf_split_info` tag, in listing order, once),
    for "no such tag" messages and the quant table."""
    out: list[str] = []
    for f in files:
        if is_model_file(f) and _first_shard_ok(f):
            info = split_info(f)
            if info and info.tag and info.tag not in out:
                out.append(info.tag)
    return out


@dataclass(frozen=True)
class Quant:
    """One model of a repo as llama.cpp groups files: a first shard and its shards."""

    tag: str  # the file's tag (upper-case), or the file name when it has none
    primary: str  # the path `-hf` resolution yields (shard 1)
    files: tuple[str, ...]  # every shard, shard 1 first


def quants(files: Sequence[str]) -> list[Quant]:
    """Every model in a listing: one per first shard (`find_best_model` never picks another
    shard), its shards grouped by `get_split_files`."""
    firsts = [f for f in files if is_model_file(f) and _first_shard_ok(f)]
    bases = [split_info(f).prefix.rsplit("/", 1)[-1] for f in firsts]  # type: ignore[union-attr]
    common = _common_words(bases) if len(bases) > 1 else ""
    out = []
    for f, base in zip(firsts, bases, strict=True):
        info = split_info(f)
        label = base[len(common):] if common and len(base) > len(common) else (info.tag if info and info.tag else base)
        out.append(Quant(label, f, tuple(split_files(files, f))))
    return out


def _common_words(names: Sequence[str]) -> str:
    """The longest common prefix of `names` that ends at a '-' or '.' (the model's name)."""
    first = min(names)
    last = max(names)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    cut = max(first.rfind("-", 0, n), first.rfind(".", 0, n))
    return first[: cut + 1] if cut >= 0 else ""


def selector_tag(files: Sequence[str], primary: str) -> str | None:
    """The shortest `:TAG` under which `find_best_model` picks `primary` (the file's own tag,
    else the tag with the words before it: `UD-Q4_K_XL`), or None when no tag does (then the
    command needs `--hf-file`)."""
    info = split_info(primary)
    if info is None:
        return None
    words = re.split(r"(?=[-.])", info.prefix.rsplit("/", 1)[-1])
    for n in range(1, len(words) + 1):
        tag = "".join(words[-n:]).lstrip("-.")
        if not tag or not re.fullmatch(r"[A-Za-z0-9_.-]+", tag):
            continue
        if find_best_model(files, tag) == primary:
            return tag
    return None


def find_mmproj(files: Sequence[str], model: str) -> str | None:
    """`find_best_sibling(files, model, "mmproj")` (what `-hf` downloads and loads beside the model
    unless --no-mmproj): a .gguf whose path holds `mmproj`, in the model's folder or one above it;
    the deepest folder wins, then the quant bits closest to the model's."""

    def bits(path: str) -> int:
        info = split_info(path)
        m = re.search(r"[0-9]+", info.tag) if info else None
        return int(m.group(0)) if m else 0

    model_dir = model.split("/")[:-1]
    model_bits = bits(model)
    best: tuple[int, int] | None = None
    chosen = None
    for f in files:
        if not f.endswith(".gguf") or "mmproj" not in f:
            continue
        sib_dir = f.split("/")[:-1]
        if sib_dir != model_dir[: len(sib_dir)]:
            continue
        key = (len(sib_dir), -abs(bits(f) - model_bits))
        if best is None or key[0] > best[0] or (key[0] == best[0] and key[1] > best[1]):
            best, chosen = key, f
    return chosen
