"""The measured runs of tests/data/speed_runs.json, explained by moeconf as they ran, and the speed
predictor (moeconf/speed.py) on each: its features, predictions and errors, and the fit of its
constants on the rows not set aside (benchmarks/speed_accuracy.py prints both).

A row's model is a shipped manifest or a fixture layout, `"layout": "KEY:field=TYPE,..."`
(moeconf.fixtures.layouts.LAYOUTS[KEY] with those quant fields replaced where the run's file had
another mix); the layout's GGUF header is written under a temporary folder (its data region is a hole).
A GPU figure a row does not state (a published run names its card, not its link or matrix rate) is
the card table's (moeconf/machine_cards.py) where the table has the card; a row whose command moeconf
does not predict (no traffic for its engine, a figure neither gives, a kind of run not modelled)
is kept with the reason (`Case.refused`) and reported as not predicted."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import moeconf.speed as sp
from moeconf.machine import GPU, Figure, Host, Machine

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "tests" / "data" / "speed_runs.json"

# PCIe: GT/s per lane and the line code's payload share, by generation
_PCIE = {3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130)}
_LAYOUT_FIELDS = {"file_type", "expert_type", "expert_down_type", "attn_type"}


def layout_of(spec: str) -> Any:
    """A row's `{"layout": "KEY[:field=TYPE,...]"}`: the fixture layout KEY with those quant fields
    replaced (dataclasses.replace of moeconf.fixtures.LAYOUTS[KEY]); KeyError/ValueError name what is wrong."""
    from moeconf.fixtures import LAYOUTS
    from moeconf.model import ggml

    key, _, fields = spec.partition(":")
    lay = LAYOUTS[key]
    changes: dict[str, str] = {}
    for item in filter(None, fields.split(",")):
        name, _, value = item.partition("=")
        if name not in _LAYOUT_FIELDS:
            raise ValueError(f"{spec}: {name!r} is not a quant field ({sorted(_LAYOUT_FIELDS)})")
        if name == "file_type":
            if value not in ggml.file_type_names().values():
                raise ValueError(f"{spec}: unknown file type {value!r}")
        elif value not in ggml.type_ids():
            raise ValueError(f"{spec}: unknown tensor type {value!r}")
        changes[name] = value
    return dataclasses.replace(lay, **changes) if changes else lay


def pcie_bytes_per_s(spec: str) -> float:
    """'GEN5x16' -> one direction's bytes/s (generation 5, 16 lanes)."""
    gen, _, lanes = spec.removeprefix("GEN").partition("x")
    gt, code = _PCIE[int(gen)]
    return gt * 1e9 * code * int(lanes) / 8


def load_runs(path: Path = RUNS) -> list[dict[str, Any]]:
    with open(path) as f:
        runs: list[dict[str, Any]] = json.load(f)["runs"]
    return runs


def machine_of(row: dict[str, Any], host_bandwidth: float | None = None) -> Machine:
    """The row's machine (GPUs as CUDA0, CUDA1, ...); the host's bandwidth from the row, or `host_bandwidth`
    (bytes/s) where the row's is fitted."""
    from moeconf.machine_cards import CardUnknown, find_card

    m = row["machine"]
    src = f"speed_runs.json {row['id']}"
    gpus = []
    for i, g in enumerate(m["gpus"]):
        try:
            card = find_card(g["name"])
        except CardUnknown:
            card = None
        table = f"card table: {card.key}" if card else ""
        pcie = (Figure(pcie_bytes_per_s(g["pcie"]), f"PCIe {g['pcie']}") if g["pcie"] else
                Figure(pcie_bytes_per_s(f"{card.pcie_gen}x{card.pcie_lanes}"), table) if card else None)
        flops = (Figure(g["matrix_tflops"] * 1e12, src) if g["matrix_tflops"] else
                 Figure(card.matrix_tflops * 1e12, table) if card else None)
        gpus.append(GPU(f"CUDA{i}", g["name"], Figure(g["memory_bandwidth_gbs"] * 1e9, src), pcie, flops,
                        compute=card.compute if card else None))
    h = m["host"]
    bw = h.get("memory_bandwidth_gbs")
    fitted = f"fitted on {h.get('memory_bandwidth_fitted_on')}"
    fig = (Figure(bw * 1e9, src) if bw is not None else
           Figure(host_bandwidth, fitted) if host_bandwidth is not None else None)
    cores = Figure(h["cores"], src) if h.get("cores") else None
    return Machine(tuple(gpus), Host(fig, cores))


