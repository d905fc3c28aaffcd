"""Parse placement rules (`experts layers 31.. -> cpu`) with the lark grammar in `plan.lark`.

A syntax error shows the rule with a caret under the problem. Names are checked later, against
the model (`moeconf.resolve`), where "did you mean" suggestions can use the model's own names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from moeconf.errors import PlanError


@dataclass(frozen=True)
class Span:
    start: int  # 0-based offsets into the rule text
    end: int


@dataclass(frozen=True)
class LayerSet:
    """A rule's layer set. `spans` are (lo, hi) with None for an open end (`31..`, `..30`)."""

    form: Literal["list", "first", "last", "kind"]
    spans: tuple[tuple[int | None, int | None], ...] = ()
    count: int = 0
    kind: Literal["moe", "dense", "nextn", "recurrent"] | None = None
    span: Span = Span(0, 0)


@dataclass(frozen=True)
class Rule:
    """One parsed rule. `targets` are the words before the layer set (groups, tensor kinds,
    `layer`, `all`); empty when the rule names only layers (then it means `layer`)."""

    text: str
    index: int
    targets: tuple[str, ...]
    target_spans: tuple[Span, ...]
    layers: LayerSet | None
    device: str  # where the selected tensors go; for a fill rule, the last device (the rest)
    device_span: Span
    # a fill rule (`experts -> gpu, gpu1, cpu`): the devices filled first, in order, up to their budgets
    fill: tuple[str, ...] = ()
    fill_spans: tuple[Span, ...] = ()


def caret(text: str, span: Span, indent: str = "    ") -> str:
    width = max(1, span.end - span.start)
    return f"{indent}{text}\n{indent}{' ' * span.start}{'^' * width}"


_FRIENDLY = {
    "_ARROW": "'->'", "NAME": "a group or tensor kind", "DEVICE": "a device", "INT": "a layer number",
    "COMMA": "','", "LAYERS": "'layers'", "FIRST": "'first'", "LAST": "'last'",
    "LAYER_KIND": "moe/dense/nextn/recurrent",
    "__ANON_0": "'..'", "DOT": "'.'", "$END": "the end of the rule", "<END-OF-FILE>": "the end of the rule",
}


