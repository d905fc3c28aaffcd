"""Remote models: resolve a MODEL string to files (the Hub listing, the local HF cache, a URL),
read their headers with range requests (every shard at once), keep each as a manifest.

huggingface_hub is imported here, inside the functions that ask the Hub, never at start-up.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import moeconf.hub.names as names
import moeconf.hub.store as store
from moeconf.hub.fetch import STATS, HubError, read_remote_header
from moeconf.hub.hfcache import CachedRepo, cached_repo
from moeconf.hub.ref import RemoteRef
from moeconf.model.gguf_header import GGUFHeader, read_header
from moeconf.model.inventory import Inventory, inventory_from_headers
from moeconf.model.manifest import dumps_manifest, loads_manifest_json, parse_manifest
from moeconf.units import MIB

MAX_PARALLEL = 16


def endpoint() -> str:
    """`common_get_model_endpoint` (MODEL_ENDPOINT, else HF_ENDPOINT, else the Hub), without the
    trailing '/'."""
    ep = os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    return ep.rstrip("/")


def offline() -> bool:
    """huggingface_hub's HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE), llama.cpp's LLAMA_ARG_OFFLINE, or
    MOECONF_OFFLINE: no network; only the caches are read."""
    from moeconf.engines.options import env_var

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MOECONF_OFFLINE", env_var("--offline")):
        if os.environ.get(var, "").strip().lower() in ("1", "on", "yes", "true", "enabled"):
            return True
    return False


def token() -> str | None:
    """HF_TOKEN, else the token `hf auth login` saved (huggingface_hub.get_token)."""
    tok = os.environ.get("HF_TOKEN")
    if tok:
        return tok
    from huggingface_hub import get_token

    return get_token()


def _auth_headers() -> dict[str, str]:
    tok = token()
    return {"Authorization": f"Bearer {tok}"} if tok else {}


@dataclass(frozen=True)
class Listing:
    repo: str
    revision: str
    commit: str
    files: tuple[str, ...]  # paths in listing order (sorted, as the Hub lists them)
    sizes: dict[str, int | None]
    source: str  # "hub", "moeconf cache" or "HF cache"


def list_repo(repo: str, revision: str = "main", *, force_offline: bool = False) -> Listing:
    """The repo's files at `revision` (the Hub through huggingface_hub; moeconf's listing cache
    within its TTL; offline: that cache, else the local HF cache)."""
    ep = endpoint()
    if not names.is_valid_repo_id(repo):
        raise HubError(f"{repo!r} is not a Hugging Face repo id (OWNER/NAME of letters, digits, '_', '.', '-')")
    off = force_offline or offline()
    cached = store.get_listing(ep, repo, revision, any_age=off)
    if cached is not None:
        return _listing_from(cached, "moeconf cache")
    if off:
        local = cached_repo(repo) if revision == "main" else None
        if local is not None:
            return Listing(repo, revision, local.commit, local.files, {}, "HF cache")
        raise HubError(f"offline, and {repo} is in neither moeconf's cache nor the Hugging Face cache "
                       f"({_hf_cache_dir()})", hint="run once online, or unset HF_HUB_OFFLINE / LLAMA_ARG_OFFLINE")
    info = _model_info(ep, repo, revision)
    files = sorted(((s.rfilename, s.size) for s in info.siblings or ()), key=lambda x: x[0])
    commit = str(info.sha or revision)
    store.put_listing(ep, repo, revision, commit, files, getattr(info, "gated", None))
    return Listing(repo, revision, commit, tuple(p for p, _ in files), dict(files), "hub")


def _hf_cache_dir() -> str:
    from moeconf.hub.hfcache import cache_directory

    return cache_directory() or "no cache directory"


def _listing_from(d: dict[str, Any], source: str) -> Listing:
    files = [(str(p), s if isinstance(s, int) else None) for p, s in d.get("files", [])]
    return Listing(str(d["repo"]), str(d["revision"]), str(d["commit"]), tuple(p for p, _ in files),
                   dict(files), source)


def _model_info(ep: str, repo: str, revision: str) -> Any:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=ep, token=token() or False)
    try:
        return api.model_info(repo, revision=revision, files_metadata=True, timeout=_timeout())
    except GatedRepoError:
        raise HubError(f"{repo} is a gated repo: accept its terms at {ep}/{repo}, then set HF_TOKEN or run "
                       "`hf auth login`") from None
    except RevisionNotFoundError:
        raise HubError(f"{repo} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise HubError(f"no repo {repo} on {ep} (or it is private: set HF_TOKEN or run `hf auth login`)") from None
    except OfflineModeIsEnabled:
        raise HubError("huggingface_hub is in offline mode (HF_HUB_OFFLINE)") from None
    except HfHubHTTPError as e:
        code = e.response.status_code if e.response is not None else "?"
        raise HubError(f"the Hub answered HTTP {code} listing {repo}") from None
    except Exception as e:  # the HTTP client's own errors (connection refused, timeouts, bad JSON)
        kind = "timed out" if "timeout" in type(e).__name__.lower() else f"failed ({type(e).__name__}: {e})"
        raise HubError(f"listing {repo} on {ep} {kind}", hint="offline? cached models are read with "
                       "HF_HUB_OFFLINE=1") from None


def _timeout() -> float:
    from moeconf.hub.fetch import timeout_s

    return timeout_s()


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    """The files of one model: shard paths in the repo, shard 1 first."""

    ref: RemoteRef
    files: tuple[str, ...]
    commit: str
    listing: Listing | None
    local: CachedRepo | None  # the files are in the local HF cache


def resolve(ref: RemoteRef, listing: Listing | None = None, *, force_offline: bool = False) -> Resolved:
    """Which files `ref` names, as llama.cpp's `-hf`/`--hf-file` picks them."""
    assert ref.repo is not None
    lst = listing or list_repo(ref.repo, ref.revision, force_offline=force_offline)
    if "preset.ini" in lst.files and ref.file is None:
        raise HubError(f"{ref.repo} has a preset.ini: llama.cpp -hf then loads the preset, which moeconf does not "
                       "model", hint=f"name the model file: hf://{ref.repo}/PATH.gguf")
    if ref.file is not None:
        if ref.file not in lst.files:
            raise HubError(f"{ref.repo} has no file {ref.file!r}", hint=_available(lst))
        primary = names.expected_shards(ref.file)[0]  # any shard names the model; shard 1 holds its metadata
        if primary not in lst.files:
            raise HubError(f"{ref.repo}: {ref.file} is a later shard, and shard 1 ({primary}) is not in the listing")
    else:
        found = names.find_best_model(lst.files, ref.tag or "")
        if found is None:
            if ref.tag:
                tags = [q.tag for q in names.quants(lst.files)]
                raise HubError(f"{ref.repo} has no model file for tag {ref.tag!r} (llama.cpp matches "
                               f"'{ref.tag}[.-]' case-insensitively)",
                               hint=f"its tags: {', '.join(tags)}" if tags else _available(lst))
            raise HubError(f"{ref.repo} has no GGUF model file", hint=_available(lst))
        primary = found
    want = names.expected_shards(primary)
    files = names.split_files(lst.files, primary)
    missing = [f for f in want if f not in lst.files]
    if missing:
        raise HubError(f"{ref.repo}: shard {want.index(missing[0]) + 1} of {len(want)} ({missing[0]}) is not in the "
                       f"repo listing (commit {lst.commit[:12]})")
    local = cached_repo(ref.repo)
    if local is None or local.commit != lst.commit or not all(os.path.isfile(local.local(f)) for f in files):
        local = None
    return Resolved(ref, tuple(files), lst.commit, lst, local)


