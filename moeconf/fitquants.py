"""`moeconf fit OWNER/REPO` (no tag): every quant of a Hugging Face repo, solved for the same
budgets, in one table. Quants are the repo's models as llama.cpp groups files (moeconf.hub.names:
one per first shard, split files and folders per quant included); only their headers are read
(every shard of every quant at once)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from moeconf.engines import HOST, Engine
from moeconf.errors import MoeconfError
from moeconf.hub import names, store
from moeconf.hub.ref import RemoteRef
from moeconf.hub.remote import Listing, Progress, list_repo, load_resolved, resolve
from moeconf.model.inventory import Inventory
from moeconf.units import GIB as GiB
from moeconf.units import MIB as MiB

if TYPE_CHECKING:
    from moeconf.fit import Budget
    from moeconf.machine import Machine


Policy = Literal["first", "last"]  # as moeconf.fit's (imported only when a quant is solved, not from the cache)


@dataclass(frozen=True)
class QuantRow:
    label: str
    ref: RemoteRef  # how the engine's -hf names it
    files: tuple[str, ...]
    size: int  # bytes of every shard (the listing's sizes, else the tensors' bytes)
    argv: tuple[str, ...] | None  # the command, when it fits
    why: str | None  # why it does not fit, or could not be read
    experts_on_gpu: int = 0  # bytes of routed experts on the GPUs
    experts_total: int = 0
    host_read_per_token: int = 0  # bytes of host weights read per generated token
    headroom: tuple[tuple[str, int], ...] = ()  # (device, budget - predicted total)
    # predicted generation tokens/s and its relative error (moeconf/speed.py), where the machine is known;
    # not part of the solved row's cache (it depends on the machine, not on the solve)
    generation: tuple[float, float] | None = None
    generation_why: str | None = None  # why no generation speed is predicted, where a machine was given

    @property
    def fits(self) -> bool:
        return self.argv is not None

    def json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "quant": self.label, "hf": self.ref.display, "files": list(self.files), "size": self.size,
            "fits": self.fits, "why": self.why, "experts_on_gpu": self.experts_on_gpu,
            "experts_total": self.experts_total, "host_read_per_token": self.host_read_per_token,
            "headroom": dict(self.headroom), "argv": list(self.argv) if self.argv else None}
        if self.generation is not None:
            out["generation"] = {"tps": self.generation[0], "error": self.generation[1]}
        if self.generation_why is not None:
            out["generation_not_predicted"] = self.generation_why
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any], ref: RemoteRef) -> QuantRow:
        return cls(str(d["quant"]), ref, tuple(d["files"]), int(d["size"]),
                   tuple(d["argv"]) if d["argv"] is not None else None, d["why"], int(d["experts_on_gpu"]),
                   int(d["experts_total"]), int(d["host_read_per_token"]),
                   tuple((str(k), int(v)) for k, v in d["headroom"].items()))


@dataclass(frozen=True)
class QuantTable:
    repo: str
    commit: str
    rows: tuple[QuantRow, ...]

    @property
    def largest_fitting(self) -> QuantRow | None:
        fitting = [r for r in self.rows if r.fits]
        return max(fitting, key=lambda r: r.size) if fitting else None

    def json(self) -> dict[str, object]:
        best = self.largest_fitting
        return {"repo": self.repo, "commit": self.commit, "quants": [r.json() for r in self.rows],
                "largest_fitting": best.label if best else None}


def host_read_per_token(inv: Inventory, devices: dict[str, str | None]) -> int:
    """Bytes of weights in host memory that one generated token reads: a routed-expert tensor on
    the CPU by the share of experts a token uses (expert_used_count / expert_count), every other
    tensor on the CPU whole, except the token embeddings (one row a token)."""
    md = inv.metadata
    share = (md.expert_used_count or 0) / md.expert_count if md.expert_count else 1.0
    total = 0.0
    for t in inv.tensors:
        if devices.get(t.name) != HOST or t.base == "token_embd":
            continue
        total += t.nbytes * share if t.group == "experts" else t.nbytes
    return int(total)


def predicted_generation(row: QuantRow, inv: Inventory, eng: Engine, machine: Machine) -> QuantRow:
    """The row with its command's predicted generation tokens/s on `machine` (moeconf/speed.py; at the
    command's context), where the command fits and the prediction is given."""
    if row.argv is None:
        return row
    from dataclasses import replace

    from moeconf.explanation import explain
    from moeconf.memory import read_settings
    from moeconf.speed import for_placement, rounded

    argv = list(row.argv)
    pred = for_placement(explain(inv, eng, argv).placement, read_settings(argv[1:], eng, {}, binary=argv[0]), machine)
    g = pred.generation
    if g is None:
        why = ("the machine description lacks " + ", ".join(pred.missing) if pred.missing
               else "; ".join(pred.refused) or "not predicted")
        return replace(row, generation_why=why)
    return replace(row, generation=(float(rounded(g.tps, g.error).replace(",", "")), g.error))


