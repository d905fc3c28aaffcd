"""Predicted prompt and generation tokens/s from a command's traffic and the machine (issue 26, item 3).

A first-order model of the bytes and the arithmetic (moeconf/traffic.py) at the machine's rates
(moeconf/machine.py), with a few constants fitted on measured runs (tests/data/speed_runs.json, the
rows not set aside; `python benchmarks/speed_accuracy.py fit` refits them) and the error measured for
each prediction (docs/speed.md):

- generation, seconds per token =
      TOKEN_FIXED_S where llama-server generates (its sampling, slot loop and launches; llama-bench: none)
    + sum over GPUs of the bytes the token reads there / (the card's memory bandwidth x GPU_BW_FRACTION)
    + the bytes the host reads / (the host's memory bandwidth x HOST_BW_FRACTION)
    + the bytes copied between devices / the PCIe link's bandwidth;
- prompt, seconds for a prompt of P tokens in ubatches of T =
      PROMPT_FIXED_S (llama-server's first prompt only; llama-bench times warm runs)
    + per ubatch: sum over GPUs of (matrix + attention FLOPs) / (the card's matrix rate x GPU_MATRIX_FRACTION)
    + per ubatch: sum over GPUs of the weight bytes its products read / (the card's bandwidth x GPU_BW_FRACTION)
    + per ubatch: op-offload bytes / (the PCIe link x OFFLOAD_COPY_FRACTION) + OFFLOAD_TENSOR_S per weight copied
    + per ubatch: the other copies / the PCIe link, and the host's batch-of-one products' weight bytes at the
      host's rate;
  each ubatch's attention scaled to the cells it views, the last one's work to its tokens;
- without a GPU, seconds per token = TOKEN_FIXED_S (llama-server only) + the bytes the host reads /
  min(the host's bandwidth x HOST_BW_FRACTION, threads x CPU_THREAD_BW); the prompt is not predicted.
AMD GPUs (ROCm) are refused: the validation table's RX 7900 XTX rows are not reproduced.

The terms add (the engine runs a graph's splits one after another and waits for each copy). Where a
figure the terms need is missing, no number is given: `Prediction.missing` names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moeconf.engines import HOST
from moeconf.machine import GPU, Machine, number
from moeconf.traffic import PAD, Traffic

if TYPE_CHECKING:
    from moeconf.engines.settings import MemorySettings
    from moeconf.placement import Placement

# --- the constants, fitted on the non-aside rows of tests/data/speed_runs.json by
# `python benchmarks/speed_accuracy.py fit` (which prints these lines) -------------------------------------
# a token llama-server generates has a fixed cost whatever the bytes: sampling over the vocabulary, the
# slot loop, kernel launches and synchronisation; llama-bench decodes without sampling, and its NVIDIA
# rows leave no fixed cost the fit can tell from the reads (docs/speed.md)
TOKEN_FIXED_S = 0.00519
# the share of a card's peak memory bandwidth a generated token's reads reach (a batch of one reads each
# matrix once, layer by layer), and a prompt ubatch's weight reads too
GPU_BW_FRACTION = 0.681
# the share of the host's memory bandwidth its expert products reach: no predicted hybrid run states its
# host's bandwidth (the H200 runs' host rate is fitted with the constants; the published hybrid rows
# lack a card figure), so the host figure is taken as reached
HOST_BW_FRACTION = 1.0
# a prompt's fixed cost where a server's first prompt is timed (CUDA's lazy module loading, the memory
# pool's growth and cuBLAS's set-up fall in it); llama-bench runs a warm-up first and times none of it
PROMPT_FIXED_S = 0.255
# the share of a card's dense FP16 tensor peak the prompt's matrix products and attention reach
GPU_MATRIX_FRACTION = 0.156
# the share of the PCIe link's bandwidth an op-offload copy reaches: the host weights sit in pageable
# memory (`-ot ...=CPU` keeps them in the mmap'd file's pages), which CUDA copies through a staging buffer
OFFLOAD_COPY_FRACTION = 0.117
# each op-offload copy's own cost: the split reads the expert ids back from the GPU and waits for them
OFFLOAD_TENSOR_S = 0.000412
# a command without a GPU: the bytes a thread's products read per second (ggml-cpu splits each product's
# rows over the threads, and one thread does not reach the host's bandwidth); a generated token takes
# its host bytes / min(host bandwidth x HOST_BW_FRACTION, threads x CPU_THREAD_BW). Fitted on one 2-vCPU
# EPYC guest's llama-bench rows only (docs/speed.md)
CPU_THREAD_BW = 13.9e9
# the expected relative error of each prediction: the worst error of the fitted (non-aside) rows at these
# constants, rounded up to 5 %, the aside rows checked against it (`benchmarks/speed_accuracy.py fit` prints it and the
# leave-one-out errors, which reach 65 % (generation) and 45 % (prompt): docs/speed.md says which rows);
# it holds for NVIDIA GPUs only (AMD GPUs and runs without a GPU are refused, docs/speed.md)
GEN_ERROR = 0.35
PROMPT_ERROR = 0.25
# a CPU-only generated token's: the same rule on the CPU-only rows (23 %: one 2-vCPU machine's)
CPU_GEN_ERROR = 0.25
# a GPU command whose generated token reads experts from the host (hybrid): the host's share of a stated
# bandwidth is not measured (HOST_BW_FRACTION stays 1.0), and the one run with a stated host bandwidth
# (RTX 2080 + i9-10900X at ~102 GB/s, aside) came out 54 % too fast: its error, rounded up, is stated for
# every hybrid token until rows with known hosts set the share (docs/speed.md, "Limits")
HOST_GEN_ERROR = 0.55
# -----------------------------------------------------------------------------------------------------

# the routings the op-offload copy's constants were measured under: with zero weights every token selects the
# same k experts and a ubatch copies k/E of each host expert tensor; under real routing it copies the experts
# its tokens use. The six published real-routing prompts (DeepSeek-V3.2 on an RTX PRO 6000 Max-Q, gpt-oss-120b
# on an RTX 3090 at -ub 256 to 8192) come out 75 to 91 % too slow at these constants; uniform routing's expected
# bytes overstate what real routers copy (at -ub 256 and 512 they would take the 3090's full PCIe rate longer
# than the whole measured prompt), and a copy model with its own share of the link, fitted on them, puts that
# share above the link and leaves a fitted row 165 % and an aside row 33 % off (docs/speed.md, "Limits";
# `benchmarks/speed_accuracy.py hybrid`): such a prompt is predicted only here
OFFLOAD_MEASURED_ROUTINGS = ("same-experts",)
HOST_READ_UNTIMED = 1 << 20  # host reads below this per token (an embedding row) are not timed
ROUTINGS = ("uniform", "same-experts")
TOOLS = ("llama-server", "llama-bench")  # what times the run: a server's first request, or llama-bench's warm runs


@dataclass(frozen=True)
class Rate:
    """One predicted speed: tokens/s, its expected relative error, and where the time goes (seconds per
    token for generation, per prompt for the prompt), by term."""

    tps: float
    error: float
    seconds: float
    terms: dict[str, float]

    def text(self) -> str:
        return f"~{rounded(self.tps, self.error)} t/s (+-{round(self.error * 100)}%)"

    def json(self) -> dict[str, Any]:
        return {"tps": float(rounded(self.tps, self.error).replace(",", "")), "error": self.error,
                "seconds": self.seconds, "terms": self.terms}


@dataclass(frozen=True)
class Prediction:
    generation: Rate | None
    prompt: Rate | None
    depth: int
    prompt_tokens: int
    routing: str
    assumptions: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # machine figures the prediction needs and nothing gave
    refused: tuple[str, ...] = ()  # what is not modelled (the speed it concerns is not given)

    def json(self) -> dict[str, Any]:
        return {"generation": None if self.generation is None else self.generation.json(),
                "prompt": None if self.prompt is None else self.prompt.json(),
                "depth": self.depth, "prompt_tokens": self.prompt_tokens, "routing": self.routing,
                "assumptions": list(self.assumptions), "missing": list(self.missing), "refused": list(self.refused)}


def rounded(value: float, error: float) -> str:
    """`value` with no more digits than a relative `error` allows: rounded to the power of ten at or
    below value x error (15 at 30 %, not 14.9; 900 for 933 at 30 %; 197 at 5 %), thousands separated.
    The one rule for every printed speed (explain, fit, --optimize's table and choice, the Hub table)."""
    spread = abs(value) * error
    if spread <= 0 or not math.isfinite(spread):
        return f"{value:,.0f}"
    exp = math.floor(math.log10(spread))
    unit = 10.0 ** exp
    r = round(value / unit) * unit
    return f"{r:,.{max(0, -exp)}f}"


def gpus_used(tr: Traffic) -> tuple[str, ...]:
    """The non-host devices the command reads from, copies with or computes on."""
    devs = {d for d in tr.reads if d != HOST} | {d for d in tr.work if d != HOST}
    for c in (*tr.token_copies, *tr.ubatch_copies):
        devs |= {c.src, c.dst} - {HOST}
    return tuple(sorted(devs))


def host_timed(tr: Traffic) -> bool:
    """Whether the host reads enough per generated token to be timed (more than an embedding row)."""
    r = tr.reads.get(HOST)
    return r is not None and r.total >= HOST_READ_UNTIMED


def missing(tr: Traffic, machine: Machine) -> list[str]:
    """The machine figures a prediction of this traffic needs and nothing gave, as 'DEVICE: figure'."""
    out: list[str] = []
    if host_timed(tr) and machine.host.memory_bandwidth is None:
        out.append("host: memory_bandwidth")
    for d in gpus_used(tr):
        g = machine.gpu(d)
        out += [f"{d}: the card (memory_bandwidth, pcie_bandwidth, matrix_flops)"] if g is None else g.missing()
    return out


def _pcie(machine: Machine, src: str, dst: str) -> float:
    """The link a copy crosses: the GPU end's PCIe bandwidth (the slower end's between two GPUs)."""
    rates = [g.pcie_bandwidth.value for d in (src, dst) if d != HOST
             for g in (machine.gpu(d),) if g is not None and g.pcie_bandwidth is not None]
    return min(rates)


def _fig(g: GPU | None, what: str) -> float:
    assert g is not None
    f = getattr(g, what)
    assert f is not None
    return float(f.value)


@dataclass(frozen=True)
class Features:
    """The constant-free quantities the model weighs (what `benchmarks/speed_accuracy.py fit` fits the
    constants on): generation, per token: seconds of GPU reads at each card's peak bandwidth, bytes the
    host reads, seconds of copies at the links' bandwidth; prompt, per prompt: seconds of GPU work at each
    card's peak matrix rate, seconds of op-offload copies at the links' bandwidth, weights copied, seconds
    of the other copies at the links' bandwidth, the host's batch-of-one products' weight bytes."""

    gpu_read_s: float
    host_bytes: int
    token_copy_s: float
    gpu_work_s: float | None  # None: the prompt is not modelled (`refused`)
    offload_s: float
    offload_tensors: int
    ubatch_copy_s: float
    host_prompt_bytes: int
    refused: tuple[str, ...] = ()
    routed_offload: bool = False  # an op-offload copy's bytes depend on the routing (a MUL_MAT_ID's experts)
    gpu_prompt_read_s: float = 0.0  # per prompt: seconds of the GPUs' weight reads at each card's peak bandwidth
    server: bool = True  # llama-server times the run (its first prompt, its sampling per token)

    def generation_s(self, host_rate: float) -> dict[str, float]:
        out = {"fixed": TOKEN_FIXED_S if self.server else 0.0,
               "GPU reads": self.gpu_read_s / GPU_BW_FRACTION}
        if self.host_bytes:
            out["host reads"] = self.host_bytes / host_rate
        if self.token_copy_s:
            out["copies"] = self.token_copy_s
        return out

    def prompt_s(self, host_rate: float) -> dict[str, float] | None:
        if self.gpu_work_s is None:
            return None
        out = {"fixed": PROMPT_FIXED_S if self.server else 0.0, "GPU work": self.gpu_work_s / GPU_MATRIX_FRACTION,
               "GPU weight reads": self.gpu_prompt_read_s / GPU_BW_FRACTION}
        if self.offload_tensors or self.offload_s:
            out["op offload"] = self.offload_s / OFFLOAD_COPY_FRACTION + self.offload_tensors * OFFLOAD_TENSOR_S
        if self.ubatch_copy_s:
            out["copies"] = self.ubatch_copy_s
        if self.host_prompt_bytes and host_rate:
            out["host"] = self.host_prompt_bytes / host_rate
        return out


def features(tr: Traffic, machine: Machine, n_prompt: int, routing: str, tool: str = "llama-server") -> Features:
    """The quantities of `Features` for this traffic on this machine (every figure it needs present:
    `missing` is empty)."""
    server = tool != "llama-bench"
    gpu_read = sum(r.total / _fig(machine.gpu(d), "memory_bandwidth") for d, r in tr.reads.items() if d != HOST)
    host_bytes = tr.reads[HOST].total if host_timed(tr) else 0
    token_copy = sum(c.total / _pcie(machine, c.src, c.dst) for c in tr.token_copies)
    host_work = tr.work.get(HOST)
    if host_work is not None and host_work.matrix and host_work.max_batch > 1:
        why = (f"prompt: the host runs matrix products at a batch of {host_work.max_batch} tokens (below CUDA's "
               "op-offload batch of 32, or without a GPU for them): the host's matrix rate is not modelled")
        return Features(gpu_read, host_bytes, token_copy, None, 0.0, 0, 0.0, 0, (why,), server=server)
    # the prompt's ubatches of T tokens, each's attention at the cells it views, the last one's work at its tokens
    T = tr.n_ubatch
    n_ub = -(-n_prompt // T)
    cells_full = max(tr.ubatch_cells, 1)
    scale_work = scale_attn = 0.0
    for i in range(n_ub):
        tokens = min(T, n_prompt - i * T)
        viewed = max(PAD, -(-(i * T + tokens) // PAD) * PAD)
        scale_work += tokens / T
        scale_attn += tokens / T * min(viewed, cells_full) / cells_full
    work = sum((w.matrix * scale_work + w.attention * scale_attn) / _fig(machine.gpu(d), "matrix_flops")
               for d, w in tr.work.items() if d != HOST)
    offload = other = 0.0
    tensors = 0
    for c in tr.ubatch_copies:
        bw = _pcie(machine, c.src, c.dst)
        offload += (c.weights if routing == "uniform" else c.weights_min) / bw
        tensors += c.tensors
        other += (c.activations + c.inputs) / bw
    host_prompt = host_work.weight_bytes if host_work is not None else 0
    routed = any(c.weights != c.weights_min for c in tr.ubatch_copies)
    # each ubatch's products read their weights once (the experts its tokens select: under uniform routing
    # `Work.weight_bytes`; where every token selects the same k, what a generated token reads there)
    wread = 0.0
    for d, w in tr.work.items():
        if d == HOST:
            continue
        r = tr.reads.get(d)
        b = min(w.weight_bytes, r.total) if routing == "same-experts" and r is not None else w.weight_bytes
        wread += b / _fig(machine.gpu(d), "memory_bandwidth")
    return Features(gpu_read, host_bytes, token_copy, work, n_ub * offload, n_ub * tensors, n_ub * other,
                    n_ub * host_prompt, routed_offload=routed, gpu_prompt_read_s=n_ub * wread, server=server)


def predict(tr: Traffic, machine: Machine, *, prompt_tokens: int | None = None,
            routing: str = "uniform", tool: str = "llama-server", threads: int | None = None) -> Prediction:
    """Prompt and generation tokens/s for this traffic on this machine. The generated token is the one
    at the traffic's depth; the prompt is `prompt_tokens` long (default: the depth, the prompt that fills
    the context to it; at least one ubatch). `routing`: "uniform" (real routers: a ubatch's op offload
    copies the experts its tokens select, expected 1 - (1 - k/E)^T of each tensor) or "same-experts"
    (every token selects the same k: a model of zero weights). `tool`: "llama-server" (a server's first
    prompt, sampling each generated token) or "llama-bench" (warm runs, no sampling). `threads`: the
    engine's threads where no GPU is used (default: the host's cores, llama.cpp's own default)."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing is one of {', '.join(ROUTINGS)}, not {routing!r}")
    if tool not in TOOLS:
        raise ValueError(f"tool is one of {', '.join(TOOLS)}, not {tool!r}")
    n_prompt = prompt_tokens if prompt_tokens is not None else (tr.depth or tr.n_ubatch)
    if n_prompt <= 0:
        raise ValueError(f"the prompt is at least one token, not {n_prompt}")
    refused: list[str] = []
    if any(c.link == "network" for c in (*tr.token_copies, *tr.ubatch_copies)):
        refused.append("RPC servers: the network's bandwidth and latency are not in the machine description")
    amd = [d for d in gpus_used(tr) for g in (machine.gpu(d),) if g is not None and _amd(g)]
    if amd:
        refused.append(f"{', '.join(amd)}: an AMD GPU (ROCm): its per-token and per-ubatch costs are not modelled "
                       "(the RX 7900 XTX rows of the validation table come out up to 60 % too fast; docs/speed.md)")
    if not gpus_used(tr) and not refused:
        return _cpu_only(tr, machine, n_prompt, routing, tool, threads)
    need = () if refused else tuple(missing(tr, machine))
    if refused or need:
        return Prediction(None, None, tr.depth, n_prompt, routing, missing=need, refused=tuple(refused))
    host_rate = (machine.host.memory_bandwidth.value * HOST_BW_FRACTION
                 if machine.host.memory_bandwidth is not None else 0.0)
    f = features(tr, machine, n_prompt, routing, tool)
    gen = f.generation_s(host_rate)
    t_gen = sum(gen.values())
    pp = f.prompt_s(host_rate)
    refused = list(f.refused)
    if pp is not None and f.routed_offload and routing not in OFFLOAD_MEASURED_ROUTINGS:
        pp = None
        refused.append("prompt: its ubatches copy host expert weights to the GPU (op offload) under real routing, "
                       "which is not modelled: the copy rate was measured where every token selects the same experts "
                       "(zero weights); real routers copy fewer experts than uniform routing expects, and the six "
                       "published runs fit no copy model within a stated error (docs/speed.md, Limits)")
    prompt = None if pp is None else Rate(n_prompt / sum(pp.values()), PROMPT_ERROR, sum(pp.values()), pp)
    gen_error = max(GEN_ERROR, HOST_GEN_ERROR) if host_timed(tr) else GEN_ERROR
    return Prediction(Rate(1.0 / t_gen, gen_error, t_gen, gen), prompt, tr.depth, n_prompt, routing,
                      assumptions=tuple(_assumptions(tr, machine, routing)), refused=tuple(refused))


def cpu_rate(machine: Machine, threads: int) -> float:
    """The bytes/s a CPU-only generated token's products read: the host's bandwidth, or its threads'."""
    assert machine.host.memory_bandwidth is not None
    return min(machine.host.memory_bandwidth.value * HOST_BW_FRACTION, threads * CPU_THREAD_BW)


def _cpu_only(tr: Traffic, machine: Machine, n_prompt: int, routing: str, tool: str,
              threads: int | None) -> Prediction:
    """A command without a GPU: generation from the host's bytes at `cpu_rate`; the prompt refused."""
    n = threads if threads is not None else (int(machine.host.cores.value) if machine.host.cores else None)
    need = tuple(m for m, absent in (("host: memory_bandwidth", machine.host.memory_bandwidth is None),
                                     ("host: cores", n is None)) if absent)
    prompt_why = ("prompt: without a GPU the host's matrix rate is not modelled (the validation table's CPU-only "
                  "prompts reached 23-79 GFLOP/s per thread on one loaded 2-vCPU guest: no rate within a stated "
                  "error)")
    if need or n is None:
        return Prediction(None, None, tr.depth, n_prompt, routing, missing=need, refused=(prompt_why,))
    host = tr.reads.get(HOST)
    terms = {"fixed": TOKEN_FIXED_S if tool != "llama-bench" else 0.0,
             "host reads": (host.total if host is not None else 0) / cpu_rate(machine, n)}
    t = sum(terms.values())
    h = machine.host.memory_bandwidth
    assert h is not None
    why = (f"host: memory {number(h.value / 1e9)} GB/s ({h.source}) x {HOST_BW_FRACTION}, or {n} thread(s) x "
           f"{number(CPU_THREAD_BW / 1e9)} GB/s, whichever is less, read by a CPU-only token's products (the thread "
           "rate measured on one 2-vCPU EPYC guest only)")
    # the rows that set CPU_GEN_ERROR were bound by their threads; where the host's bandwidth binds, the
    # share of it a host reaches is not measured (HOST_GEN_ERROR, as for a hybrid token)
    bandwidth_bound = h.value * HOST_BW_FRACTION < n * CPU_THREAD_BW
    error = max(CPU_GEN_ERROR, HOST_GEN_ERROR) if bandwidth_bound else CPU_GEN_ERROR
    return Prediction(Rate(1.0 / t, error, t, terms), None, tr.depth, n_prompt, routing,
                      assumptions=(why,), refused=(prompt_why,))


def _amd(g: GPU) -> bool:
    """Whether a GPU is AMD's (ROCm/HIP): its card row's gfx target, or the name the driver prints."""
    if g.compute is not None:
        return g.compute.startswith("gfx")
    return g.name is not None and any(w in g.name.upper() for w in ("AMD", "RADEON", "INSTINCT"))


def _assumptions(tr: Traffic, machine: Machine, routing: str) -> list[str]:
    out = []
    for d in gpus_used(tr):
        g = machine.gpu(d)
        assert g is not None and g.memory_bandwidth and g.pcie_bandwidth and g.matrix_flops
        out.append(f"{d}{' (' + g.name + ')' if g.name else ''}: memory {number(g.memory_bandwidth.value / 1e9)} GB/s "
                   f"({g.memory_bandwidth.source}) x {GPU_BW_FRACTION} reached per generated token; matrix "
                   f"{number(g.matrix_flops.value / 1e12)} TFLOP/s ({g.matrix_flops.source}) x {GPU_MATRIX_FRACTION} "
                   f"reached by a prompt; PCIe {number(g.pcie_bandwidth.value / 1e9)} GB/s "
                   f"({g.pcie_bandwidth.source}), x {OFFLOAD_COPY_FRACTION} for op-offload copies (measured from "
                   "pageable memory: -ot ...=CPU "
                   "weights; the pinned memory of layers -ngl leaves on the host is not measured)")
    if host_timed(tr):
        h = machine.host.memory_bandwidth
        assert h is not None
        out.append(f"host: memory {number(h.value / 1e9)} GB/s ({h.source}) x {HOST_BW_FRACTION} reached by its expert "
                   "products: the share of a stated bandwidth a host reaches is not measured yet (a datasheet peak "
                   "makes host-bound generation come out too fast; a measured read rate does not)")
    out.append(f"fixed costs: {TOKEN_FIXED_S * 1e3:.1f} ms per generated token and {PROMPT_FIXED_S:.2f} s per prompt "
               "where llama-server times it (its first prompt; none under llama-bench), "
               f"{OFFLOAD_TENSOR_S * 1e3:.2f} ms "
               "per op-offload copy (fitted on the validation table's NVIDIA runs)")
    if routing == "same-experts" and any(c.tensors for c in tr.ubatch_copies):
        out.append("routing: every token selects the same experts (zero weights): a ubatch copies k/E of each host "
                   "expert tensor")
    return out


def for_placement(placement: Placement, settings: MemorySettings, machine: Machine, *, depth: int | None = None,
                  prompt_tokens: int | None = None, routing: str = "uniform") -> Prediction:
    """The prediction for a placement (what `fit` and the Hub quant table have): its traffic at `depth`
    (default: the context) and `predict`; where the traffic is not modelled, a Prediction that says so."""
    from moeconf.traffic import TrafficUnmodelled, traffic

    try:
        tr = traffic(placement, settings, depth)
    except TrafficUnmodelled as e:
        return Prediction(None, None, depth or 0, prompt_tokens or 0, routing, refused=(str(e),))
    return predict(tr, machine, prompt_tokens=prompt_tokens, routing=routing)


def generation_cell(pred: Prediction) -> str:
    """A table cell of predicted generation tokens/s ("~15 (+-35%)"), or "-" where none is predicted."""
    g = pred.generation
    return "-" if g is None else f"~{rounded(g.tps, g.error)} (+-{round(g.error * 100)}%)"
