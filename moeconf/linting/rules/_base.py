"""What rule modules share: the `Hit` they yield and small helpers over an explanation."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import NamedTuple

from moeconf.engines import HOST
from moeconf.engines.cmdline import RawItem
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
    """Explanation item index -> the tensors it was the first match for (computed once per
    invocation: do not modify)."""
    if ctx.explanation is None or ctx.inventory is None:
        return defaultdict(list)
    got: dict[int, list[Tensor]] | None = ctx.cache.get("item_tensors")
    if got is None:
        got = defaultdict(list)
        for t in ctx.inventory.tensors:
            k = ctx.explanation.matched_by.get(t.name)
            if k is not None:
                got[k].append(t)
        ctx.cache["item_tensors"] = got
    return got


def raw_items(ctx: Context) -> list[RawItem]:
    """`ctx.invocation.items()`, split once per invocation (rules index it for every finding)."""
    got: list[RawItem] | None = ctx.cache.get("raw_items")
    if got is None:
        got = ctx.cache["raw_items"] = ctx.invocation.items()
    return got


def where_item(ctx: Context, k: int, within: int = 0) -> tuple[int, int]:
    """Position of explanation item k (its -ot item, or the launch for built-in rules), `within`
    characters into the item."""
    assert ctx.explanation is not None
    raw_index = ctx.explanation.items[k].raw_index
    if raw_index is None:
        return ctx.line, ctx.column
    return ctx.at_item(raw_items(ctx)[raw_index], within)


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
    """The tensors the engine creates, in inventory order (computed once per invocation: do not
    modify)."""
    assert ctx.explanation is not None and ctx.inventory is not None
    got: list[Tensor] | None = ctx.cache.get("created")
    if got is None:
        devices = ctx.explanation.placement.devices
        got = ctx.cache["created"] = [t for t in ctx.inventory.tensors if devices[t.name] is not None]
    return got


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
    if it.device != HOST:
        return []
    pl = ctx.explanation.placement
    return [t for t in item_tensors(ctx).get(k, []) if t.group in (*ALWAYS_ACTIVE, "dense")
            and pl.defaults[t.name] not in (None, HOST)]


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
    for k, tensors in item_tensors(ctx).items():
        it = ctx.explanation.items[k]
        moved = [t for t in tensors if it.device == HOST and t.group in groups
                 and pl.defaults[t.name] not in (None, HOST)]
        if moved and not (it.raw_index is not None and implicit_catch_all(ctx, k)):
            how = _keep_only_experts(ctx, k, moved, simulation(ctx)) if it.raw_index is not None else ""
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
    experts = sim.experts()
    defaults = ctx.explanation.placement.defaults

    def works(changed: dict[str, int | None]) -> bool:
        return (all(sim.device(t.name, changed) == defaults[t.name] for t in moved)
                and all(sim.device(e, changed) == sim.base[e] for e in changed if e in experts))

    if works(sim.without(k)):
        mine = any(t.group == "experts" for t in item_tensors(ctx).get(k, []))
        return (" (remove it: the routed experts it matches go to the CPU through the items after it)" if mine else
                " (remove it: it matches no routed expert)")
    fix = re.sub(r"ffn(_?\.\*|\.|_)$", "ffn_.*_exps", it.pattern)
    if fix != it.pattern and matches(fix) is not None and works(sim.replaced(k, fix)):
        return f" (write {qfix(fix)} to move only the routed experts)"
    return ""


def simulation(ctx: Context) -> Simulation:
    """The line's Simulation over the created tensors, built once per invocation."""
    got: Simulation | None = ctx.cache.get("simulation")
    if got is None:
        got = ctx.cache["simulation"] = Simulation(ctx, [t.name for t in created(ctx)])
    return got