@dataclass
class Case:
    row: dict[str, Any]
    traffic: Any
    features: sp.Features | None  # None: not predicted (`refused` says why)
    host_bytes_fitted: bool  # the host's bandwidth is not the row's own: fitted on another row
    refused: tuple[str, ...] = ()  # why a speed of this row is not predicted

    @property
    def group(self) -> str:
        return self.id.split("-", 1)[0]

    @property
    def kind(self) -> str:
        """all-GPU, hybrid (weights read on the host and a GPU) or CPU-only."""
        if not self.row["machine"]["gpus"]:
            return "cpu-only"
        if self.traffic is not None and sp.host_timed(self.traffic):
            return "hybrid"
        return "hybrid" if "cpu" in self.row["command"].lower() and self.traffic is None else "all-gpu"

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def aside(self) -> bool:
        return bool(self.row["aside"])


def model_path(row: dict[str, Any], folder: Path) -> str:
    m = row["model"]
    if "manifest" in m:
        return str(REPO / m["manifest"])
    from moeconf.fixtures.writer import write_layout

    lay = layout_of(m["layout"])
    path = folder / (m["layout"].replace(":", "-").replace(",", "-") + ".gguf")
    if not path.exists():
        write_layout(lay, path)
    return str(path)


def build(row: dict[str, Any], folder: Path) -> Case:
    """The row's command explained on its model, its traffic at the row's depth and the predictor's features."""
    import moeconf
    from moeconf.engines import engine
    from moeconf.engines.settings import read_settings
    from moeconf.model.load import load_inventory
    from moeconf.traffic import TrafficUnmodelled, traffic

    fitted_host = row["machine"]["host"].get("memory_bandwidth_gbs") is None
    if row["engine"] != "llama.cpp":  # its layout may hold quant types only that engine has (IQ2_KL)
        return Case(row, None, None, fitted_host, (f"{row['engine']}: moeconf models llama.cpp's traffic only "
                                                   "(its own kernels, -fmoe, -mla are not modelled)",))
    inv = load_inventory(model_path(row, folder))
    argv = command_argv(row)
    eng = engine(row["engine"])
    ex = moeconf.explain(inv, argv, engine=eng)
    settings = read_settings(argv[1:], eng, binary=argv[0])
    try:
        tr = traffic(ex.placement, settings, row["depth"] or 0)
    except TrafficUnmodelled as e:
        return Case(row, None, None, fitted_host, (str(e),))
    probe = machine_of(row, host_bandwidth=1.0)  # the features do not read the host's rate
    p = sp.predict(tr, probe, prompt_tokens=row["prompt_tokens"] or None, routing=row["routing"], tool=tool_of(row),
                   threads=row["machine"]["host"]["threads"])
    if p.generation is None:
        why = p.refused or tuple(f"the machine figure {m} is given by neither the row nor the card table"
                                 for m in p.missing)
        return Case(row, tr, None, fitted_host, why)
    f = sp.features(tr, probe, row["prompt_tokens"] or tr.n_ubatch, row["routing"], tool_of(row))
    return Case(row, tr, f, fitted_host, p.refused)


def tool_of(row: dict[str, Any]) -> str:
    """What timed the run: llama-bench (warm runs; llama-sweep-bench too) or a server's first request."""
    return "llama-bench" if "bench" in command_argv(row)[0] else "llama-server"