def _available(lst: Listing) -> str:
    models = [f for f in lst.files if f.endswith(".gguf")]
    shown = ", ".join(models[:12]) + (f" and {len(models) - 12} more" if len(models) > 12 else "")
    return f"its GGUF files: {shown}" if models else "it has no .gguf file"


Progress = Callable[[str], None]


def load(ref: RemoteRef, *, progress: Progress | None = None, offline: bool = False) -> Inventory:
    """The inventory of a remote model: moeconf's header cache, the local HF cache (read from
    disk), else the headers over HTTP. `offline`: the caches only (as the engine's --offline)."""
    if ref.url is not None:
        return _load_url(ref, progress, offline)
    res = resolve(ref, force_offline=offline)
    return load_resolved(res, progress=progress, force_offline=offline)


def load_resolved(res: Resolved, *, progress: Progress | None = None, force_offline: bool = False) -> Inventory:
    ref = res.ref
    assert ref.repo is not None
    ep = endpoint()
    key = (ep, ref.repo, res.commit, res.files[0])
    hit = store.get_manifest(*key)
    if hit is not None:
        try:
            return _as_remote(parse_manifest(hit, store.header_path(*key)), ref, res.files, res.listing)
        except Exception:
            pass
    if res.local is not None:
        local = res.local
        headers = [read_header(local.local(f)) for f in res.files]
    else:
        if force_offline or offline():
            raise HubError(f"offline, and the header of {ref.display} is not cached", hint="run once online")
        base = f"{ep}/{ref.repo}/resolve/{res.commit}/"
        headers = _fetch_all([(base + _quote(f), f"{ref.repo}/{f}") for f in res.files], progress)
    inv = inventory_from_headers(headers, f"hf://{ref.repo}/{res.files[0]}",
                                 n_named=len(names.expected_shards(res.files[0])))
    text = dumps_manifest(inv)
    store.put_manifest(text, *key)
    return _as_remote(parse_manifest(loads_manifest_json(text, ref.display), ref.display), ref, res.files,
                      res.listing)


