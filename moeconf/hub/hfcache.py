"""The local Hugging Face cache as the pinned llama.cpp finds it (`common/hf-cache.cpp`).

- `get_cache_directory`: the first set of LLAMA_CACHE, HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE (each
  the hub folder itself), HF_HOME (+ `hub`), XDG_CACHE_HOME (+ `huggingface/hub`), HOME
  (+ `.cache/huggingface/hub`).
- `repo_to_folder_name`: `models--` + the repo id with '/' replaced by `--`.
- `get_cached_ref`: `refs/main` when it holds a valid commit (40 hex digits), else the first
  valid one of the other refs (directory order; sorted by name here, for a stable answer).
- `get_cached_files`: every regular file or link under `snapshots/COMMIT/`, by its path relative
  to it ('/' separators). The engine walks the directory in the file system's order; moeconf
  sorts the paths (the listing order `find_best_model` sees; see docs/hub.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_COMMIT = re.compile(r"[0-9a-fA-F]{40}")


def cache_directory() -> str | None:
    for var, sub in (("LLAMA_CACHE", ()), ("HF_HUB_CACHE", ()), ("HUGGINGFACE_HUB_CACHE", ()),
                     ("HF_HOME", ("hub",)), ("XDG_CACHE_HOME", ("huggingface", "hub")),
                     ("HOME", (".cache", "huggingface", "hub"))):
        base = os.environ.get(var)
        if base:
            return os.path.join(base, *sub)
    return None


def repo_folder(repo: str) -> str | None:
    root = cache_directory()
    return None if root is None else os.path.join(root, "models--" + repo.replace("/", "--"))


def cached_ref(repo_path: str) -> str | None:
    refs = os.path.join(repo_path, "refs")
    if not os.path.isdir(refs):
        return None
    fallback = None
    for name in sorted(os.listdir(refs)):
        p = os.path.join(refs, name)
        if not os.path.isfile(p):
            continue
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                commit = f.readline().rstrip("\n")
        except OSError:
            continue
        if not _COMMIT.fullmatch(commit):
            continue
        if name == "main":
            return commit
        fallback = fallback or commit
    return fallback


@dataclass(frozen=True)
class CachedRepo:
    repo: str
    commit: str
    root: str  # snapshots/COMMIT
    files: tuple[str, ...]  # relative paths, sorted

    def local(self, path: str) -> str:
        return os.path.join(self.root, *path.split("/"))


def cached_repo(repo: str) -> CachedRepo | None:
    folder = repo_folder(repo)
    if folder is None or not os.path.isdir(os.path.join(folder, "snapshots")):
        return None
    commit = cached_ref(folder)
    if commit is None:
        return None
    root = os.path.join(folder, "snapshots", commit)
    if not os.path.isdir(root):
        return None
    files = []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.isfile(p) or os.path.islink(p):
                files.append(os.path.relpath(p, root).replace(os.sep, "/"))
    return CachedRepo(repo, commit, root, tuple(sorted(files)))
