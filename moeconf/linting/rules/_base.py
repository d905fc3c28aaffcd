"""What rule modules share: the `Hit` they yield and small helpers over an explanation."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import NamedTuple

from moeconf.linting.model import Context, Severity
from moeconf.model.inventory import Tensor, format_ranges
from moeconf.units import gib

ALWAYS_ACTIVE = ("attn", "shexp", "router", "norm")


class Hit(NamedTuple):
    line: int
    column: int
    message: str
    severity: Severity | None = None  # None: the rule's default


def item_tensors(ctx: Context) -> dict[int, list[Tensor]]:
    """Explanation item index -> the tensors it was the first match for."""
    out: dict[int, list[Tensor]] = defaultdict(list)
    if ctx.explanation is None or ctx.inventory is None:
        return out
    for t in ctx.inventory.tensors:
        k = ctx.explanation.matched_by.get(t.name)
        if k is not None:
            out[k].append(t)
    return out


def where_item(ctx: Context, k: int, within: int = 0) -> tuple[int, int]:
    """Position of explanation item k (its -ot item, or the launch for built-in rules), `within`
    characters into the item."""
    assert ctx.explanation is not None
    raw_index = ctx.explanation.items[k].raw_index
    if raw_index is None:
        return ctx.line, ctx.column
    return ctx.at_item(ctx.invocation.items()[raw_index], within)


def describe(tensors: list[Tensor]) -> str:
    groups = Counter(t.group for t in tensors)
    parts = ", ".join(f"{g} {n}" for g, n in groups.most_common())
    layers = sorted({t.layer for t in tensors if t.layer is not None})
    where = f" in layers {format_ranges(layers)}" if layers else ""
    return f"{len(tensors)} tensors ({parts}){where}, {gib(sum(t.nbytes for t in tensors))} GiB"


QUOTE_LIMIT = 120


def q(text: str) -> str:
    """A pattern or item quoted as the user wrote it (no repr escaping of backslashes); one longer
    than QUOTE_LIMIT is shown by its start and end (the finding's column points into it)."""
    if len(text) > QUOTE_LIMIT:
        return f"'{text[:60]}\u2026{text[-40:]}' ({len(text):,} chars)"
    return f"'{text}'"


def qfix(text: str) -> str:
    """A replacement the user is told to write: always whole, however long."""
    return f"'{text}'"


def matches(pattern: str) -> Callable[[str], bool] | None:
    """ECMAScript search (as the engines' std::regex), or None if the pattern does not compile
    or cannot be proved cheap to match (its time may explode: slow-regex and the explanation,
    which match it under a time limit, say so; rules that test names one by one skip it)."""
    from moeconf.engines.regex import check_regex, provably_cheap
    from moeconf.engines.simulate import ecmascript_matcher

    if check_regex(pattern) is not None or not provably_cheap(pattern):
        return None
    try:
        return ecmascript_matcher(pattern)
    except Exception:  # regress raises RegressError, a plain Exception subclass
        return None


def explanation_index(ctx: Context) -> dict[int, int]:
    """Raw item index (Invocation.items()) -> explanation item index."""
    assert ctx.explanation is not None
    return {it.raw_index: k for k, it in enumerate(ctx.explanation.items) if it.raw_index is not None}


def created(ctx: Context) -> list[Tensor]:
    assert ctx.explanation is not None and ctx.inventory is not None
    return [t for t in ctx.inventory.tensors if ctx.explanation.placement.devices[t.name] is not None]


def takes_if(ctx: Context, k: int, pattern: str) -> list[Tensor]:
    """The tensors explanation item k would take if its pattern were `pattern` (every other item
    unchanged: a tensor an earlier item takes stays with it)."""
    assert ctx.explanation is not None
    m = matches(pattern)
    if m is None:
        return []
    by = ctx.explanation.matched_by
    return [t for t in created(ctx) if m(t.name) and (by.get(t.name) is None or by[t.name] >= k)]


def always_active_moved_to_cpu(ctx: Context, k: int) -> list[Tensor]:
    """Tensors used on every token (attention, shared experts, router, norms, dense FFN) that
    item k sends to CPU although their default is a GPU."""
    assert ctx.explanation is not None
    it = ctx.explanation.items[k]
    if it.device != "CPU":
        return []
    pl = ctx.explanation.placement
    return [t for t in item_tensors(ctx).get(k, []) if t.group in (*ALWAYS_ACTIVE, "dense")
            and pl.defaults[t.name] not in (None, "CPU")]


def implicit_catch_all(ctx: Context, k: int) -> bool:
    """Item k sends always-active tensors to CPU without naming them or any block: a catch-all
    (`ffn.*=CPU`, `.*=CPU`) whose author meant the experts."""
    from moeconf.linting.rules._patterns import names_always_active, names_blocks

    assert ctx.explanation is not None
    pattern = ctx.explanation.items[k].pattern
    return (not names_always_active(pattern) and not names_blocks(pattern)
            and bool(always_active_moved_to_cpu(ctx, k)))


def regex_problems(ctx: Context, kind: str) -> Iterator[Hit]:
    """Items whose pattern std::regex would not compile, for one kind of problem."""
    from moeconf.engines.regex import check_regex, misreadings

    for item in ctx.invocation.items():
        if item.pattern is None:
            continue
        if kind == "misread":
            for m in misreadings(item.pattern) if check_regex(item.pattern) is None else ():
                yield Hit(*ctx.at_item(item, m.offset), f"{q(item.pattern)}: {m.message}")
            continue
        p = check_regex(item.pattern)
        if p and p.kind == kind:
            yield Hit(*ctx.at_item(item, p.offset), f"{q(item.pattern)}: {p.message}; the model load will fail")


def moved_to_cpu(ctx: Context, what: str, groups: tuple[str, ...], why: str) -> Iterator[Hit]:
    """Items that send tensors of `groups` from a GPU (their default) to the CPU. Catch-alls
    that do it without naming them are overbroad-catch-all's."""
    assert ctx.explanation is not None
    pl = ctx.explanation.placement
    sim = Simulation(ctx, [t.name for t in created(ctx)])
    for k, tensors in item_tensors(ctx).items():
        it = ctx.explanation.items[k]
        moved = [t for t in tensors if it.device == "CPU" and t.group in groups
                 and pl.defaults[t.name] not in (None, "CPU")]
        if moved and not (it.raw_index is not None and implicit_catch_all(ctx, k)):
            how = _keep_only_experts(ctx, k, moved, sim) if it.raw_index is not None else ""
            yield Hit(*where_item(ctx, k), f"{q(it.pattern)} sends {what} to CPU: {describe(moved)}; {why}{how}")


def _keep_only_experts(ctx: Context, k: int, moved: list[Tensor], sim: Simulation) -> str:
    """The edit that keeps `moved` (always-active or dense tensors item k sends to the CPU) where
    they belong and every routed expert where the line puts it, checked by simulation: remove the
    item where later items already send its experts to the CPU (or it matches none), else narrow it
    to the experts (`..._exps`); "" where neither does both."""
    assert ctx.explanation is not None
    if not sim.exact:
        return ""
    it = ctx.explanation.items[k]
    experts = [t.name for t in created(ctx) if t.group == "experts"]
    n = len(ctx.explanation.items)

    def works(devices: dict[str, str | None]) -> bool:
        return (all(devices[t.name] == ctx.explanation.placement.defaults[t.name] for t in moved)
                and all(devices[e] == sim.base[e] for e in experts))

    without, _ = sim.run([j for j in range(n) if j != k])
    if works(without):
        mine = [e for e in experts if ctx.explanation.matched_by.get(e) == k]
        return (" (remove it: the routed experts it matches go to the CPU through the items after it)" if mine else
                " (remove it: it matches no routed expert)")
    fix = re.sub(r"ffn(_?\.\*|\.|_)$", "ffn_.*_exps", it.pattern)
    if fix != it.pattern and matches(fix) is not None and works(sim.run(list(range(n)), {k: fix})[0]):
        return f" (write {qfix(fix)} to move only the routed experts)"
    return ""


class Simulation:
    """The engine's first-match rule over the line's items, to check an edit (items reordered,
    removed, or a pattern replaced) before it is advised (`exact`: the simulation gives the
    explanation's own placement; else no advice is computed from it)."""

    def __init__(self, ctx: Context, names: list[str]) -> None:
        assert ctx.explanation is not None
        self.ctx, self.names = ctx, names
        self.items = ctx.explanation.items
        self.matchers = [matches(it.pattern) for it in self.items]
        self.defaults = ctx.explanation.placement.defaults
        order = list(range(len(self.items)))
        self.base, self.hits = self.run(order)
        placed = ctx.explanation.placement.devices
        self.exact = (all(m is not None for m in self.matchers)
                      and all(self.base[n] == placed[n] for n in names))

    def run(self, order: list[int], patterns: dict[int, str] | None = None
            ) -> tuple[dict[str, str | None], Counter[int]]:
        matchers = {**dict(enumerate(self.matchers)), **{j: matches(p) for j, p in (patterns or {}).items()}}
        out: dict[str, str | None] = {}
        hits: Counter[int] = Counter()
        for n in self.names:
            out[n] = self.defaults.get(n)
            for j in order:
                m = matchers[j]
                if m is not None and m(n):
                    out[n] = self.items[j].device
                    hits[j] += 1
                    break
        return out, hits


def item_text(ctx: Context, k: int) -> str:
    assert ctx.explanation is not None
    it = ctx.explanation.items[k]
    if it.raw_index is None:
        return f"{it.origin} ({it.pattern}={it.device})"
    return f"{it.pattern}={it.device}"
