"""What rule modules share: the `Hit` they yield and small helpers over an explanation."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import NamedTuple

from moeconf.linting.model import Context, Severity
from moeconf.model.inventory import Tensor, format_ranges
from moeconf.report.inventory import gib

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


def where_item(ctx: Context, k: int) -> tuple[int, int]:
    """Position of explanation item k (its -ot item, or the launch for built-in rules)."""
    assert ctx.explanation is not None
    raw_index = ctx.explanation.items[k].raw_index
    if raw_index is None:
        return ctx.line, ctx.column
    return ctx.at_item(ctx.invocation.items()[raw_index])


def describe(tensors: list[Tensor]) -> str:
    groups = Counter(t.group for t in tensors)
    parts = ", ".join(f"{g} {n}" for g, n in groups.most_common())
    layers = sorted({t.layer for t in tensors if t.layer is not None})
    where = f" in layers {format_ranges(layers)}" if layers else ""
    return f"{len(tensors)} tensors ({parts}){where}, {gib(sum(t.nbytes for t in tensors))} GiB"


def regex_problems(ctx: Context, kind: str) -> Iterator[Hit]:
    """Items whose pattern std::regex would not compile, for one kind of problem."""
    from moeconf.engines.regex import check_regex

    for item in ctx.invocation.items():
        if item.pattern is None:
            continue
        p = check_regex(item.pattern)
        if p and p.kind == kind:
            yield Hit(*ctx.at_item(item, p.offset), f"{item.pattern!r}: {p.message}; the model load will fail")


def moved_to_cpu(ctx: Context, what: str, groups: tuple[str, ...], why: str) -> Iterator[Hit]:
    """Items that send tensors of `groups` from a GPU (their default) to the CPU."""
    assert ctx.explanation is not None
    pl = ctx.explanation.placement
    for k, tensors in item_tensors(ctx).items():
        it = ctx.explanation.items[k]
        moved = [t for t in tensors if it.device == "CPU" and t.group in groups
                 and pl.defaults[t.name] not in (None, "CPU")]
        if moved:
            yield Hit(*where_item(ctx, k), f"{it.pattern!r} sends {what} to CPU: {describe(moved)}; {why}")


def item_text(ctx: Context, k: int) -> str:
    assert ctx.explanation is not None
    it = ctx.explanation.items[k]
    return f"{it.pattern}={it.device}"