@cache
def _parser() -> Any:
    from importlib import resources

    from lark import Lark

    grammar = resources.files("moeconf.plan").joinpath("plan.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


class RuleSyntaxError(PlanError):
    """A rule that does not parse; `column` is within the rule text (0-based `offset`)."""


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<arrow>->|→)
  | (?P<dots>\.\.)
  | (?P<comma>,)
  | (?P<int>[0-9]+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
""", re.VERBOSE)
_DEVICE = re.compile(r"[A-Za-z$][A-Za-z0-9_${}]*(?:\[[^\]\s]*\])?")
_KEYWORDS = frozenset({"layers", "first", "last", "moe", "dense", "nextn", "recurrent"})


def _fast_parse(text: str, index: int) -> Rule | None:
    """The rule, for the plain shapes the grammar accepts without any ambiguity; None for
    anything else (errors, names that are also keywords), which then goes to the lark parser.
    A property test checks that whatever this accepts, lark parses the same way."""
    toks: list[tuple[str, str, int, int]] = []
    pos = 0
    arrow_end = -1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            return None
        kind = m.lastgroup or ""
        if kind == "arrow":
            arrow_end = m.end()
            toks.append((kind, m.group(), m.start(), m.end()))
            break
        if kind == "int" and len(m.group()) > 9:
            return None  # the grammar path reports it (_number)
        if kind != "ws":
            toks.append((kind, m.group(), m.start(), m.end()))
        pos = m.end()
    if arrow_end < 0:
        return None
    # DEVICE ("," DEVICE)*: a fill rule's devices in order of preference, the last takes the rest
    devs: list[re.Match[str]] = []
    pos = arrow_end
    while True:
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        dm = _DEVICE.match(text, pos)
        if dm is None:
            return None
        devs.append(dm)
        pos = dm.end()
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos == len(text):
            break
        if text[pos] != ",":
            return None
        pos += 1
    if len({d.group() for d in devs}) != len(devs):
        return None  # the grammar path words the error
    dm = devs[-1]
    fill = tuple(d.group() for d in devs[:-1])
    fill_spans = tuple(Span(d.start(), d.end()) for d in devs[:-1])
    sel = toks[:-1]
    targets: list[str] = []
    tspans: list[Span] = []
    i = 0
    while i < len(sel) and sel[i][0] == "name" and sel[i][1] not in _KEYWORDS:
        targets.append(sel[i][1])
        tspans.append(Span(sel[i][2], sel[i][3]))
        i += 1
        if i < len(sel) and sel[i][0] == "comma":
            i += 1
            if i >= len(sel) or sel[i][0] != "name" or sel[i][1] in _KEYWORDS:
                return None
        else:
            break
    rest = sel[i:]
    layers: LayerSet | None = None
    if rest:
        words = [t[1] if t[0] == "name" else t[0] for t in rest]
        start = rest[0][2]
        end = rest[-1][3]
        if words[:1] == ["layers"] and len(rest) == 2 and rest[1][1] in ("moe", "dense", "nextn", "recurrent"):
            layers = LayerSet("kind", kind=rest[1][1], span=Span(start, end))  # type: ignore[arg-type]
        elif words in (["first", "int"], ["last", "int"], ["layers", "first", "int"], ["layers", "last", "int"]):
            n = int(rest[-1][1])
            if n == 0:
                return None
            layers = LayerSet("first" if "first" in words else "last", count=n, span=Span(start, end))
        elif words[:1] == ["layers"] and len(rest) > 1:
            spans: list[tuple[int | None, int | None]] = []
            items = rest[1:]
            k = 0
            while True:
                shape = [t[0] for t in items[k:k + 3]]
                if shape[:3] == ["int", "dots", "int"]:
                    lo, hi = int(items[k][1]), int(items[k + 2][1])
                    if lo > hi:
                        return None
                    spans.append((lo, hi))
                    k += 3
                elif shape[:2] == ["int", "dots"]:
                    spans.append((int(items[k][1]), None))
                    k += 2
                elif shape[:2] == ["dots", "int"]:
                    spans.append((None, int(items[k + 1][1])))
                    k += 2
                elif shape[:1] == ["int"]:
                    spans.append((int(items[k][1]), int(items[k][1])))
                    k += 1
                else:
                    return None
                if k == len(items):
                    break
                if items[k][0] != "comma" or k + 1 == len(items):
                    return None
                k += 1
            layers = LayerSet("list", tuple(spans), span=Span(start, end))
        else:
            return None
    elif not targets:
        return None
    return Rule(text, index, tuple(targets), tuple(tspans), layers, dm.group(), Span(dm.start(), dm.end()),
                fill, fill_spans)


def _number(tok: Any, text: str) -> int:
    """A layer number or count from the rule; more than 9 digits is no model's (and would not
    even convert past 4300 digits)."""
    digits = str(tok)
    if len(digits) > 9:
        start = getattr(tok, "start_pos", None) or 0
        raise RuleSyntaxError(f"number {digits[:12]}{'...' if len(digits) > 12 else ''} is too large for a "
                              "layer number or count", offset=start,
                              context=caret(text, Span(start, start + min(len(digits), 40))))
    return int(digits)


def parse_rule(text: str, index: int = 0) -> Rule:
    """Parse one rule; `RuleSyntaxError` (with a caret) when it does not parse."""
    fast = _fast_parse(text, index)
    if fast is not None:
        return fast
    return lark_parse_rule(text, index)


def lark_parse_rule(text: str, index: int = 0) -> Rule:
    """Parse with the lark grammar (`plan.lark`): the reference, and the error messages."""
    from lark import Token, Tree
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

    if not text.strip():
        raise RuleSyntaxError("empty rule: write SELECTOR -> DEVICE, e.g. 'experts -> cpu'", offset=0,
                              context=caret(text, Span(0, 1)))
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        pos = getattr(e, "pos_in_stream", None)
        if pos is None or pos < 0:
            pos = len(text)
        if isinstance(e, UnexpectedCharacters):
            msg = f"unexpected character {text[pos]!r}"
            allowed = sorted(_FRIENDLY.get(x, x) for x in (e.allowed or ()))
        elif isinstance(e, UnexpectedToken):
            tok = e.token
            if tok.type == "$END":
                pos = len(text)
                msg = "the rule ends too early"
            else:
                msg = f"unexpected {str(tok)!r}"
            allowed = sorted({_FRIENDLY.get(x, x) for x in e.expected})
        elif isinstance(e, UnexpectedEOF):
            pos = len(text)
            msg = "the rule ends too early"
            allowed = sorted({_FRIENDLY.get(x, x) for x in e.expected})
        else:  # pragma: no cover - lark has no other kinds
            msg, allowed = str(e), []
        if "->" not in text and "→" not in text:
            msg += "; a rule is SELECTOR -> DEVICE"
        elif allowed:
            msg += f"; expected {' or '.join(allowed)}"
        raise RuleSyntaxError(msg, offset=pos, context=caret(text, Span(pos, pos + 1))) from None

    def span_of(node: Any) -> Span:
        if isinstance(node, Token):
            return Span(node.start_pos or 0, node.end_pos or 0)
        return Span(node.meta.start_pos, node.meta.end_pos)

    selector, devices_tree = tree.children
    device_toks = [d.children[0] for d in devices_tree.children]
    device_tok = device_toks[-1]
    targets: list[str] = []
    tspans: list[Span] = []
    layers: LayerSet | None = None
    for part in selector.children:
        if part.data == "targets":
            for tnode in part.children:
                tok = tnode.children[0]
                targets.append(str(tok))
                tspans.append(span_of(tok))
            continue
        span = span_of(part)
        if part.data == "layer_list":
            spans: list[tuple[int | None, int | None]] = []
            for item in part.children[0].children:
                nums = [_number(t, text) for t in item.children]
                if item.data == "span":
                    if nums[0] > nums[1]:
                        raise RuleSyntaxError(
                            f"empty range {nums[0]}..{nums[1]}: write the smaller number first",
                            offset=span_of(item).start, context=caret(text, span_of(item)),
                        )
                    spans.append((nums[0], nums[1]))
                elif item.data == "from_n":
                    spans.append((nums[0], None))
                elif item.data == "up_to":
                    spans.append((None, nums[0]))
                else:
                    spans.append((nums[0], nums[0]))
            layers = LayerSet("list", tuple(spans), span=span)
        elif part.data in ("first_n", "last_n"):
            n = _number(part.children[-1], text)
            if n == 0:
                raise RuleSyntaxError(f"'{part.data[:-2]} 0' selects nothing", offset=span.start,
                                      context=caret(text, span))
            layers = LayerSet("first" if part.data == "first_n" else "last", count=n, span=span)
        elif part.data == "layer_kind":
            kind = str(part.children[-1])
            layers = LayerSet("kind", kind=kind, span=span)  # type: ignore[arg-type]
        elif isinstance(part, Tree):  # pragma: no cover - grammar has no other forms
            raise AssertionError(part.data)
    fill = tuple(str(t) for t in device_toks[:-1])
    if len({*fill, str(device_tok)}) != len(device_toks):
        raise RuleSyntaxError("a device appears twice in the list", offset=span_of(device_toks[0]).start,
                              context=caret(text, Span(span_of(device_toks[0]).start, span_of(device_tok).end)))
    return Rule(text, index, tuple(targets), tuple(tspans), layers, str(device_tok), span_of(device_tok),
                fill, tuple(span_of(t) for t in device_toks[:-1]))
