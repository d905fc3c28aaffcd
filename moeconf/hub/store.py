"""moeconf's own cache of remote headers and repo listings, under the user cache dir.

    $MOECONF_CACHE_DIR, else $XDG_CACHE_HOME/moeconf, else ~/.cache/moeconf
      hub/listings/<sha256(endpoint, repo, revision)>.json   the repo's files and commit
      hub/headers/<sha256(endpoint, repo, commit, path)>.json a manifest of the model
      hub/headers/<sha256(url, etag)>.json                 a manifest of a plain URL's model
      hub/urls/<sha256(url)>.json                          the URL's last ETag
      hub/solved/<sha256(...)>.json                        a quant's row of `fit REPO` (moeconf.fitquants)

A header keyed by a commit (or an ETag) never changes, so it is kept for good. A listing says
which commit `main` is: it is used without asking the Hub again for MOECONF_HUB_TTL seconds
(default 3600), and whenever the Hub cannot be asked (offline mode).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from moeconf.atomic import write_text_atomic


def cache_root() -> str:
    base = os.environ.get("MOECONF_CACHE_DIR")
    if base:
        return os.path.join(base, "hub")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "moeconf", "hub")


def ttl_s() -> float:
    try:
        return float(os.environ.get("MOECONF_HUB_TTL", "3600"))
    except ValueError:
        return 3600.0


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:40]


def _path(kind: str, *parts: str) -> str:
    return os.path.join(cache_root(), kind, _key(*parts) + ".json")


def _read(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # absent or damaged: fetched again


def _write(path: str, data: Any) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_text_atomic(path, json.dumps(data, separators=(",", ":")) + "\n")
    except OSError:
        pass  # a cache that cannot be written is no error: the next run reads the Hub again


def listing_path(endpoint: str, repo: str, revision: str) -> str:
    return _path("listings", endpoint, repo, revision)


def get_listing(endpoint: str, repo: str, revision: str, *, any_age: bool) -> dict[str, Any] | None:
    data = _read(listing_path(endpoint, repo, revision))
    if not isinstance(data, dict):
        return None
    fresh = time.time() - float(data.get("fetched_at", 0)) < ttl_s()
    return data if any_age or fresh else None


def put_listing(endpoint: str, repo: str, revision: str, commit: str, files: list[tuple[str, int | None]],
                gated: object = None) -> None:
    _write(listing_path(endpoint, repo, revision), {
        "repo": repo, "revision": revision, "commit": commit, "fetched_at": time.time(),
        "files": [[p, s] for p, s in files], "gated": gated})


def header_path(*parts: str) -> str:
    return _path("headers", *parts)


def get_manifest(*parts: str) -> dict[str, Any] | None:
    data = _read(header_path(*parts))
    return data if isinstance(data, dict) else None


def put_manifest(text: str, *parts: str) -> None:
    path = header_path(*parts)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_text_atomic(path, text)
    except OSError:
        pass


def get_url_etag(url: str, *, any_age: bool) -> str | None:
    data = _read(_path("urls", url))
    if not isinstance(data, dict) or not isinstance(data.get("etag"), str):
        return None
    fresh = time.time() - float(data.get("fetched_at", 0)) < ttl_s()
    return str(data["etag"]) if any_age or fresh else None


def put_url_etag(url: str, etag: str) -> None:
    _write(_path("urls", url), {"url": url, "etag": etag, "fetched_at": time.time()})


def get_solved(key: str) -> dict[str, Any] | None:
    """A quant's solved row of `moeconf fit REPO` (moeconf.fitquants), keyed by everything it
    depends on (moeconf's own source included)."""
    data = _read(_path("solved", key))
    return data if isinstance(data, dict) else None


def put_solved(key: str, data: dict[str, Any]) -> None:
    _write(_path("solved", key), data)