def command_argv(row: dict[str, Any]) -> list[str]:
    """The row's command as words, a published row's note in parentheses left out."""
    text = row["command"].split(" (", 1)[0]
    words = shlex.split(text)
    # a run on a machine without a GPU (a CPU-only build) offloads no layer, whatever -ngl's default
    return [*words, "-ngl", "0"] if not row["machine"]["gpus"] else words


def build_all(folder: Path, rows: Sequence[dict[str, Any]] | None = None) -> list[Case]:
    return [build(r, folder) for r in (rows if rows is not None else load_runs())]


# --- the model with its constants, as numbers (the fit varies them) --------------------------------------
@dataclass(frozen=True)
class Constants:
    token_fixed_s: float
    gpu_bw_fraction: float
    prompt_fixed_s: float
    gpu_matrix_fraction: float
    offload_copy_fraction: float
    offload_tensor_s: float
    cpu_thread_bw: float

    @classmethod
    def module(cls) -> Constants:
        return cls(sp.TOKEN_FIXED_S, sp.GPU_BW_FRACTION, sp.PROMPT_FIXED_S, sp.GPU_MATRIX_FRACTION,
                   sp.OFFLOAD_COPY_FRACTION, sp.OFFLOAD_TENSOR_S, sp.CPU_THREAD_BW)

    def gen_s_without_host(self, f: sp.Features) -> float:
        return ((self.token_fixed_s if f.server else 0.0) + f.gpu_read_s / self.gpu_bw_fraction
                + f.token_copy_s)

    def prompt_s(self, f: sp.Features, host_rate: float) -> float:
        assert f.gpu_work_s is not None
        return ((self.prompt_fixed_s if f.server else 0.0) + f.gpu_work_s / self.gpu_matrix_fraction
                + f.gpu_prompt_read_s / self.gpu_bw_fraction + f.offload_s / self.offload_copy_fraction
                + f.offload_tensors * self.offload_tensor_s + f.ubatch_copy_s
                + (f.host_prompt_bytes / host_rate if host_rate else 0.0))


def host_rates(cases: Sequence[Case], host_fitted: float | None = None) -> dict[str, float]:
    """Each case's host rate (bytes/s, HOST_BW_FRACTION applied): its own figure, or, where the run did not
    record it, the rate fitted on the rows with the constants (`host_fitted` bytes/s, default the row's
    `memory_bandwidth_fitted_gbs`)."""
    out: dict[str, float] = {}
    for c in cases:
        h = c.row["machine"]["host"]
        if c.features is None:
            out[c.id] = 0.0
        elif h.get("memory_bandwidth_gbs") is not None:
            out[c.id] = h["memory_bandwidth_gbs"] * 1e9 * sp.HOST_BW_FRACTION
        else:
            out[c.id] = (host_fitted if host_fitted is not None and c.features.host_bytes
                         else h.get("memory_bandwidth_fitted_gbs", 0.0) * 1e9)
    return out


@dataclass(frozen=True)
class Result:
    id: str
    aside: bool
    pp: float | None  # measured
    tg: float | None
    pp_pred: float | None
    tg_pred: float | None
    group: str = ""
    kind: str = ""

    def err(self, which: str) -> float | None:
        meas, pred = (self.pp, self.pp_pred) if which == "pp" else (self.tg, self.tg_pred)
        return None if meas is None or pred is None else pred / meas - 1.0