def _quote(path: str) -> str:
    import urllib.parse

    return urllib.parse.quote(path, safe="/")


def _as_remote(inv: Inventory, ref: RemoteRef, files: Sequence[str], listing: Listing | None = None) -> Inventory:
    warnings = inv.warnings
    mmproj = names.find_mmproj(listing.files, files[0]) if listing is not None and ref.url is None else None
    if mmproj:
        warnings = (*warnings, f"llama.cpp -hf also downloads and loads {mmproj} (a vision projector) unless "
                    "--no-mmproj is given: its memory is not modelled")
    return replace(inv, source=ref.display, shards=tuple(files), warnings=warnings)


def _token_for(url: str) -> dict[str, str]:
    """The Hub token, for the Hub's own host only (never for another server's URL)."""
    import urllib.parse

    same = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(endpoint()).netloc
    return _auth_headers() if same else {}


def _fetch_all(jobs: list[tuple[str, str]], progress: Progress | None) -> list[GGUFHeader]:
    """Every shard's header at once (threads: the reads wait on the network)."""
    headers = _token_for(jobs[0][0])
    done = [0]
    lock = threading.Lock()

    def one(job: tuple[str, str]) -> GGUFHeader:
        h, _ = read_remote_header(job[0], headers, job[1])
        with lock:
            done[0] += 1
            if progress:
                progress(f"{done[0]}/{len(jobs)} headers, {STATS.bytes / MIB:.1f} MiB")
        return h

    if len(jobs) == 1:
        return [one(jobs[0])]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(jobs))) as pool:
        return list(pool.map(one, jobs))


def _load_url(ref: RemoteRef, progress: Progress | None, force_offline: bool = False) -> Inventory:
    """A plain https:// (or http://) GGUF: keyed by URL and ETag. A split model's shards are the
    URLs with -0000k-of-0000n as llama.cpp's `common_download_get_all_parts` builds them."""
    from moeconf.hub.fetch import head

    url = ref.url
    assert url is not None
    off = force_offline or offline()
    etag = store.get_url_etag(url, any_age=off)
    if etag is None:
        if off:
            raise HubError("offline, and this URL's header is not cached", path=url)
        etag = head(url, _token_for(url)).get("etag", "")
        if etag:
            store.put_url_etag(url, etag)
    key = (url, etag)
    hit = store.get_manifest(*key) if etag else None
    if hit is not None:
        try:
            inv = parse_manifest(hit, store.header_path(*key))
            return replace(inv, source=url, shards=_url_shards(url, len(inv.shards) or 1))
        except Exception:
            pass
    folder, name = url.rsplit("/", 1)
    shards = names.expected_shards(name)
    headers = _fetch_all([(f"{folder}/{s}", f"{folder}/{s}") for s in shards], progress)
    inv = inventory_from_headers(headers, url, n_named=len(shards))
    text = dumps_manifest(inv)
    if etag:
        store.put_manifest(text, *key)
    inv = parse_manifest(loads_manifest_json(text, url), url)
    return replace(inv, source=url, shards=_url_shards(url, len(shards)))


def _url_shards(url: str, n: int) -> tuple[str, ...]:
    folder, name = url.rsplit("/", 1)
    shards = names.expected_shards(name)
    return tuple(f"{folder}/{s}" for s in shards) if len(shards) == n else (url,)


def stderr_progress(prefix: str) -> Progress:
    """A progress line on standard error, rewritten in place on a terminal."""
    tty = sys.stderr.isatty()
    last = [0.0]
    lock = threading.Lock()

    def show(msg: str) -> None:
        with lock:
            _show(msg)

    def _show(msg: str) -> None:
        now = time.monotonic()
        if tty:
            sys.stderr.write(f"\r\x1b[K{prefix}: {msg}")
            sys.stderr.flush()
        elif now - last[0] > 1.0:
            sys.stderr.write(f"{prefix}: {msg}\n")
            last[0] = now

    return show
