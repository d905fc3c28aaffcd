"""Header-only reads of remote GGUF files over HTTP range requests.

urllib (the standard library), not huggingface_hub's session: the reads need exact control that
the Hub client does not promise across its versions (it moved from requests to httpx): how many
bytes are taken from a body whatever the server sends (a server that ignores Range must not make
moeconf download a model), a deadline per request, and redirects that drop the Authorization
header when they leave the endpoint's host (the Hub redirects `resolve/` to a CDN with a signed
URL). The Hub side (listing, revisions, token, endpoint, offline mode) is huggingface_hub's.

A read starts with one range of FIRST_RANGE bytes; when the header reaches past it, the parser
says how far it probably reaches (from the tokenizer arrays read so far and the tensor count) and
the next range covers that with a margin, so a shard takes one request, the first shard of a
large-vocabulary model two. At most MAX_HEADER_BYTES are read per file, and MAX_REQUESTS.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from moeconf.errors import GGUFError, MoeconfError
from moeconf.model.gguf_header import GGUFHeader, NeedMore, parse_prefix

FIRST_RANGE = 2 << 20
MAX_HEADER_BYTES = 256 << 20
MAX_REQUESTS = 8
_CHUNK = 256 << 10


class HubError(MoeconfError):
    """A remote model that cannot be read: the server, the network, the repo or the name."""


def timeout_s() -> float:
    try:
        return float(os.environ.get("MOECONF_HUB_TIMEOUT", "30"))
    except ValueError:
        return 30.0


def max_header_bytes() -> int:
    try:
        return int(os.environ.get("MOECONF_HUB_MAX_HEADER", str(MAX_HEADER_BYTES)))
    except ValueError:
        return MAX_HEADER_BYTES


@dataclass
class Stats:
    """Requests made and body bytes read (for the progress line and benchmarks/bench.py hub)."""

    requests: int = 0
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, requests: int = 0, nbytes: int = 0) -> None:
        with self.lock:
            self.requests += requests
            self.bytes += nbytes


STATS = Stats()


class _Redirect(urllib.request.HTTPRedirectHandler):
    """Follows redirects, dropping Authorization once the host differs from the first request's."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            first_host = getattr(req, "moeconf_host", urllib.parse.urlsplit(req.full_url).netloc)
            new.moeconf_host = first_host  # type: ignore[attr-defined]
            if urllib.parse.urlsplit(newurl).netloc != first_host:
                new.remove_header("Authorization")
                new.unredirected_hdrs.pop("Authorization", None)
        return new


_OPENER = urllib.request.build_opener(_Redirect())


def _open(url: str, headers: dict[str, str], method: str = "GET") -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "moeconf", **headers}, method=method)
    STATS.add(requests=1)
    try:
        return _OPENER.open(req, timeout=timeout_s())
    except urllib.error.HTTPError as e:
        e.close()
        raise http_error(url, e.code) from None
    except TimeoutError:
        raise HubError(f"timed out after {timeout_s():g} s waiting for the server (MOECONF_HUB_TIMEOUT sets "
                       "the limit)", path=url) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            raise HubError(f"timed out after {timeout_s():g} s waiting for the server (MOECONF_HUB_TIMEOUT sets "
                           "the limit)", path=url) from None
        raise HubError(f"cannot reach the server: {reason}", path=url) from None


def http_error(url: str, code: int) -> HubError:
    if code in (401, 403):
        return HubError(f"HTTP {code}: access denied (a gated or private repo: accept its terms on the Hub and "
                        "set HF_TOKEN or run `hf auth login`)", path=url)
    if code == 404:
        return HubError("HTTP 404: no such file on the server", path=url)
    if code == 416:
        return HubError("HTTP 416: the server refused the byte range (the file is shorter than it said)", path=url)
    return HubError(f"HTTP {code} from the server", path=url)


def head(url: str, headers: dict[str, str]) -> dict[str, str]:
    """The response headers of a HEAD request (after redirects), lower-cased names."""
    with _open(url, headers, "HEAD") as r:
        return {k.lower(): v for k, v in r.headers.items()}


def _content_range(value: str | None, url: str) -> tuple[int, int, int]:
    """`bytes START-END/TOTAL` -> (start, end, total)."""
    try:
        assert value is not None
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        start, _, end = span.partition("-")
        if unit != "bytes":
            raise ValueError(unit)
        return int(start), int(end), int(total)
    except (AssertionError, ValueError):
        raise HubError(f"the server answered a range request with Content-Range {value!r}", path=url) from None