def evaluate(cases: Sequence[Case], k: Constants | None = None, host_fitted: float | None = None) -> list[Result]:
    k = k or Constants.module()
    rates = host_rates(cases, host_fitted)
    out = []
    for c in cases:
        f, rate, m = c.features, rates[c.id], c.row["measured"]
        if c.kind == "cpu-only":
            rate = cpu_rate(c, k.cpu_thread_bw)
        if f is None:
            out.append(Result(c.id, c.aside, m.get("pp_tps"), m.get("tg_tps"), None, None, c.group, c.kind))
            continue
        # no generation figure where the host reads experts and its rate is neither the row's nor fitted (a
        # published prompt-only row whose host is not stated)
        tg_pred = (None if f.host_bytes and not rate else
                   1.0 / (k.gen_s_without_host(f) + (f.host_bytes / rate if f.host_bytes else 0.0)))
        # no prompt figure where the row has no prompt (prompt_tokens 0) or the predictor refuses its prompt
        pp_pred = (c.row["prompt_tokens"] / k.prompt_s(f, rate)
                   if f.gpu_work_s is not None and c.row["prompt_tokens"] and not prompt_refused(c) else None)
        out.append(Result(c.id, c.aside, m.get("pp_tps"), m.get("tg_tps"), pp_pred, tg_pred, c.group, c.kind))
    return out


def prompt_refused(c: Case) -> bool:
    """Whether the predictor gives this row no prompt figure (a reason starting 'prompt:')."""
    return any(w.startswith("prompt:") for w in c.refused)


def cpu_rate(c: Case, thread_bw: float) -> float:
    """A CPU-only row's read rate (bytes/s): its host's bandwidth or its threads', whichever is less."""
    h = c.row["machine"]["host"]
    return float(min(h["memory_bandwidth_gbs"] * 1e9 * sp.HOST_BW_FRACTION, (h["threads"] or h["cores"]) * thread_bw))


def fit_cpu_thread_bw(cases: Sequence[Case], start: float) -> float:
    """CPU_THREAD_BW fitted (relative least squares) on the CPU-only rows with a measured generation that
    their threads bind (not the host's bandwidth): classified at `start`, refitted until the set stays."""
    rows = [c for c in cases if c.kind == "cpu-only" and c.features is not None and c.row["measured"].get("tg_tps")]
    bw = start
    for _ in range(10):
        bound_rows = [c for c in rows if cpu_rate(c, bw) < c.row["machine"]["host"]["memory_bandwidth_gbs"] * 1e9
                      * sp.HOST_BW_FRACTION]
        if not bound_rows:
            return bw
        # t = bytes / (threads x R): one unknown 1/R, each equation divided by its t
        eqs = [[(c.features.host_bytes if c.features else 0) / (c.row["machine"]["host"]["threads"] or 1)]
               for c in bound_rows]
        x = _lstsq(eqs, [1.0 / c.row["measured"]["tg_tps"] for c in bound_rows])
        new = 1.0 / x[0]
        if abs(new - bw) < 1e-6 * bw:
            break
        bw = new
    return bw


def summary(results: Sequence[Result], which: str, aside: bool) -> tuple[float, float, int]:
    """(median |error|, worst |error|, rows) over the rows (aside or not) measured and predicted."""
    errs = [abs(e) for r in results if r.aside == aside for e in (r.err(which),) if e is not None]
    return (statistics.median(errs), max(errs), len(errs)) if errs else (math.nan, math.nan, 0)


