"""What llama-server keeps in host memory beyond the engine's buffers: its prompt cache and its context
checkpoints, given as caps (they grow with use) that `explain` prints under the table and `fit --ram` keeps
within the RAM left. The engine facts and the checks: docs/memory.md, "llama-server's host caches"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import moeconf.memory.recurrent as rec
from moeconf.engines.settings import SERVER_BINARIES
from moeconf.memory.cachetypes import cache_row_bytes
from moeconf.units import MIB

if TYPE_CHECKING:
    from moeconf.engines import Engine
    from moeconf.engines.settings import MemorySettings
    from moeconf.memory.geometry import Geometry
    from moeconf.model.inventory import Inventory

PROMPT_CACHE_SINCE: Final = 6724  # llama.cpp PR #16391: --cache-ram, default 8192 MiB
PROMPT_CACHE_DEFAULT_MIB: Final = 8192
# llama.cpp builds from which the default checkpoint count changed, and the new count (before b6685: SWA models only)
CHECKPOINT_DEFAULTS: Final = ((6173, 3), (6685, 3), (6724, 8), (8232, 32))
RECURRENT_CHECKPOINTS_SINCE: Final = 6685


@dataclass(frozen=True)
class ServerCaches:
    """llama-server's host caches for one command line: caps, not allocations."""

    binary: str
    prompt_cache: int | None  # cap in bytes (0: disabled); None: no byte limit (-1)
    prompt_cache_given: bool  # --cache-ram on the command line (else the binary's default)
    slots: int
    checkpoints: int  # per slot (0: none are made)
    checkpoints_given: bool
    checkpoint_bytes: int  # one checkpoint of one slot
    checkpoint_of: str  # what a checkpoint holds, in words ("" when none are made)

    @property
    def checkpoints_total(self) -> int:
        return self.slots * self.checkpoints * self.checkpoint_bytes

    @property
    def cap(self) -> int | None:
        """The most host memory both may take (None: the prompt cache has no byte limit)."""
        return None if self.prompt_cache is None else self.prompt_cache + self.checkpoints_total

    def json(self) -> dict[str, object]:
        return {"binary": self.binary, "prompt_cache_bytes": self.prompt_cache,
                "prompt_cache_given": self.prompt_cache_given, "slots": self.slots,
                "checkpoints_per_slot": self.checkpoints, "checkpoints_given": self.checkpoints_given,
                "checkpoint_bytes": self.checkpoint_bytes, "checkpoint_of": self.checkpoint_of or None,
                "checkpoints_bytes": self.checkpoints_total, "cap_bytes": self.cap}

    def lines(self) -> list[str]:
        """What `explain` and `fit` print under the memory table."""
        if self.prompt_cache is None:
            pc = "with no byte limit (--cache-ram -1: up to the context's tokens of saved prompts)"
        elif self.prompt_cache == 0:
            pc = "off (--cache-ram 0)"
        else:
            flag = "--cache-ram" if self.prompt_cache_given else f"the default --cache-ram {PROMPT_CACHE_DEFAULT_MIB}"
            pc = f"up to {self.prompt_cache / MIB:,.0f} MiB ({flag})"
        out = [f"{self.binary} host caches, beyond the table (they grow with use): prompt cache {pc}"]
        if self.checkpoints and self.checkpoint_bytes:
            flag = ("--ctx-checkpoints" if self.checkpoints_given
                    else f"the default --ctx-checkpoints {self.checkpoints}")
            out.append(f"{self.binary} context checkpoints: up to {self.slots} slot(s) x {self.checkpoints} x "
                       f"{self.checkpoint_bytes / MIB:,.1f} MiB ({self.checkpoint_of}) = "
                       f"{self.checkpoints_total / MIB:,.0f} MiB ({flag})")
        return out


def default_checkpoints(build: int | None) -> int:
    """llama-server's default --ctx-checkpoints at a mainline build (0 before there were any)."""
    return next((count for since, count in reversed(CHECKPOINT_DEFAULTS) if (build or 0) >= since), 0)


def checkpoint(inv: Inventory, geo: Geometry, settings: MemorySettings, build: int | None) -> tuple[int, str]:
    """One slot's checkpoint in bytes as `llama_state_seq_get_size_ext(..., PARTIAL_ONLY)` sizes it, and what
    it holds; (0, "") where the model makes none (docs/memory.md, "llama-server's host caches")."""
    rs = rec.shape(inv)
    rec_layers = [la for la in geo.layers if la.recurrent]
    if rs is not None and rec_layers:
        if (build or 0) < RECURRENT_CHECKPOINTS_SINCE:
            return 0, ""
        # headers, then per layer the conv and SSM states, each a type, a row size and the row
        rows = len(rec_layers) * (rs.n_embd_r + rs.n_embd_s) * 4
        return 8 + 4 + 8 + 8 + len(rec_layers) * 24 + rows, f"the recurrent state of {len(rec_layers)} layers"
    swa_layers = [la for la in geo.layers if la.swa]
    if not swa_layers or geo.n_swa <= 0 or settings.swa_full:
        return 0, ""
    n_seq = max(1, settings.n_parallel)
    n_ctx = settings.n_ctx or inv.metadata.context_length or 0
    cells = min(geo.n_swa, max(1, n_ctx if settings.kv_unified or n_seq == 1 else n_ctx // n_seq))
    k = sum(cache_row_bytes(settings.cache_type_k, la.head_k * la.n_head_kv) for la in swa_layers)
    v = sum(cache_row_bytes(settings.cache_type_v, la.head_v * la.n_head_kv) for la in swa_layers)
    head = 8 + 4 + 4 + 4 + 4 + len(swa_layers) * 24  # headers, per layer K's and V's type + row size
    return head + cells * (12 + k + v), f"{cells} cells of {len(swa_layers)} sliding-window layers"


def server_caches(inv: Inventory, geo: Geometry, settings: MemorySettings, eng: Engine) -> ServerCaches | None:
    """llama-server's host caches for this command line; None for another binary (or none), or a build without them."""
    binary = settings.binary
    if binary is None or binary not in SERVER_BINARIES:
        return None
    ik = eng.name == "ik_llama.cpp"
    if not ik and (eng.build or 0) < CHECKPOINT_DEFAULTS[0][0]:  # the first of the two (b6173 < b6724)
        return None
    has_cache = ik or (eng.build or 0) >= PROMPT_CACHE_SINCE
    given = settings.cache_ram
    mib = given if given is not None else (PROMPT_CACHE_DEFAULT_MIB if has_cache else 0)
    prompt = None if mib < 0 else mib * MIB
    # ik makes checkpoints only with its own switch (not modelled: off by default)
    size, what = (0, "") if ik else checkpoint(inv, geo, settings, eng.build)
    n_ckpt = settings.ctx_checkpoints if settings.ctx_checkpoints is not None else default_checkpoints(eng.build)
    return ServerCaches(binary, prompt, given is not None, max(1, settings.n_parallel), n_ckpt if size else 0,
                        settings.ctx_checkpoints is not None, size, what)
