"""A Hugging Face Hub on 127.0.0.1 for tests and benchmarks: the endpoints huggingface_hub and
llama.cpp's `-hf` resolution call, serving GGUFs written by moeconf.fixtures (sparse: the data
region is a hole, so a 100 GB model costs its header on disk).

    GET  /api/models/OWNER/NAME[/revision/REV][?blobs=true]  model info: sha, siblings (sizes)
    GET  /api/models/OWNER/NAME/refs                          branches (llama.cpp get_repo_commit)
    GET  /api/models/OWNER/NAME/tree/REV?recursive=true       files (llama.cpp get_repo_files)
    HEAD|GET /OWNER/NAME/resolve/REV/PATH                     302 to /cdn/... with ETag, X-Repo-Commit
    HEAD|GET /cdn/SHA/PATH                                    the bytes, Range honoured (206)
    HEAD|GET /files/PATH                                      a plain URL (no Hub): ETag, Range

Errors as the Hub gives them: 404 with X-Error-Code RepoNotFound / EntryNotFound /
RevisionNotFound; a gated repo's files answer 403 with X-Error-Code GatedRepo without the token.
Faults (attributes, changed by tests): `latency` seconds per request, `delay` seconds before an
answer, `ignore_range` (200 with the whole file), `truncate` (a body cut after N bytes but
announcing its full length), `hidden` (paths served but missing from the listing).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GOOD_TOKEN = "hf_" + "a" * 37


@dataclass
class Repo:
    files: dict[str, Path | bytes]  # path in the repo -> a file on disk or its bytes
    gated: bool = False
    commit: str = ""

    def __post_init__(self) -> None:
        if not self.commit:
            h = hashlib.sha1("\0".join(sorted(self.files)).encode())
            self.commit = h.hexdigest()


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    plain: dict[str, Path | bytes] = field(default_factory=dict)  # /files/PATH
    latency: float = 0.0
    delay: float = 0.0
    ignore_range: bool = False
    truncate: int | None = None
    hidden: set[str] = field(default_factory=set)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Range)
    auth_seen: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    sent: int = 0  # body bytes of files written to clients
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Hub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def requests_to(self, prefix: str) -> int:
        return sum(1 for _, p, _ in self.log if p.startswith(prefix))


def _size(src: Path | bytes) -> int:
    return len(src) if isinstance(src, bytes) else os.path.getsize(src)


def _read(src: Path | bytes, start: int, length: int) -> bytes:
    if isinstance(src, bytes):
        return src[start:start + length]
    with open(src, "rb") as f:
        f.seek(start)
        return f.read(length)


def _etag(src: Path | bytes, path: str) -> str:
    return '"' + hashlib.sha256(f"{path}:{_size(src)}".encode()).hexdigest() + '"'


class _Handler(BaseHTTPRequestHandler):
    hub: Hub

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _json(self, code: int, data: Any, error_code: str | None = None) -> None:
        body = json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if error_code:
            self.send_header("X-Error-Code", error_code)
            self.send_header("X-Error-Message", str(data.get("error", "")) if isinstance(data, dict) else "")
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, head: bool) -> None:
        hub = self.hub
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        hub.log.append((self.command, path, self.headers.get("Range", "")))
        hub.auth_seen.append((path, self.headers.get("Authorization")))
        if hub.latency:
            time.sleep(hub.latency)
        if hub.delay:
            time.sleep(hub.delay)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._route(path, urllib.parse.parse_qs(url.query), head)

    def _route(self, path: str, query: dict[str, list[str]], head: bool) -> None:
        hub = self.hub
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(refs|revision/[^/]+|tree/[^/]+))?/?", path)
        if m:
            repo = hub.repos.get(m.group(1))
            if repo is None:
                return self._json(404 if self.headers.get("Authorization") else 401,
                                  {"error": "Repository not found"}, "RepoNotFound")
            what = m.group(2) or ""
            if what.startswith("revision/") and what.split("/", 1)[1] not in ("main", repo.commit):
                return self._json(404, {"error": "Invalid rev id"}, "RevisionNotFound")
            listed = sorted(p for p in repo.files if p not in hub.hidden)
            if what == "refs":
                return self._json(200, {"branches": [{"name": "main", "ref": "refs/heads/main",
                                                      "targetCommit": repo.commit}], "tags": [], "converts": []})
            if what.startswith("tree/"):
                return self._json(200, [{"type": "file", "path": p, "size": _size(repo.files[p]),
                                         "oid": hashlib.sha1(p.encode()).hexdigest(),
                                         "lfs": {"oid": hashlib.sha256(p.encode()).hexdigest(),
                                                 "size": _size(repo.files[p]), "pointerSize": 135}}
                                        for p in listed])
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for p in listed:
                s: dict[str, Any] = {"rfilename": p}
                if blobs:
                    s["size"] = _size(repo.files[p])
                    s["blobId"] = hashlib.sha1(p.encode()).hexdigest()
                    s["lfs"] = {"sha256": hashlib.sha256(p.encode()).hexdigest(), "size": s["size"],
                                "pointerSize": 135}
                siblings.append(s)
            return self._json(200, {"_id": "x", "id": m.group(1), "modelId": m.group(1), "sha": repo.commit,
                                    "private": False, "gated": "manual" if repo.gated else False,
                                    "disabled": False, "downloads": 0, "likes": 0, "tags": ["gguf"],
                                    "siblings": siblings})
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            repo = hub.repos.get(m.group(1))
            if repo is None:
                return self._json(404, {"error": "Repository not found"}, "RepoNotFound")
            if m.group(2) not in ("main", repo.commit):
                return self._json(404, {"error": "Invalid rev id"}, "RevisionNotFound")
            if repo.gated and self.headers.get("Authorization") != f"Bearer {GOOD_TOKEN}":
                return self._json(403, {"error": "Access to model is restricted"}, "GatedRepo")
            src = repo.files.get(m.group(3))
            if src is None:
                return self._json(404, {"error": "Entry not found"}, "EntryNotFound")
            self.send_response(302)
            # the CDN is "another host": localhost, not 127.0.0.1 (Authorization must not follow)
            port = self.server.server_address[1]
            self.send_header("Location", f"http://localhost:{port}/cdn/{repo.commit}/{m.group(1)}/"
                             + urllib.parse.quote(m.group(3)))
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", _etag(src, m.group(3)))
            self.send_header("X-Linked-Size", str(_size(src)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        m = re.fullmatch(r"/cdn/([0-9a-f]+)/([^/]+/[^/]+)/(.+)", path)
        if m and m.group(2) in hub.repos:
            src = hub.repos[m.group(2)].files.get(m.group(3))
            if src is not None:
                return self._bytes(src, m.group(3), head, hub.repos[m.group(2)].commit)
        m = re.fullmatch(r"/files/(.+)", path)
        if m and m.group(1) in hub.plain:
            return self._bytes(hub.plain[m.group(1)], m.group(1), head, None)
        return self._json(404, {"error": "Not found"}, "EntryNotFound")

    def _bytes(self, src: Path | bytes, name: str, head: bool, commit: str | None) -> None:
        hub = self.hub
        size = _size(src)
        rng = self.headers.get("Range")
        start, end = 0, size - 1
        partial = False
        if rng and not hub.ignore_range:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
            if m:
                start = int(m.group(1))
                end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                partial = True
        length = end - start + 1
        self.send_response(206 if partial else 200)
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", _etag(src, name))
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        if head:
            return
        send = length if hub.truncate is None else min(length, hub.truncate)
        pos = start
        while send > 0:
            chunk = _read(src, pos, min(send, 1 << 20))
            if not chunk:
                break
            self.wfile.write(chunk)
            hub.sent += len(chunk)
            pos += len(chunk)
            send -= len(chunk)
        self.wfile.flush()
        if hub.truncate is not None:
            self.close_connection = True