# --- the fit -------------------------------------------------------------------------------------------------
def _lstsq(rows: list[list[float]], y: list[float]) -> list[float]:
    """Least squares of relative error (each equation divided by its y), by the normal equations."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] / yy ** 2 for r, yy in zip(rows, y, strict=True)) for j in range(n)] for i in range(n)]
    b = [sum(r[i] / yy for r, yy in zip(rows, y, strict=True)) for i in range(n)]
    for i in range(n):  # Gauss-Jordan with partial pivoting
        p = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[p], b[i], b[p] = a[p], a[i], b[p], b[i]
        for r in range(n):
            if r != i and a[i][i]:
                q = a[r][i] / a[i][i]
                a[r] = [x - q * z for x, z in zip(a[r], a[i], strict=True)]
                b[r] -= q * b[i]
    return [b[i] / a[i][i] for i in range(n)]


def fit(cases: Sequence[Case], skip: frozenset[str] = frozenset()) -> tuple[Constants, float | None]:
    """The constants that fit `cases` best (relative least squares), and the host rate (bytes/s) fitted with
    them on the rows whose run did not record it (None: no such row reads from the host): generation's fixed
    cost, GPU fraction (and that host rate); the prompt's fixed cost, GPU matrix fraction, op-offload copy
    fraction and per-copy cost. Rows in `skip` set nothing."""
    k = Constants.module()
    eqs: list[list[float]] = []
    ys: list[float] = []
    for c in cases:
        f, h = c.features, c.row["machine"]["host"]
        if f is None or c.id in skip or not c.row["measured"].get("tg_tps") or c.kind == "cpu-only":
            continue
        t = 1.0 / c.row["measured"]["tg_tps"] - f.token_copy_s
        own = h.get("memory_bandwidth_gbs")
        srv = 1.0 if f.server else 0.0
        if own is not None:
            eqs.append([srv, f.gpu_read_s, 0.0])
            ys.append(t - f.host_bytes / (own * 1e9 * sp.HOST_BW_FRACTION))
        else:
            eqs.append([srv, f.gpu_read_s, float(f.host_bytes)])
            ys.append(t)
    shared = any(e[2] for e in eqs)
    x = _lstsq([e if shared else e[:2] for e in eqs], ys)
    k = dataclasses.replace(k, token_fixed_s=x[0], gpu_bw_fraction=1.0 / x[1])
    host = 1.0 / x[2] if shared else None
    rates = host_rates(cases, host if host is not None else 1.0)
    pp = [c for c in cases if c.row["measured"].get("pp_tps") and c.features is not None
          and c.features.gpu_work_s is not None and c.id not in skip and not prompt_refused(c)]
    feats = [c.features for c in pp if c.features is not None]
    y = [c.row["prompt_tokens"] / c.row["measured"]["pp_tps"] - f.ubatch_copy_s
         - f.gpu_prompt_read_s / k.gpu_bw_fraction
         - (f.host_prompt_bytes / rates[c.id] if f.host_prompt_bytes else 0.0) for c, f in zip(pp, feats, strict=True)]
    cols: list[Callable[[sp.Features], float]] = [lambda f: 1.0 if f.server else 0.0, lambda f: f.gpu_work_s or 0.0,
                                                  lambda f: f.offload_s, lambda f: float(f.offload_tensors)]
    x = _lstsq([[col(f) for col in cols] for f in feats], y)
    thread_bw = fit_cpu_thread_bw([c for c in cases if c.id not in skip], k.cpu_thread_bw)
    return dataclasses.replace(k, prompt_fixed_s=x[0], gpu_matrix_fraction=1.0 / x[1],
                               offload_copy_fraction=1.0 / x[2], offload_tensor_s=x[3], cpu_thread_bw=thread_bw), host


def leave_one_out(cases: Sequence[Case]) -> dict[str, dict[str, float]]:
    """Each non-aside row's error under the constants (and host rate) fitted on the other non-aside rows."""
    train = [c for c in cases if not c.aside]
    out: dict[str, dict[str, float]] = {}
    for c in train:
        k, host = fit(train, frozenset({c.id}))
        mine = next(x for x in evaluate(train, k, host) if x.id == c.id)
        out[c.id] = {w: e for w in ("pp", "tg") for e in (mine.err(w),) if e is not None}
    return out


def bound(errors: Sequence[float]) -> float:
    """The worst |error|, rounded up to 5 %."""
    return math.ceil(max(abs(e) for e in errors) / 0.05 - 1e-9) * 0.05


# --- the op-offload copy under real routing: a model fitted and checked, not used (docs/speed.md "Limits") --------
# Card figures the card table lacks, for this analysis only: the RTX PRO 6000 Blackwell Max-Q is a PCIe 5.0 x16
# card with 752 tensor cores at a 2,288 MHz boost clock (NVIDIA's datasheet), 752 x 256 FLOP x 2.288 GHz = 440.5
# TFLOP/s dense FP16. llama-bench's `--no-op-offload 0` is its default (op offload on); moeconf reads the flag as
# llama-server's valueless one (op offload off), so the analysis leaves it out.
ANALYSIS_CARDS = {"NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": ("GEN5x16", 440.5)}