class Simulation:
    """The engine's first-match rule over the line's items, to check an edit (items reordered,
    removed, or a pattern replaced) before it is advised (`exact`: the simulation gives the
    explanation's own placement; else no advice is computed from it).

    Each distinct pattern is matched once over the names; each name keeps its first and second
    matching item, so an edit of one item recomputes only the names that item matches or takes
    (the edits return the names whose first match changes, with the new one): the work is linear
    in the number of items, not items times edits."""

    def __init__(self, ctx: Context, names: list[str]) -> None:
        assert ctx.explanation is not None
        self.ctx, self.names = ctx, names
        self.items = ctx.explanation.items
        self.matchers = [matches(it.pattern) for it in self.items]
        self.defaults = ctx.explanation.placement.defaults
        self._sets: dict[str, list[str]] = {}  # pattern -> the names it matches, in order
        self.first: dict[str, int | None] = dict.fromkeys(names)
        self.second: dict[str, int | None] = dict.fromkeys(names)
        self._taken: dict[int, list[str]] = defaultdict(list)
        for j, it in enumerate(self.items):
            if self.matchers[j] is None:
                continue
            for n in self._matched(it.pattern):
                if self.first[n] is None:
                    self.first[n] = j
                    self._taken[j].append(n)
                elif self.second[n] is None:
                    self.second[n] = j
        self.base = {n: self.device(n, {}) for n in names}
        self.hits: Counter[int] = Counter({j: len(ns) for j, ns in self._taken.items()})
        placed = ctx.explanation.placement.devices
        self.exact = (all(m is not None for m in self.matchers)
                      and all(self.base[n] == placed[n] for n in names))
        self._experts: frozenset[str] | None = None

    def _matched(self, pattern: str) -> list[str]:
        got = self._sets.get(pattern)
        if got is None:
            m = matches(pattern)
            got = self._sets[pattern] = [n for n in self.names if m(n)] if m is not None else []
        return got

    def matched(self, j: int) -> list[str]:
        """The names item j matches, in order ([] when its pattern is not simulated)."""
        return self._matched(self.items[j].pattern) if self.matchers[j] is not None else []

    def experts(self) -> frozenset[str]:
        if self._experts is None:
            assert self.ctx.inventory is not None
            by_name = self.ctx.inventory.by_name
            self._experts = frozenset(n for n in self.names if by_name[n].group == "experts")
        return self._experts

    def device(self, name: str, changed: dict[str, int | None]) -> str | None:
        """Where `name` goes after an edit (`changed`: new first matches)."""
        j = changed[name] if name in changed else self.first[name]
        device: str | None = self.defaults.get(name) if j is None else self.items[j].device
        return device

    def hits_after(self, changed: dict[str, int | None]) -> dict[int, int]:
        """The items whose count of first matches an edit changes, with the new count."""
        out: dict[int, int] = {}
        for n, j in changed.items():
            old = self.first[n]
            if old is not None:
                out[old] = out.get(old, self.hits[old]) - 1
            if j is not None:
                out[j] = out.get(j, self.hits[j]) + 1
        return out

    def without(self, k: int) -> dict[str, int | None]:
        """Item k removed: the names it took go to their next match."""
        return {n: self.second[n] for n in self._taken.get(k, [])}

    def replaced(self, k: int, pattern: str) -> dict[str, int | None]:
        """Item k's pattern replaced by `pattern` (which `matches` accepts)."""
        out: dict[str, int | None] = {}
        now = self._matched(pattern)
        for n in now:
            f = self.first[n]
            if f is None or f > k:
                out[n] = k
        keep = set(now)
        for n in self._taken.get(k, []):
            if n not in keep:
                out[n] = self.second[n]
        return out

    def moved_before(self, k: int, j0: int) -> dict[str, int | None]:
        """Item k moved to just before item j0 (the others keep their order)."""
        out: dict[str, int | None] = {}
        if j0 < k:
            for n in self.matched(k):
                f = self.first[n]
                if f is not None and j0 <= f != k:
                    out[n] = k
        elif j0 > k:
            for n in self._taken.get(k, []):
                s = self.second[n]
                if s is not None and s < j0:
                    out[n] = s
        return out


def item_text(ctx: Context, k: int) -> str:
    assert ctx.explanation is not None
    it = ctx.explanation.items[k]
    if it.raw_index is None:
        return f"{it.origin} ({it.pattern}={it.device})"
    return f"{it.pattern}={it.device}"
