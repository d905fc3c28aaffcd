"""Traffic per command: the bytes each device reads per generated token, and the bytes copied between
devices per generated token and per prompt ubatch, through the engine's own graph and scheduler
(memory/graph: the architecture's composition, `sched.Scheduler`'s backend assignment and splits).

Per generated token (one sequence, a batch of one token at context depth `depth`):
- weights: every weight an op of the token's graph reads, on the device that runs the op (at one
  token no GPU takes an op over from the host: CUDA's op offload starts at a batch of 32); a
  MUL_MAT_ID reads the `expert_used_count` experts the token selects (k of the tensor's E slices),
  ADD_ID the selected experts' bias rows, GET_ROWS the token's row (token_embd); a weight read by two
  ops counts twice;
- KV: each attention layer's cached rows up to the depth (a sliding-window layer's up to its window),
  K and V rows in the cache's types as the KV cache allocates them (memory/kvcache.py), on the
  device that holds the layer's cache;
- recurrent: each recurrent layer's state for one sequence (memory/recurrent.py), read once (and
  written back, as much again; not added);
- copies: every tensor a scheduler split takes from another backend (ggml-backend.cpp
  `ggml_backend_sched_split_graph`: the hidden state at each device boundary, the normed hidden state
  and expert ids a host expert op takes and the k experts' outputs it gives back, the graph's inputs:
  positions, the KQ mask of the padded cells).

Per prompt ubatch (`-ub` tokens, the last ubatch of a prompt reaching `depth`, logits for its last
token only):
- op-offload copies: every host weight whose op a GPU takes over at that batch (the graph's own
  decision, `Scheduler`), copied to the GPU once per ubatch; a MUL_MAT_ID weight that a split starts
  with is copied only for the experts the ubatch's tokens select (ggml-backend.cpp
  `ggml_backend_sched_compute_splits`): under uniform routing the expected share is
  1 - (1 - k/E)^T of its bytes (T tokens each selecting k of E experts; the 512 bytes of padding after
  each run of experts left out);
- activations and inputs: the other split inputs, as per token;
- work: on each device, the FLOPs of the matrix products it runs (MUL_MAT and MUL_MAT_ID with a weight:
  2 x the weight's rows x columns x the tokens, a MUL_MAT_ID's k selected experts per token) and of the
  attention (FLASH_ATTN_EXT, or the KQ and KQV products without flash attention: 2 x (K width + V width)
  x viewed cells x heads x tokens), and for the host the weight bytes its matrix products read and their
  largest batch (the host runs a product only below CUDA's op-offload batch, or on the output rows).

Not counted: what a kernel reads twice (tiles, caches), the logits copied back to the host, the
KV rows beyond the depth that the padded view spans (the engine views its cells in
multiples of 256 and masks the rest; CUDA's flash attention skips the masked tail)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import moeconf.memory.recurrent as rec
from moeconf.engines import HOST
from moeconf.engines.settings import MemorySettings
from moeconf.memory.geometry import geometry
from moeconf.memory.graph.archs import COMPOSITIONS, traits
from moeconf.memory.graph.blocks import MissingTensor
from moeconf.memory.graph.ggml import INPUT, VIEW_OPS, Tensor, nbytes, nelements
from moeconf.memory.graph.model import (
    Setup,
    build,
    file_refusals,
    graph_refusals,
    missing_refusal,
    setup_for,
)
from moeconf.memory.graph.sched import Scheduler
from moeconf.memory.kvcache import kv_bytes
from moeconf.placement import Placement

PAD = 256  # llama_kv_cache::get_n_kv: the cells a graph views, in multiples of 256
ROUTED_OPS = frozenset({"MUL_MAT_ID", "ADD_ID"})


@dataclass(frozen=True)
class Reads:
    """Bytes one device reads per generated token, by kind."""

    weights: int = 0  # always-active weights (attention, norms, shared experts, dense FFNs, router, output)
    experts: int = 0  # the routed experts the token selects
    kv: int = 0  # KV cache rows up to the depth
    recurrent: int = 0  # recurrent state, one sequence

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.kv + self.recurrent

    def json(self) -> dict[str, int]:
        return {"weights": self.weights, "experts": self.experts, "kv": self.kv, "recurrent": self.recurrent,
                "total": self.total}


@dataclass(frozen=True)
class Copy:
    """Bytes one graph evaluation copies from one device to another, by kind: `weights` (op offload),
    `activations` (hidden states, expert ids and weights between splits), `inputs` (the graph's
    inputs from the host: positions, KV indices, masks)."""

    src: str
    dst: str
    weights: int = 0
    activations: int = 0
    inputs: int = 0
    tensors: int = 0  # the weights copied (op offload)
    # op offload's bounds: every token selecting the same k experts (k/E of each MUL_MAT_ID weight: a
    # model of zero weights, whose routers tie), and every expert selected (the whole tensors)
    weights_min: int = 0
    weights_max: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.inputs

    @property
    def link(self) -> str:
        """`network` where an RPC server is an end, else `pcie` (host-device or device-device)."""
        return "network" if self.src.startswith("RPC") or self.dst.startswith("RPC") else "pcie"

    def json(self) -> dict[str, Any]:
        return {"from": self.src, "to": self.dst, "link": self.link, "weights": self.weights,
                "weights_same_experts": self.weights_min, "weights_all_experts": self.weights_max,
                "weight_tensors": self.tensors, "activations": self.activations, "inputs": self.inputs,
                "total": self.total}


@dataclass(frozen=True)
class Work:
    """The arithmetic one device does for one prompt ubatch: FLOPs of its matrix products with a weight
    (`matrix`) and of its attention (`attention`, at the ubatch's viewed cells); the weight bytes its
    matrix products read (`weight_bytes`: what a host product at a small batch is bound by) and their
    largest batch in tokens (`max_batch`)."""

    matrix: int = 0
    attention: int = 0
    weight_bytes: int = 0
    max_batch: int = 0

    def json(self) -> dict[str, int]:
        return {"matrix_flops": self.matrix, "attention_flops": self.attention,
                "matrix_weight_bytes": self.weight_bytes, "max_batch": self.max_batch}


@dataclass(frozen=True)
class Traffic:
    depth: int  # the context depth the generated token attends to (and the prompt ubatch reaches)
    n_ubatch: int  # the prompt ubatch's tokens
    reads: dict[str, Reads]  # per generated token, per device
    token_copies: tuple[Copy, ...]  # per generated token
    ubatch_copies: tuple[Copy, ...]  # per prompt ubatch
    assumptions: tuple[str, ...] = field(default=())
    work: dict[str, Work] = field(default_factory=dict)  # per prompt ubatch, per device that does any
    ubatch_cells: int = 0  # the cells the prompt ubatch's attention views (its `work.attention` is at these)
    token_splits: int = 0  # the scheduler's splits of a generated token's graph (each a hand-over between devices)
    ubatch_splits: int = 0  # and of a prompt ubatch's

    def link_bytes(self, copies: tuple[Copy, ...], link: str) -> int:
        return sum(c.total for c in copies if c.link == link)

    def json(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "generation": {
                "per_token": {d: r.json() for d, r in self.reads.items()},
                "copies": [c.json() for c in self.token_copies],
                "pcie_bytes": self.link_bytes(self.token_copies, "pcie"),
                "network_bytes": self.link_bytes(self.token_copies, "network"),
                "splits": self.token_splits,
            },
            "prompt": {
                "n_ubatch": self.n_ubatch,
                "per_ubatch_copies": [c.json() for c in self.ubatch_copies],
                "op_offload_bytes": sum(c.weights for c in self.ubatch_copies),
                "op_offload_tensors": sum(c.tensors for c in self.ubatch_copies),
                "op_offload_bytes_same_experts": sum(c.weights_min for c in self.ubatch_copies),
                "op_offload_bytes_all_experts": sum(c.weights_max for c in self.ubatch_copies),
                "pcie_bytes": self.link_bytes(self.ubatch_copies, "pcie"),
                "network_bytes": self.link_bytes(self.ubatch_copies, "network"),
                "work": {d: w.json() for d, w in self.work.items()},
                "viewed_cells": self.ubatch_cells,
                "splits": self.ubatch_splits,
            },
            "assumptions": list(self.assumptions),
        }


class TrafficUnmodelled(Exception):
    """The command's graph is not composed (its architecture, engine or settings): no traffic is given."""


def unmodelled(placement: Placement, settings: MemorySettings) -> str | None:
    inv = placement.inventory
    if placement.engine.name != "llama.cpp":
        return f"traffic is modelled for llama.cpp only ({placement.engine.name}'s graph and op offload differ)"
    if inv.arch not in COMPOSITIONS:
        return f"traffic needs the engine's graph of {inv.arch}, which moeconf does not compose"
    comp = COMPOSITIONS[inv.arch]
    if comp.memory is not None and (why_file := file_refusals(inv)):  # branches of the graph no dump checked
        return "traffic: " + "; ".join(why_file)
    if comp.memory is not None and comp.memory.refuses is not None:
        s = setup_for(inv, settings)
        for n_tokens in (1, s.n_tokens):
            why = comp.memory.refuses(n_tokens, 1)
            if why:
                return f"traffic: {why}"
    return None


def traffic(placement: Placement, settings: MemorySettings, depth: int | None = None) -> Traffic:
    """The traffic of this placement under these settings at context depth `depth` (default: the
    context, `-c`, or the model's training context). Raises TrafficUnmodelled where the graph is not
    composed."""
    why = unmodelled(placement, settings)
    if why:
        raise TrafficUnmodelled(why)
    inv = placement.inventory
    # the graph the engine runs: under full offload its callback pins each layer's norms to the layer's
    # device (llama-context.cpp graph_get_cb), which only the sizing reserve drops (`Setup.norm_pins`)
    base = replace(setup_for(inv, settings), n_seq=1, n_stream=1, n_rs=1, pipeline=False, norm_pins=True)
    n_ctx = settings.n_ctx or (inv.metadata.context_length or 4096)
    depth = n_ctx if depth is None else depth
    # a sequence's cells: the context, or its share of it where -np splits the cache into streams
    cells = min(n_ctx, base.n_kv)
    if not 0 <= depth <= cells:
        of = "the context" if cells == n_ctx else "a sequence's share of the context"
        raise ValueError(f"the depth is a number of tokens from 0 to {of} ({cells:,}), not {depth:,}")
    # the generated token: a batch of one at position `depth`, viewing the cells up to it
    gen = _evaluate(placement, _viewing(replace(base, n_tokens=1, n_outputs=1), depth + 1))
    reads: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for dev, kind, b in gen.reads:
        reads[dev][kind] += b
    for dev, b in _kv(placement, settings, depth, gen.kv_homes).items():
        reads[dev]["kv"] += b
    for dev, b in _recurrent(placement, gen.rs_homes).items():
        reads[dev]["recurrent"] += b
    # the prompt's ubatch: -ub tokens of one sequence (within -b and the context), its last token's logits,
    # the cells up to the depth
    T = min(-(-n_ctx // PAD) * PAD, settings.n_batch, settings.n_ubatch)
    prompt_setup = _viewing(replace(base, n_tokens=T, n_outputs=1), max(depth, T))
    prompt = _evaluate(placement, prompt_setup)
    devices = sorted(reads, key=lambda d: (d != HOST, d))
    assumptions = ["one sequence: a generated token is a batch of one (-np and parallel decoding not modelled)",
                   "uniform routing: a prompt ubatch's MUL_MAT_ID op offload copies the experts its tokens select, "
                   "expected 1 - (1 - k/E)^T of each tensor"]
    return Traffic(
        depth=depth, n_ubatch=T,
        reads={d: Reads(**reads[d]) for d in devices},
        token_copies=gen.copies, ubatch_copies=prompt.copies, assumptions=tuple(assumptions),
        work=dict(sorted(prompt.work.items(), key=lambda kv: (kv[0] != HOST, kv[0]))), ubatch_cells=prompt_setup.n_kv,
        token_splits=gen.splits, ubatch_splits=prompt.splits)


def _viewing(base: Setup, used: int) -> Setup:
    """The graph viewing the cells it views with `used` cells filled (llama_kv_cache::get_n_kv: in
    multiples of 256, within the cache; a sliding-window cache's within its own cells)."""
    n_kv = min(base.n_kv, max(PAD, -(-used // PAD) * PAD))
    return replace(base, n_kv=n_kv, n_kv_swa=min(base.n_kv_swa, n_kv))


@dataclass(frozen=True)
class _Evaluation:
    reads: tuple[tuple[str, str, int], ...]  # (device, kind, bytes) of each weight an op reads
    copies: tuple[Copy, ...]
    kv_homes: dict[int, str]
    rs_homes: dict[int, str]
    work: dict[str, Work]
    splits: int


def _evaluate(placement: Placement, setup: Setup) -> _Evaluation:
    """The graph of one evaluation, split by the scheduler: what each op reads of the weights, on the
    backend that runs it, and every split input copied in."""
    try:
        g, backends = build(placement, setup)
    except MissingTensor as e:
        raise TrafficUnmodelled(missing_refusal(placement.inventory, e, "traffic")[0]) from None
    why = graph_refusals(placement.inventory, g.unweighted, g.cp.unfused, "traffic")
    if why:
        raise TrafficUnmodelled(why[0])
    sched = Scheduler(backends, pipeline=False, op_offload=setup.op_offload)
    sched.split(g.gf, g.pinned)
    ids = sched.ids

    def original(t: Tensor) -> Tensor:
        return sched.copy_of[t][0] if t in sched.copy_of else t

    def weight(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        t = original(t)
        base = t.view_src if t.view_src is not None else t
        return t if base.buffer is not None and base.weights else None

    reads: list[tuple[str, str, int]] = []
    work: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for n in g.gf.nodes:
        if n.op in VIEW_OPS:
            continue
        dev = backends[ids[n]].name
        _work(n, weight(n.src[0]) if n.src else None, work[dev])
        for j, s in enumerate(n.src):
            w = weight(s)
            if w is None:
                continue
            if n.op == "MUL_MAT_ID" and j == 0:  # the k of E expert matrices the token selects
                ids_t = n.src[2]
                k = ids_t.ne[0] if ids_t is not None else w.ne[2]
                reads.append((dev, "experts", nbytes(w) * min(k, w.ne[2]) // w.ne[2]))
            elif n.op == "ADD_ID" and j == 1:  # the selected experts' bias rows
                ids_t = n.src[2]
                k = ids_t.ne[0] if ids_t is not None else w.ne[1]
                reads.append((dev, "experts", nbytes(w) * min(k, w.ne[1]) // w.ne[1]))
            elif n.op == "GET_ROWS" and j == 0:  # the rows asked for
                rows = n.src[1].ne[0] if n.src[1] is not None else 1
                reads.append((dev, "weights", min(nbytes(w), w.nb[1] * rows)))
            else:
                reads.append((dev, "weights", nbytes(w)))
    # the split inputs: what each split copies in before it runs
    copies: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for b, inputs, members in sched.splits:
        dst = backends[b].name
        first = members[0] if members else None
        for s in inputs:
            src = backends[ids[s]].name
            c = copies[(src, dst)]
            if s.buffer is not None and s.weights:
                expected, same = _offload_bytes(s, first, sched.copy_of)
                c["weights"] += expected
                c["weights_min"] += same
                c["weights_max"] += nbytes(s)
                c["tensors"] += 1
            elif s.flags & INPUT:
                c["inputs"] += nbytes(s)
            else:
                c["activations"] += nbytes(s)
    kv_homes = {il: k.buffer or HOST for il, (k, _) in g.kv.items()}
    rs_homes = {il: r.buffer or HOST for il, (r, _) in g.rs.items()}
    return _Evaluation(reads=tuple(reads), copies=tuple(Copy(src, dst, **c) for (src, dst), c in copies.items()),
                       kv_homes=kv_homes, rs_homes=rs_homes,
                       work={d: Work(**w) for d, w in work.items() if any(w.values())}, splits=len(sched.splits))


def _work(n: Tensor, w: Tensor | None, into: dict[str, int]) -> None:
    """Add node `n`'s arithmetic to its device's: a matrix product's 2 x (inner width) FLOPs per element of
    its result (a MUL_MAT_ID's result holds the k selected experts' rows per token), with a weight
    (`w`, its first source) or without (attention's KQ and KQV); flash attention's two products."""
    if n.op in ("MUL_MAT", "MUL_MAT_ID"):
        a = n.src[0]
        if a is None:
            return
        flops = 2 * a.ne[0] * nelements(n)
        if w is None:
            into["attention"] += flops
            return
        into["matrix"] += flops
        batch = n.ne[2] if n.op == "MUL_MAT_ID" else n.ne[1] * n.ne[2] * n.ne[3]
        into["max_batch"] = max(into["max_batch"], batch)
        if n.op == "MUL_MAT_ID" and n.src[2] is not None and 0 < n.src[2].ne[0] < w.ne[2]:
            # the experts its tokens select, expected under uniform routing (as the op offload's copy)
            share = 1.0 - (1.0 - n.src[2].ne[0] / w.ne[2]) ** n.src[2].ne[1]
            into["weight_bytes"] += round(nbytes(w) * share)
        else:
            into["weight_bytes"] += nbytes(w)
    elif n.op == "FLASH_ATTN_EXT":
        q, k, v = n.src[0], n.src[1], n.src[2]
        if q is None or k is None or v is None:
            return
        into["attention"] += 2 * (q.ne[0] + v.ne[0]) * k.ne[1] * q.ne[1] * q.ne[2] * q.ne[3]


def _offload_bytes(w: Tensor, first: Tensor | None,
                   copy_of: Mapping[Tensor, tuple[Tensor, int]]) -> tuple[int, int]:
    """The bytes of host weight `w` a split copies in: the experts its tokens select where the split
    starts with the MUL_MAT_ID that reads it as its matrix, else all of it (ggml-backend.cpp
    `ggml_backend_sched_compute_splits`). As (the expected bytes under uniform routing, the bytes
    where every token selects the same k experts)."""
    size = nbytes(w)
    if first is None or first.op != "MUL_MAT_ID" or first.src[0] is None or first.src[2] is None:
        return size, size
    if copy_of.get(first.src[0], (None, 0))[0] is not w:
        return size, size
    ids_t = first.src[2]
    k, n_tokens, n_expert = ids_t.ne[0], ids_t.ne[1], w.ne[2]
    if n_expert <= 0 or k >= n_expert:
        return size, size
    share = 1.0 - (1.0 - k / n_expert) ** n_tokens  # E[distinct experts] / E, T tokens each picking k of E
    return round(size * share), size * k // n_expert


def _kv(placement: Placement, settings: MemorySettings, depth: int, homes: dict[int, str]) -> dict[str, int]:
    """The KV rows a token at `depth` reads: each attention layer's rows up to the depth, a window's up
    to the window, in the cache's row widths and types (kv_bytes with the cells set to those rows)."""
    inv = placement.inventory
    geo = geometry(inv)
    attn = replace(geo, layers=tuple(la for la in geo.layers if not la.recurrent), nextn_kv=())
    window = min(depth, geo.n_swa) if geo.swa_type != "none" else depth
    fa = settings.flash_attn != "off" and traits(inv.arch).flash_attn
    one = replace(settings, n_parallel=1)
    return {d: b for d, b in kv_bytes(inv, attn, one, homes, cells=depth, swa_cells=window, n_stream=1,
                                      flash_attn=fa, ik=False).items() if b}


def _recurrent(placement: Placement, homes: dict[int, str]) -> dict[str, int]:
    """Each recurrent layer's state for one sequence, on the device holding it."""
    out: dict[str, int] = defaultdict(int)
    per_layer = rec.state_bytes(placement.inventory, 1)
    for dev in homes.values():
        out[dev] += per_layer
    return dict(out)