def as_analysed(row: dict[str, Any]) -> dict[str, Any]:
    """The row as the copy analysis reads it: ANALYSIS_CARDS' figures where the row has none, and
    llama-bench's `--no-op-offload 0` left out."""
    gpus = [{**g, "pcie": g["pcie"] or ANALYSIS_CARDS[g["name"]][0],
             "matrix_tflops": g["matrix_tflops"] or ANALYSIS_CARDS[g["name"]][1]}
            if g["name"] in ANALYSIS_CARDS else g for g in row["machine"]["gpus"]]
    return {**row, "command": row["command"].replace(" --no-op-offload 0", ""),
            "machine": {**row["machine"], "gpus": gpus}}


def real_routing_copy(c: Case) -> bool:
    """A measured prompt whose ubatches copy host experts under real routing (the refused kind)."""
    return (c.features is not None and c.features.gpu_work_s is not None and c.row["routing"] == "uniform"
            and c.features.routed_offload and bool(c.row["measured"].get("pp_tps")))


@dataclass(frozen=True)
class CopyFit:
    """The prompt model with the real-routing copy at its own share of the link: seconds = fixed (server) +
    work / matrix_fraction + (the other terms as moeconf/speed.py) + same-experts copy bytes at the link /
    same_fraction + real-routing copy bytes (uniform routing's expected) at the link / real_fraction +
    tensor_s per weight copied; fitted (relative least squares) on the non-aside prompt rows the predictor
    predicts and the non-aside real-routing rows."""

    prompt_fixed_s: float
    matrix_fraction: float
    same_fraction: float
    real_fraction: float
    tensor_s: float
    errors: dict[str, tuple[bool, float]]  # every prompt row of the fit's kinds: (aside, predicted / measured - 1)

    def seconds(self, c: Case, host_rate: float) -> float:
        f = c.features
        assert f is not None and f.gpu_work_s is not None
        copy = self.real_fraction if real_routing_copy(c) else self.same_fraction
        return ((self.prompt_fixed_s if f.server else 0.0) + f.gpu_work_s / self.matrix_fraction
                + f.gpu_prompt_read_s / sp.GPU_BW_FRACTION + f.offload_s / copy + f.offload_tensors * self.tensor_s
                + f.ubatch_copy_s + (f.host_prompt_bytes / host_rate if f.host_prompt_bytes and host_rate else 0.0))


def copy_fit(cases: Sequence[Case]) -> CopyFit:
    """CopyFit on `cases` (built from `as_analysed` rows)."""
    rows = [c for c in cases if c.features is not None and c.features.gpu_work_s is not None
            and c.row["measured"].get("pp_tps") and (real_routing_copy(c) or not prompt_refused(c))]
    rates = host_rates(rows)
    eqs: list[list[float]] = []
    ys: list[float] = []
    for c in rows:
        f = c.features
        assert f is not None and f.gpu_work_s is not None
        if c.aside:
            continue
        real = real_routing_copy(c)
        eqs.append([1.0 if f.server else 0.0, f.gpu_work_s, 0.0 if real else f.offload_s, f.offload_s if real else 0.0,
                    float(f.offload_tensors)])
        ys.append(c.row["prompt_tokens"] / c.row["measured"]["pp_tps"] - f.ubatch_copy_s
                  - f.gpu_prompt_read_s / sp.GPU_BW_FRACTION
                  - (f.host_prompt_bytes / rates[c.id] if f.host_prompt_bytes and rates[c.id] else 0.0))
    x = _lstsq(eqs, ys)
    k = CopyFit(x[0], 1.0 / x[1], 1.0 / x[2], 1.0 / x[3], x[4], {})
    errors = {c.id: (c.aside, c.row["prompt_tokens"] / k.seconds(c, rates[c.id]) / c.row["measured"]["pp_tps"] - 1.0)
              for c in rows}
    return dataclasses.replace(k, errors=errors)