class _Reader:
    """The bytes of one remote file from its start, as far as the header needs."""

    def __init__(self, url: str, headers: dict[str, str], label: str) -> None:
        self.url, self.headers, self.label = url, headers, label
        self.host = urllib.parse.urlsplit(url).netloc
        self.buf = bytearray()
        self.size: int | None = None
        self.etag: str | None = None
        self.commit: str | None = None
        self.requests = 0
        self.deadline_s = timeout_s()

    def fetch_to(self, target: int) -> None:
        """Read bytes [len(buf), target) with one range request."""
        if self.requests >= MAX_REQUESTS:
            raise HubError(f"the header needs more than {MAX_REQUESTS} range requests; stopped", path=self.label)
        self.requests += 1
        start = len(self.buf)
        headers = dict(self.headers)
        if urllib.parse.urlsplit(self.url).netloc != self.host:
            headers.pop("Authorization", None)  # a redirect's target (a CDN) never gets the token
        r = _open(self.url, {**headers, "Range": f"bytes={start}-{target - 1}", "Accept-Encoding": "identity"})
        with r:
            # later ranges go straight to where the redirects led (the Hub's signed CDN URL)
            self.url = r.geturl() or self.url
            hdrs = {k.lower(): v for k, v in r.headers.items()}
            self.etag = self.etag or hdrs.get("etag")
            self.commit = self.commit or hdrs.get("x-repo-commit")
            if r.status == 206:
                c_start, _c_end, total = _content_range(hdrs.get("content-range"), self.label)
                if c_start != start:
                    raise HubError(f"asked for bytes from {start}, the server sent from {c_start}", path=self.label)
                self.size = total
                want = min(target, total) - start
            elif r.status == 200:
                # the server ignores Range and sends the whole file: read from its start, only as far as
                # wanted (the connection is closed after), never the model
                if start:  # again: the bytes are read once more from the start (bounded all the same)
                    del self.buf[:]
                    start = 0
                length = hdrs.get("content-length")
                if length is None or not length.isdigit():
                    raise HubError("the server ignores byte ranges and sends no Content-Length: the file's size "
                                   "is unknown, so its header cannot be checked", path=self.label)
                self.size = int(length)
                want = min(target, self.size)
            else:
                raise HubError(f"HTTP {r.status} to a range request", path=self.label)
            self._read_body(r, want)

    def _read_body(self, r: Any, want: int) -> None:
        t0 = time.monotonic()
        got = 0
        while got < want:
            try:
                chunk = r.read(min(_CHUNK, want - got))
            except TimeoutError:
                raise HubError(f"timed out after {timeout_s():g} s reading the response", path=self.label) from None
            except http.client.IncompleteRead as e:
                chunk = e.partial
                self.buf += chunk
                STATS.add(nbytes=len(chunk))
                return  # what arrived is kept; the next range asks for the rest
            except (OSError, http.client.HTTPException) as e:
                raise HubError(f"the connection failed while reading: {e}", path=self.label) from None
            if not chunk:
                return  # a body shorter than announced: the next range asks for the rest
            self.buf += chunk
            got += len(chunk)
            STATS.add(nbytes=len(chunk))
            if time.monotonic() - t0 > self.deadline_s:
                raise HubError(f"timed out: the server sent {got:,} bytes in {self.deadline_s:g} s "
                               "(MOECONF_HUB_TIMEOUT sets the limit)", path=self.label)


def read_remote_header(url: str, headers: dict[str, str], label: str) -> tuple[GGUFHeader, _Reader]:
    """Parse the GGUF header at `url` (label: the name used in messages), reading only its bytes."""
    rd = _Reader(url, headers, label)
    cap = max_header_bytes()
    target = FIRST_RANGE
    while True:
        rd.fetch_to(target)
        assert rd.size is not None
        try:
            return parse_prefix(bytes(rd.buf), label, rd.size), rd
        except NeedMore as more:
            if len(rd.buf) >= rd.size:
                raise AssertionError("parse_prefix asked for more of a file read whole") from None
            if more.offset > cap:
                raise GGUFError(f"the header is larger than {cap >> 20} MiB (it reaches byte {more.offset:,} at "
                                "least): not read (MOECONF_HUB_MAX_HEADER sets the limit)", path=label) from None
            # in the metadata (the tokenizer's arrays: tokens, then merges of about the same size) the
            # estimate sees only the array it stopped in: ask for at least four times as much
            floor = 4 * len(rd.buf) if more.in_metadata else len(rd.buf) + (1 << 20)
            target = min(max(int(more.estimate * 1.25), floor), rd.size, cap)
            if target <= len(rd.buf):
                target = min(len(rd.buf) + (1 << 20), rd.size)