def _row(q: names.Quant, ref: RemoteRef, lst: Listing, inv: Inventory | MoeconfError, eng: Engine,
         budgets: Sequence[tuple[str, int]], user_argv: Sequence[str], plan_dir: str, reserve: int, policy: Policy,
         split: bool, ram: int | None) -> QuantRow:
    sizes = [lst.sizes.get(f) for f in q.files]
    size = sum(s for s in sizes if s is not None) if all(s is not None for s in sizes) else 0
    if isinstance(inv, MoeconfError):
        return QuantRow(q.tag, ref, q.files, size, None, f"not read: {inv}")
    key = _solve_key(lst, q, eng, budgets, user_argv, plan_dir, reserve, policy, split, ram)
    hit = store.get_solved(key)
    if hit is not None:
        try:
            return QuantRow.from_json(hit, ref)
        except (KeyError, TypeError, ValueError):
            pass
    from moeconf.fit import Budget

    row = _solve(q, ref, size, inv, eng, [Budget(d, n) for d, n in budgets], user_argv, plan_dir, reserve, policy,
                 split, ram)
    if not row.why or not row.why.startswith("not read"):
        store.put_solved(key, row.json())
    return row


def _solve(q: names.Quant, ref: RemoteRef, size: int, inv: Inventory, eng: Engine, budgets: Sequence[Budget],
           user_argv: Sequence[str], plan_dir: str, reserve: int, policy: Policy, split: bool,
           ram: int | None) -> QuantRow:
    from moeconf.fit import fit

    size = size or inv.total_bytes()
    experts_total = inv.total_bytes(t for t in inv.tensors if t.group == "experts")
    try:
        res = fit(inv, eng, budgets, user_argv, model_path=ref.display, plan_dir=plan_dir, reserve=reserve,
                  policy=policy, split=split, ram=ram)
    except MoeconfError as e:
        return QuantRow(q.tag, ref, q.files, size, None, e.message.removeprefix("does not fit: "),
                        experts_total=experts_total)
    devices = res.compiled.placement.devices
    on_gpu = sum(t.nbytes for t in inv.tensors if t.group == "experts" and devices[t.name] not in (None, HOST))
    room = [(b.device, b.size - res.memory.devices[b.device].total) for b in budgets if b.device in res.memory.devices]
    if ram is not None:
        room.append((HOST, ram - res.memory.devices[HOST].total))
    return QuantRow(q.tag, ref, q.files, size, res.argv, None, on_gpu, experts_total,
                    host_read_per_token(inv, devices), tuple(room))


_CODE_HASH: list[str] = []


def _code_hash() -> str:
    """A digest of moeconf's own source: a solved row is reused only by the code that solved it."""
    if not _CODE_HASH:
        import hashlib
        import os

        root = os.path.dirname(os.path.abspath(__file__))
        h = hashlib.sha256()
        for dirpath, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".py", ".lark", ".json")):
                    with open(os.path.join(dirpath, f), "rb") as fh:
                        h.update(f.encode() + b"\0" + fh.read())
        _CODE_HASH.append(h.hexdigest())
    return _CODE_HASH[0]


def _solve_key(lst: Listing, q: names.Quant, eng: Engine, budgets: Sequence[tuple[str, int]], user_argv: Sequence[str],
               plan_dir: str, reserve: int, policy: Policy, split: bool, ram: int | None) -> str:
    """Everything a quant's row depends on: the code, the repo's commit and files, the engine, the
    budgets and flags (the header itself is fixed by the commit)."""
    from moeconf.hub.remote import endpoint

    return json.dumps([_code_hash(), endpoint(), lst.repo, lst.commit, list(q.files), eng.name, eng.version,
                       [list(b) for b in budgets], list(user_argv), plan_dir, reserve, policy, split, ram])


