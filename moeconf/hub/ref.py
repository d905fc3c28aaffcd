"""MODEL strings that name a remote model (parsed without the network or huggingface_hub).

    hf://OWNER/REPO/PATH.gguf      one file of a repo (any shard: the model is read from shard 1)
    OWNER/REPO:TAG                 as llama.cpp's -hf takes it (the tag picks the file)
    OWNER/REPO                     -hf with no tag (Q4_K_M, then Q8_0, then the first model); for
                                   `moeconf fit`: every quant of the repo
    https://HOST/.../NAME.gguf     any server that answers range requests (http:// too)

A string naming an existing local file or folder is always local.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import moeconf.hub.names as names
from moeconf.errors import MoeconfError

_HF = "hf://"


@dataclass(frozen=True)
class RemoteRef:
    repo: str | None = None
    tag: str | None = None  # None: no ':TAG' given
    file: str | None = None  # a path in the repo (hf:// or --hf-file)
    url: str | None = None
    revision: str = "main"

    @property
    def display(self) -> str:
        if self.url:
            return self.url
        if self.file is not None:
            return f"hf://{self.repo}/{self.file}"
        return f"{self.repo}:{self.tag}" if self.tag else str(self.repo)

    def engine_args(self, file: str | None = None) -> list[str]:
        """How the engine's command line names this model: -hf REPO:TAG, -hf REPO --hf-file PATH,
        or -mu URL (llama.cpp downloads it to its cache)."""
        if self.url:
            return ["-mu", self.url]
        if self.file is not None or file is not None:
            return ["-hf", str(self.repo), "--hf-file", str(self.file or file)]
        return ["-hf", self.display]


def looks_remote(spec: str) -> bool:
    """Whether `spec` is a remote MODEL string (an existing local path never is)."""
    if spec.startswith((_HF, "https://", "http://")):
        return True
    if os.path.exists(spec) or spec.endswith((".gguf", ".json")) or spec.startswith((".", "/", "~")):
        return False
    repo = spec.split(":", 1)[0]
    return names.is_valid_repo_id(repo) and (":" not in spec or bool(re.fullmatch(r"[^:/\s]+", spec.split(":", 1)[1])))


def parse_ref(spec: str) -> RemoteRef:
    if spec.startswith(_HF):
        rest = spec[len(_HF):]
        parts = rest.split("/", 2)
        if len(parts) < 3 or not parts[2]:
            raise MoeconfError(f"{spec!r}: expected hf://OWNER/REPO/PATH.gguf")
        repo = f"{parts[0]}/{parts[1]}"
        if not names.is_valid_repo_id(repo):
            raise MoeconfError(f"{spec!r}: {repo!r} is not a Hugging Face repo id")
        path = parts[2]
        if not path.endswith(".gguf"):
            raise MoeconfError(f"{spec!r}: the path must name a .gguf file")
        return RemoteRef(repo=repo, file=path)
    if spec.startswith(("https://", "http://")):
        if not spec.split("?", 1)[0].endswith(".gguf"):
            raise MoeconfError(f"{spec!r}: a URL must name a .gguf file")
        return RemoteRef(url=spec)
    try:
        repo, tag = names.split_repo_tag(spec)
    except ValueError as e:
        raise MoeconfError(str(e)) from None
    if not names.is_valid_repo_id(repo):
        raise MoeconfError(f"{spec!r}: {repo!r} is not a Hugging Face repo id")
    return RemoteRef(repo=repo, tag=tag or None)