def fit_quants(repo: str, eng: Engine, budgets: Sequence[tuple[str, int]], user_argv: Sequence[str], *, plan_dir: str,
               reserve: int, policy: Policy = "first", split: bool = True, ram: int | None = None,
               progress: Progress | None = None, machine: Machine | None = None) -> QuantTable:
    """Every quant of `repo` solved for the budgets; with `machine`, each fitting command's predicted
    generation tokens/s too (a column of the table)."""
    lst = list_repo(repo)
    quants = names.quants(lst.files)
    if not quants:
        raise MoeconfError(f"{repo} has no GGUF model file")
    refs = []
    for q in quants:
        tag = names.selector_tag(lst.files, q.primary)
        refs.append(RemoteRef(repo=repo, tag=tag) if tag else RemoteRef(repo=repo, file=q.primary))
    done = [0]
    lock = threading.Lock()

    def read(ref: RemoteRef) -> Inventory | MoeconfError:
        inv: Inventory | MoeconfError
        try:
            inv = load_resolved(resolve(ref, lst))
        except MoeconfError as e:
            inv = e
        from moeconf.hub.fetch import STATS

        with lock:
            done[0] += 1
            if progress:
                progress(f"{done[0]}/{len(refs)} quants read ({STATS.requests} requests, "
                         f"{STATS.bytes / MiB:.1f} MiB)")
        return inv

    # each quant is solved here as soon as its headers arrive, while the others are still read
    rows: list[QuantRow | None] = [None] * len(refs)
    with ThreadPoolExecutor(max_workers=min(8, len(refs))) as pool:
        futures = {pool.submit(read, ref): i for i, ref in enumerate(refs)}
        for fut in as_completed(futures):
            i = futures[fut]
            inv = fut.result()
            row = _row(quants[i], refs[i], lst, inv, eng, budgets, user_argv, plan_dir, reserve, policy, split, ram)
            rows[i] = (predicted_generation(row, inv, eng, machine)
                       if machine is not None and not isinstance(inv, MoeconfError) else row)
    return QuantTable(repo, lst.commit, tuple(r for r in rows if r is not None))


def render_table(table: QuantTable) -> str:
    """The table, then the command of each quant that fits (the largest marked *)."""
    import shlex

    best = table.largest_fitting
    devs = [d for d, _ in table.rows[0].headroom] if table.rows and table.rows[0].headroom else []
    for r in table.rows:
        if r.headroom:
            devs = [d for d, _ in r.headroom]
            break
    speed = any(r.generation is not None for r in table.rows)
    head = ["", "quant", "size GiB", "fits", *[f"{d} free GiB" for d in devs], "experts on GPU", "host GiB/token",
            *(["generation t/s"] if speed else [])]
    rows: list[list[str]] = []
    for r in table.rows:
        mark = "*" if best is r else ""
        if r.fits:
            room = dict(r.headroom)
            pct = 100 * r.experts_on_gpu / r.experts_total if r.experts_total else 0
            cell = ([] if not speed else ["-"] if r.generation is None else
                    [f"~{r.generation[0]:,g} (+-{round(r.generation[1] * 100)}%)"])
            rows.append([mark, r.label, f"{r.size / GiB:.1f}", "yes", *[f"{room[d] / GiB:.1f}" for d in devs],
                         f"{r.experts_on_gpu / GiB:.1f} GiB ({pct:.0f}%)", f"{r.host_read_per_token / GiB:.2f}", *cell])
        else:
            rows.append([mark, r.label, f"{r.size / GiB:.1f}" if r.size else "?", "no",
                         *["" for _ in devs], "", "", *([""] if speed else [])])
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    right = {2, *range(4, 4 + len(devs)), 5 + len(devs), *([len(head) - 1] if speed else [])}
    lines = [f"{table.repo} at {table.commit[:12]}: {len(table.rows)} quant(s)", ""]
    for row in [head, *rows]:
        lines.append("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(
            zip(row, widths, strict=True))).rstrip())
    lines.append("")
    if best is not None:
        lines.append(f"* the largest quant that fits: {best.label}")
    else:
        lines.append("no quant fits these budgets")
    lines.append("")
    for r in table.rows:
        if r.argv is not None:
            lines.append(f"{r.label}: {shlex.join(r.argv)}")
    unpredicted = [r for r in table.rows if r.generation_why]
    if unpredicted:
        lines.append("")
        for r in unpredicted:
            lines.append(f"{r.label}: generation t/s not predicted: {r.generation_why}")
    not_fitting = [r for r in table.rows if not r.fits]
    if not_fitting:
        lines.append("")
        for r in not_fitting:
            lines.append(f"{r.label}: does not fit: {r.why}")
    return "\n".join(lines) + "\n"
