"""Placement -> the shortest ordered list of `regex=DEVICE` items that the engine maps back to
exactly that placement on this inventory.

The search space (the *readable forms*): each item's regex is an alternation of terms, and a
term is one of
- a whole name part (`exps`, `ffn_down_exps`, `attn`, `blk`) or a `^prefix` of a name outside
  the blocks (`^output\\.`), never a fragment: every occurrence of the part in every tensor name
  of the model sits between separators, so `b` (which is inside `blk`) never qualifies;
- a block term `blk\\.(R)\\.K` or `\\.(R)\\.K`: a layer-set regex R (`moeconf.synth.layers`)
  times a kind pattern K after the block number (empty: the whole block; `.*exps`;
  `ffn_(up|gate)_exps`).
Layouts are *direct* (one item per device, matching only tensors that want it or that an
earlier item already matched: first match wins, so those never reach it) or *carved* (one broad
item last, whose over-match earlier items catch first: `\\.(\\d|10)\\.=CUDA0,exps=CPU`; its
terms are drawn from several over-match sets). Items (a carved layout's before its broad one)
are tried in every order, up to `_ALL_ORDERS_UP_TO` of them, else in the device order and its
reverse. Carve items may take whole blocks whose other tensors already end up on their device.
Each item's alternation is an exact minimum-cost set cover over the terms (branch and bound).
Everything is computed on bitmasks over the live tensors, which is exactly what the engine's
unanchored first-match search does; the chosen list is then re-simulated with real regex
engines (`check`), and a disagreement is an internal error.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from moeconf.engines import AUTO_GPU, HOST
from moeconf.engines.simulate import OverrideItem, ecmascript_matcher, python_matcher, simulate
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement
from moeconf.synth.layers import layer_set_regex

_SPECIAL = set("\\.^$|?*+()[]{}/")
_HEX = {",": r"\x2c", "=": r"\x3d", " ": r"\x20", "\t": r"\x09"}


@cache
def escape(s: str) -> str:
    """Escape a literal for a regex both std::regex ECMAScript and Python `re` read the same way,
    with no `,` `=` or whitespace (which `-ot` parsing would split on)."""
    out = []
    for ch in s:
        if ch in _HEX:
            out.append(_HEX[ch])
        elif ch in _SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


class SynthesisError(AssertionError):
    """The synthesizer could not reproduce a placement: a bug in moeconf, never user error."""


# --- name parts ------------------------------------------------------------------------------

_SEPARATORS = "._"


def _boundaries(s: str) -> list[int]:
    b = {0, len(s)}
    for k, ch in enumerate(s):
        if ch in _SEPARATORS:
            b.add(k)
            b.add(k + 1)
    return sorted(b)


@cache
def _substrings(s: str) -> frozenset[str]:
    """Substrings of `s` from one part boundary to another (`exps`, `_exps`, `ffn_up`, `exps.`)."""
    b = _boundaries(s)
    out = set()
    for x, i in enumerate(b):
        for j in b[x + 1:]:
            sub = s[i:j]
            if sub.strip(_SEPARATORS):
                out.add(sub)
    return frozenset(out)


@cache
def _aligned_in(sub: str, name: str) -> bool:
    """Every occurrence of `sub` in `name` starts and ends on a part boundary."""
    bounds = set(_boundaries(name))
    k = name.find(sub)
    while k >= 0:
        if k not in bounds or k + len(sub) not in bounds:
            return False
        k = name.find(sub, k + 1)
    return True


def _alternation(parts: Iterable[str]) -> str:
    return "|".join(sorted(set(parts), key=lambda p: (len(p), p)))


def _factor(words: list[str]) -> str:
    """`ffn_up_exps`, `ffn_gate_exps` -> `ffn_(up|gate)_exps`: the common prefix and suffix (cut
    at part boundaries, so no fragment is pulled out) outside the group."""
    words = _minimal_prefixes(words)
    if len(words) == 1:
        return escape(words[0])
    pre = _common_prefix(words)
    rest = [w[len(pre):] for w in words]
    suf = _common_prefix([r[::-1] for r in rest])[::-1]
    suf = suf[len(suf) - _cut_suffix(suf):] if suf else ""
    if any(len(r) - len(suf) <= 0 for r in rest):
        suf = ""
    mid = [r[: len(r) - len(suf)] if suf else r for r in rest]
    if any(not m for m in mid):
        return escape(pre) + "(" + "|".join(escape(r) for r in rest) + ")"
    return escape(pre) + "(" + "|".join(escape(m) for m in mid) + ")" + escape(suf)


def _cut_suffix(suf: str) -> int:
    """Length of the longest tail of `suf` that starts at a separator (`_exps` of `p_exps`)."""
    for k, ch in enumerate(suf):
        if ch in _SEPARATORS:
            return len(suf) - k
    return 0


def _minimal_prefixes(words: list[str]) -> list[str]:
    """Drop words that have another word as a prefix (the shorter one matches both)."""
    out: list[str] = []
    for w in sorted(words, key=len):
        if not any(w.startswith(o) for o in out):
            out.append(w)
    return sorted(out)


def _common_prefix(words: list[str]) -> str:
    if not words:
        return ""
    lo, hi = min(words), max(words)
    i = 0
    while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
        i += 1
    # back to a part boundary: `ffn_gate_` of `ffn_gate_exps`/`ffn_gate_inp`, never `attn_k` of
    # `attn_k_b`/`attn_kv_b`
    while i > 0 and lo[i - 1] not in _SEPARATORS and i < len(lo) and lo[i] not in _SEPARATORS:
        i -= 1
    return lo[:i]


# --- the inventory as bitmasks -----------------------------------------------------------------


@dataclass(frozen=True)
class _Term:
    regex: str
    mask: int  # the live tensors it matches

    @property
    def cost(self) -> int:
        return len(self.regex)


def _literal(rx: str) -> str | None:
    """The string an `escape()`d literal matches, or None if `rx` has regex syntax in it."""
    out = []
    i = 0
    while i < len(rx):
        ch = rx[i]
        if ch == "\\":
            if i + 1 >= len(rx) or rx[i + 1] not in _SPECIAL:
                return None
            out.append(rx[i + 1])
            i += 2
            continue
        if ch in _SPECIAL:
            return None
        out.append(ch)
        i += 1
    return "".join(out)


def _literals(rx: str) -> list[str] | None:
    """`a\\.b` -> ['a.b'], `(a|b)` -> ['a', 'b']; None for any other regex syntax."""
    if rx.startswith("(") and rx.endswith(")"):
        alts = [_literal(a) for a in rx[1:-1].split("|")]
        return None if any(a is None for a in alts) else [a for a in alts if a is not None]
    lit = _literal(rx)
    return None if lit is None else [lit]


_DIGIT_SEGMENT = re.compile(r"\.(\d+)\.")


class _Space:
    """The live tensors of a placement as bit positions, with what each wants."""

    def __init__(self, pl: Placement) -> None:
        inv = pl.inventory
        self.live = [t for t in inv.tensors if pl.devices[t.name] is not None]
        self.names = [t.name for t in self.live]
        self.n = len(self.live)
        self.full = (1 << self.n) - 1
        want: dict[str, int] = defaultdict(int)
        self.wrong_default = 0
        for i, t in enumerate(self.live):
            d = pl.devices[t.name]
            assert d is not None
            want[d] |= 1 << i
            if d != pl.defaults[t.name]:
                self.wrong_default |= 1 << i
        self.want = dict(want)
        self.auto = self.want.get(AUTO_GPU, 0)
        # block structure: rest after `blk.N.` and layer, for live tensors
        self.rest: list[str | None] = []
        self.layer: list[int | None] = []
        rest_masks: dict[str, int] = defaultdict(int)
        layer_masks: dict[int, int] = defaultdict(int)
        self.global_mask = 0
        for i, t in enumerate(self.live):
            prefix = f"blk.{t.layer}."
            if t.layer is not None and t.name.startswith(prefix):
                r = t.name[len(prefix):]
                self.rest.append(r)
                self.layer.append(t.layer)
                rest_masks[r] |= 1 << i
                layer_masks[t.layer] |= 1 << i
            else:
                self.rest.append(None)
                self.layer.append(None)
                self.global_mask |= 1 << i
        self.rest_masks = dict(rest_masks)
        self.global_bits = [i for i in range(self.n) if self.rest[i] is None]
        self.rest_bits: dict[str, list[int]] = defaultdict(list)
        for i, rr in enumerate(self.rest):
            if rr is not None:
                self.rest_bits[rr].append(i)
        self.layer_masks = dict(layer_masks)
        self.layers = sorted({t.layer for t in inv.tensors if t.layer is not None})
        # names (all, created or not) a digit-free part is checked against for readability: a
        # block number changes no part boundary around a digit-free part
        all_names = [t.name for t in inv.tensors]
        self.reps = sorted({_DIGIT_SEGMENT.sub(".0.", nm, count=1) for nm in all_names})
        self.all_names = all_names
        # live names with a `.digits.` segment other than a leading `blk.N.`: where `\.(R)\.`
        # could match outside the block number
        self.odd = [i for i, nm in enumerate(self.names)
                    if any(m.start() != 3 or not nm.startswith("blk.") for m in _DIGIT_SEGMENT.finditer(nm))]
        self._sub: dict[str, int] = {}
        self._readable: dict[str, bool] = {}
        self._kmatch: dict[str, int] = {}
        self._krests: dict[str, tuple[str, ...]] = {}
        self._rlayers: dict[str, frozenset[int]] = {}
        self._covers: dict[tuple[int, int], list[_Term]] = {}
        self._terms: dict[tuple[int, int], list[_Term]] = {}
        self._rparts: dict[str, tuple[str, ...]] = {}

    # masks of the simple shapes

    def sub_mask(self, s: str) -> int:
        m = self._sub.get(s)
        if m is None:
            m = 0
            if any(c.isdigit() for c in s):
                for i, nm in enumerate(self.names):
                    if s in nm:
                        m |= 1 << i
            else:
                # a digit-free string sits wholly in `blk.` or in `.rest` of `blk.N.rest`
                if s in "blk.":
                    m = self.full & ~self.global_mask
                else:
                    for r, rm in self.rest_masks.items():
                        if s in "." + r:
                            m |= rm
                for i in self.global_bits:
                    if s in self.names[i]:
                        m |= 1 << i
            self._sub[s] = m
        return m

    def prefix_mask(self, p: str) -> int:
        m = 0
        for i, nm in enumerate(self.names):
            if nm.startswith(p):
                m |= 1 << i
        return m

    def readable(self, s: str) -> bool:
        """`s` is a whole name part wherever it occurs in the model's names."""
        ok = self._readable.get(s)
        if ok is None:
            pool = self.all_names if any(c.isdigit() for c in s) else self.reps
            ok = self._readable[s] = all(_aligned_in(s, nm) for nm in pool if s in nm)
        return ok

    def readable_parts(self, s: str) -> tuple[str, ...]:
        """The whole name parts of `s` that are readable in this model."""
        got = self._rparts.get(s)
        if got is None:
            got = self._rparts[s] = tuple(p for p in _substrings(s) if self.readable(p))
        return got

    def kind_rests(self, k: str) -> tuple[str, ...]:
        """The rests (after `blk.N.`) the kind pattern matches at their start."""
        got = self._krests.get(k)
        if got is None:
            lits = _literals(k[2:]) if k.startswith(".*") else None
            if k == "":
                got = tuple(self.rest_masks)
            elif lits is not None:
                got = tuple(r for r in self.rest_masks if any(x in r for x in lits))
            else:
                rx = re.compile(k)
                got = tuple(r for r in self.rest_masks if rx.match(r))
            self._krests[k] = got
        return got

    def kind_mask(self, k: str) -> int:
        m = self._kmatch.get(k)
        if m is None:
            m = 0
            for r in self.kind_rests(k):
                m |= self.rest_masks[r]
            self._kmatch[k] = m
        return m

    def regex_layers(self, r: str) -> frozenset[int]:
        got = self._rlayers.get(r)
        if got is None:
            rx = re.compile(r)
            got = self._rlayers[r] = frozenset(x for x in self.layers if rx.fullmatch(str(x)))
        return got

    def block_terms(self, r: str, k: str, kmask: int) -> list[_Term]:
        """`blk\\.(R)\\.K` and, where it matches the same tensors or only more allowed ones,
        `\\.(R)\\.K`. Masks are exact: computed from the block structure, plus a real regex search
        of the few names with other `.digits.` segments."""
        base = 0
        for layer in self.regex_layers(r):
            base |= self.layer_masks.get(layer, 0)
        mask = base & kmask
        out = [_Term(r"blk\." + r + r"\." + k, mask)]
        short = r"\." + r + r"\." + k
        extra = 0
        if self.odd:
            rx = re.compile(short)
            for i in self.odd:
                if rx.search(self.names[i]):
                    extra |= 1 << i
        out.append(_Term(short, mask | extra))
        return out

    # covers

    def terms(self, must: int, allowed: int) -> list[_Term]:
        """Readable terms matching some of `must` and nothing outside `allowed`."""
        key = (must, allowed)
        got = self._terms.get(key)
        if got is None:
            got = self._terms[key] = self._make_terms(must, allowed)
        return got

    def _make_terms(self, must: int, allowed: int) -> list[_Term]:
        forbid = self.full & ~allowed
        out: dict[str, _Term] = {}

        def add(t: _Term) -> None:
            if t.mask & must and not t.mask & forbid:
                out.setdefault(t.regex, t)

        rests = {r for i, r in enumerate(self.rest) if must >> i & 1 and r is not None}
        globals_ = [self.names[i] for i in range(self.n) if must >> i & 1 and self.rest[i] is None]
        sources = [*rests, *globals_]
        if rests:
            sources.append("blk.")
        parts = {p for s in sources for p in self.readable_parts(s)}
        for p in parts:
            add(_Term(escape(p), self.sub_mask(p)))
        for g in globals_:
            for j in _boundaries(g)[1:]:
                p = g[:j]
                pm = self.prefix_mask(p)
                if not pm & forbid:
                    add(_Term("^" + escape(p), pm))
                    break
        if rests:
            kinds = {""}
            for r in rests:
                kinds.update(".*" + escape(p) for p in self.readable_parts(r))
            kinds.update(self._group_kinds(must, forbid))
            # per rest: the layers where it is required, and where it is forbidden
            need_at: dict[str, set[int]] = defaultdict(set)
            bad_at: dict[str, set[int]] = defaultdict(set)
            for r, bits in self.rest_bits.items():
                for i in bits:
                    if must >> i & 1:
                        need_at[r].add(self.layer[i])  # type: ignore[arg-type]
                    elif forbid >> i & 1:
                        bad_at[r].add(self.layer[i])  # type: ignore[arg-type]
            # must tensors some name part alone already takes: block terms may leave them out
            must_blocks = must & ~self.global_mask
            named = 0
            for t in out.values():
                named |= t.mask & must
            # one pattern per set of rests it matches: the shortest
            by_rests: dict[tuple[str, ...], str] = {}
            for k in kinds:
                kr = self.kind_rests(k)
                old = by_rests.get(kr)
                if old is None or (len(k), k) < (len(old), old):
                    by_rests[kr] = k
            for kr, k in by_rests.items():
                need: set[int] = set()
                bad: set[int] = set()
                for r in kr:
                    need |= need_at.get(r, set())
                    bad |= bad_at.get(r, set())
                need -= bad
                if not need:
                    continue
                for layer_set in self._layer_sets(need, must_blocks & self.kind_mask(k), named):
                    lrx = layer_set_regex(layer_set, bad)
                    for t in self.block_terms(lrx, k, self.kind_mask(k)):
                        add(t)
        return list(out.values())

    def _layer_sets(self, need: set[int], kmust: int, named: int) -> list[frozenset[int]]:
        """Layer sets for the block terms of one kind pattern: all the layers it is needed in;
        those without the layers whose tensors name parts already take; and, for a few layers,
        every subset (a shorter layer regex plus another term can beat one wide term)."""
        out = {frozenset(need)}
        rest = {x for x in need if self.layer_masks[x] & kmust & ~named}
        if rest:
            out.add(frozenset(rest))
        if len(need) <= 3:
            ls = sorted(need)
            for k in range(1, len(ls)):
                out.update(frozenset(c) for c in itertools.combinations(ls, k))
        return list(out)

    def _group_kinds(self, must: int, forbid: int) -> set[str]:
        """Kind patterns that name several rests at once, for each set of rests sharing a layer
        set: `ffn_(up|gate)_exps`, `.*(up|down)_exps`."""
        layers_of_rest: dict[str, set[int]] = defaultdict(set)
        for i in range(self.n):
            if must >> i & 1 and self.rest[i] is not None:
                r = self.rest[i]
                lay = self.layer[i]
                assert r is not None and lay is not None
                layers_of_rest[r].add(lay)
        groups: dict[frozenset[int], list[str]] = defaultdict(list)
        for r, layer_set in layers_of_rest.items():
            groups[frozenset(layer_set)].append(r)
        out = set()
        for ls, rs in groups.items():
            if len(rs) < 2:
                continue
            inside = {self.rest[i] for i in range(self.n) if forbid >> i & 1 and self.layer[i] in ls}
            fs = sorted(r for r in inside if r is not None)
            prefixes = []
            for m in sorted(rs):
                for j in _boundaries(m)[1:]:
                    if not any(f.startswith(m[:j]) for f in fs):
                        prefixes.append(m[:j])
                        break
                else:
                    prefixes = []
                    break
            if prefixes:
                out.add(_factor(sorted(set(prefixes))))
            # `.*(a|b)`: two whole parts that between them name every rest of the group
            parts = sorted({p for r in rs for p in self.readable_parts(r)
                            if not any(p in f for f in fs)}, key=lambda p: (len(p), p))
            for x, a in enumerate(parts[:12]):
                for b in parts[x + 1:12]:
                    if all(a in r or b in r for r in rs):
                        out.add(".*(" + "|".join(sorted((escape(a), escape(b)))) + ")")
        return out

    def cover(self, must: int, allowed: int) -> list[_Term]:
        """The cheapest alternation of readable terms matching all of `must` and nothing outside
        `allowed` (exact names when nothing else can)."""
        key = (must, allowed)
        got = self._covers.get(key)
        if got is None:
            got = self._covers[key] = self._cover(must, allowed)
        return got

    def _cover(self, must: int, allowed: int) -> list[_Term]:
        terms = self.terms(must, allowed)
        chosen = _set_cover(must, terms)
        if chosen is None:
            names = [self.names[i] for i in range(self.n) if must >> i & 1]
            return [_Term(exact_names(names, self.names), must)]
        return chosen


def _set_cover(universe: int, terms: list[_Term], node_limit: int = 20000) -> list[_Term] | None:
    """Minimum total length of an alternation (sum of term lengths + one `|` between terms)
    whose terms together hold every bit of `universe`: exact branch and bound over the classes
    of bits no term tells apart, after dropping dominated terms; greedy beyond `node_limit`."""
    if not universe:
        return []
    cheapest: dict[int, _Term] = {}
    for t in terms:
        m = t.mask & universe
        old = cheapest.get(m)
        if old is None or (t.cost, t.regex) < (old.cost, old.regex):
            cheapest[m] = t
    terms = list(cheapest.values())
    # classes: refine the universe by every term
    classes = [universe]
    for t in terms:
        m = t.mask & universe
        if not m:
            continue
        nxt: list[int] = []
        for c in classes:
            a, b = c & m, c & ~m
            if a and b:
                nxt.extend((a, b))
            else:
                nxt.append(c)
        classes = nxt
    cls_of: list[tuple[int, _Term]] = []
    for t in terms:
        cm = 0
        for k, c in enumerate(classes):
            if c & t.mask:
                cm |= 1 << k
        if cm:
            cls_of.append((cm, t))
    full = (1 << len(classes)) - 1
    if not cls_of:
        return None
    union = 0
    for cm, _ in cls_of:
        union |= cm
    if union != full:
        return None
    # dominance: keep, per class set, the cheapest term; drop a term whose classes another no
    # dearer term includes
    best_for: dict[int, _Term] = {}
    for cm, t in cls_of:
        old = best_for.get(cm)
        if old is None or (t.cost, t.regex) < (old.cost, old.regex):
            best_for[cm] = t
    ordered = sorted(best_for.items(), key=lambda x: (x[1].cost, -x[0].bit_count(), x[1].regex))
    kept: list[tuple[int, _Term]] = []
    for cm, t in ordered:
        if any(cm & ~c2 == 0 and t2.cost <= t.cost for c2, t2 in kept):
            continue
        kept.append((cm, t))
    # greedy upper bound
    uncovered = full
    greedy: list[tuple[int, _Term]] = []
    while uncovered:
        cm, t = min((x for x in kept if x[0] & uncovered),
                    key=lambda x: ((x[1].cost + 1) / (x[0] & uncovered).bit_count(), x[1].cost, x[1].regex))
        greedy.append((cm, t))
        uncovered &= ~cm
    best = [t for _, t in greedy]
    best_cost = [sum(t.cost + 1 for t in best)]
    best_list = [best]
    covering: dict[int, list[tuple[int, _Term]]] = {k: [x for x in kept if x[0] >> k & 1] for k in range(len(classes))}
    min_cost = min(t.cost + 1 for _, t in kept)
    max_cover = max(cm.bit_count() for cm, _ in kept)
    nodes = [0]

    def rec(uncovered: int, chosen: list[_Term], cost: int) -> None:
        nodes[0] += 1
        if nodes[0] > node_limit:
            return
        if not uncovered:
            key = (cost, _alternation(t.regex for t in chosen))
            if key < (best_cost[0], _alternation(t.regex for t in best_list[0])):
                best_cost[0] = cost
                best_list[0] = list(chosen)
            return
        if cost + -(-uncovered.bit_count() // max_cover) * min_cost > best_cost[0]:
            return
        pivot = min((k for k in range(len(classes)) if uncovered >> k & 1), key=lambda k: len(covering[k]))
        options = sorted(covering[pivot], key=lambda x: (x[1].cost + 1) / (x[0] & uncovered).bit_count())
        for cm, t in options:
            chosen.append(t)
            rec(uncovered & ~cm, chosen, cost + t.cost + 1)
            chosen.pop()

    rec(full, [], 0)
    return best_list[0]


# --- layouts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synthesis:
    items: tuple[OverrideItem, ...]

    @property
    def value(self) -> str:
        """The comma-joined `-ot` value ('' when no item is needed)."""
        return ",".join(it.render() for it in self.items)


def _device_order(devices: Iterable[str]) -> list[str]:
    return sorted(set(devices), key=lambda d: (d == HOST, d))


_Layout = list[tuple[list[_Term], str]]


def _outcome_ok(sp: _Space, layout: _Layout) -> bool:
    """First match wins, unmatched tensors keep their default: does every live tensor end where
    it should?"""
    remaining = sp.full
    for terms, dev in layout:
        m = 0
        for t in terms:
            m |= t.mask
        hit = m & remaining
        if hit & ~sp.want.get(dev, 0):
            return False
        remaining &= ~hit
    return not remaining & sp.wrong_default


def _render(layout: _Layout) -> str:
    return ",".join(_alternation(t.regex for t in terms) + "=" + dev for terms, dev in layout)


def _prune(sp: _Space, layout: _Layout) -> _Layout:
    """Drop items, then terms inside items, whose removal keeps the placement (a carve-out
    nothing needs, a block term another one already covers)."""
    i = 0
    while i < len(layout):
        trial = layout[:i] + layout[i + 1:]
        if _outcome_ok(sp, trial):
            layout = trial
        else:
            i += 1
    for i in range(len(layout)):
        terms, dev = layout[i]
        for t in sorted(terms, key=lambda x: -x.cost):
            if len(terms) < 2:
                break
            fewer = [x for x in terms if x is not t]
            trial = [*layout[:i], (fewer, dev), *layout[i + 1:]]
            if _outcome_ok(sp, trial):
                terms = fewer
                layout = trial
    return layout


# orders of the items before the last one tried in full up to this many items (4! = 24 orders);
# beyond, the device order and its reverse
_ALL_ORDERS_UP_TO = 4


def _orders(items: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    if len(items) <= _ALL_ORDERS_UP_TO:
        return [list(p) for p in itertools.permutations(items)]
    return [items, items[::-1]]


def _in_order(sp: _Space, order: list[tuple[str, int]]) -> _Layout:
    """One item per (device, must) in this order, each a cheapest cover of its `must`. First
    match wins: the tensors an earlier item matches never reach a later one, so a later item may
    match them too (don't-cares); it must match nothing else that wants another device."""
    items: _Layout = []
    taken = 0
    for d, must in order:
        terms = sp.cover(must, sp.want[d] | taken)
        items.append((terms, d))
        for t in terms:
            taken |= t.mask
    return items


def _broad_allowed(sp: _Space, b_dev: str, devices: list[str]) -> list[int]:
    """What a broad item for `b_dev` may over-match, as sets to draw its terms from: any tensor
    (the catches take what is not B's), and B's and the moved ones plus the tensors of some of
    the other devices (a narrower layer set can spare a device its catch: `\\.[12]\\.` where
    `\\.\\d\\.` also takes block 0)."""
    not_auto = sp.full & ~sp.auto
    base = sp.want[b_dev] | sp.wrong_default
    others = [d for d in devices if d != b_dev]
    out = [not_auto]
    if len(others) > _ALL_ORDERS_UP_TO:
        return [*out, base & not_auto]
    for k in range(len(others)):
        for ds in itertools.combinations(others, k):
            a = base
            for d in ds:
                a |= sp.want[d]
            out.append(a & not_auto)
    return list(dict.fromkeys(out))


def _layouts(sp: _Space) -> Generator[tuple[_Layout, bool], int | None, None]:
    """Direct layouts first, then carved ones, broad items shortest first. A caller that knows
    how long its best layout is sends that length back, and broad items too long to beat it are
    skipped (a layout is never shorter than its broad item). Items are tried in every order (up
    to `_ALL_ORDERS_UP_TO` of them): what an earlier item matches is a don't-care for a later one.
    Each layout comes with whether its items are in the device order (CPU last), which wins ties."""
    need = sp.wrong_default
    devices = _device_order(d for d in sp.want if d != AUTO_GPU)
    need_of = {d: need & sp.want[d] for d in devices if need & sp.want[d]}
    # direct: one item per device, matching nothing that wants another device and that no
    # earlier item took
    best: int | None = None
    for k, order in enumerate(_orders(list(need_of.items()))):
        got = yield _in_order(sp, order), k == 0
        if got is not None:
            best = got
    # carved: a broad item for device B last; earlier items catch what it must not take
    for b_dev, b_need in need_of.items():
        broads: dict[str, list[_Term]] = {}
        for allowed in _broad_allowed(sp, b_dev, devices):
            for t in sp.terms(b_need, allowed):
                if not b_need & ~t.mask:
                    broads.setdefault(t.regex, [t])
            c = sp.cover(b_need, allowed)
            broads.setdefault(_alternation(t.regex for t in c), c)
        for key, broad in sorted(broads.items(), key=lambda kv: (len(kv[0]), kv[0])):
            if best is not None and len(key) + len(b_dev) + 1 > best:
                break
            bmask = 0
            for t in broad:
                bmask |= t.mask
            wrongly = bmask & ~sp.want[b_dev]
            if not wrongly:
                continue  # the direct layout has it
            catches = [(d, need_of.get(d, 0) | (wrongly & sp.want[d])) for d in devices if d != b_dev]
            catches = [(d, c) for d, c in catches if c]
            # each carve-out costs at least a one-character regex, `=DEVICE` and a comma
            if best is not None and len(key) + len(b_dev) + 1 + sum(len(d) + 3 for d, _ in catches) > best:
                continue
            for k, order in enumerate(_orders(catches)):
                items = _in_order(sp, order)
                items.append((broad, b_dev))
                got = yield items, k == 0
                if got is not None:
                    best = got


def synthesize(pl: Placement) -> Synthesis:
    """The shortest verified item list for `pl`. Raises SynthesisError if none reproduces it."""
    sp = _Space(pl)
    if not sp.wrong_default:
        return Synthesis(())
    found: dict[str, _Layout] = {}
    # 0 for a list whose items are in the device order: of two equally long lists, the one in
    # the device order is printed
    rank: dict[str, int] = {}
    best_len: int | None = None
    gen = _layouts(sp)
    step: tuple[_Layout, bool] | None = next(gen)
    while step is not None:
        layout, in_device_order = step
        if _outcome_ok(sp, layout):
            layout = _prune(sp, layout)
            value = _render(layout)
            found.setdefault(value, layout)
            rank[value] = min(rank.get(value, 1), 0 if in_device_order else 1)
            if best_len is None or len(value) < best_len:
                best_len = len(value)
        try:
            step = gen.send(best_len)
        except StopIteration:
            step = None
    # shortest first, each re-simulated with the regexes themselves: the masks are a model of
    # the regexes, and a layout the real search disagrees with is skipped, never printed
    for value in sorted(found, key=lambda v: (len(v), rank[v], v)):
        items = tuple(OverrideItem(_alternation(t.regex for t in terms), dev) for terms, dev in found[value])
        if _verify(pl.inventory, pl, items):
            return Synthesis(items)
    # exact names: always right, and a sign that the masks above disagree with the regexes
    by_dev: dict[str, list[str]] = defaultdict(list)
    for i in range(sp.n):
        if sp.wrong_default >> i & 1:
            by_dev[pl.devices[sp.names[i]] or ""].append(sp.names[i])
    fallback = tuple(OverrideItem(exact_names(ns, sp.names), d) for d, ns in by_dev.items())
    if not _verify(pl.inventory, pl, fallback):
        raise SynthesisError("no rule list reproduces the placement (exact names failed too)")
    return Synthesis(fallback)


def exact_names(names: Sequence[str], every: Sequence[str]) -> str:
    """A regex matching exactly `names` among `every` name of the model: anchored at the start, and at the end
    only where a name is the start of another (a `$` is the one character a .env value cannot carry)."""
    ends = any(o != n and o.startswith(n) for n in names for o in every)
    return "^(" + "|".join(escape(n) for n in names) + ")" + ("$" if ends else "")


def _verify(inv: Inventory, pl: Placement, items: Sequence[OverrideItem], ecmascript: bool = False) -> bool:
    matcher = ecmascript_matcher if ecmascript else python_matcher
    sim = simulate(inv, items, pl.defaults, matcher)
    return all(sim.devices[n] == d for n, d in pl.devices.items() if d is not None)


def check(pl: Placement, synthesis: Synthesis) -> None:
    """Re-simulate the items against the inventory, under Python `re` and under ECMAScript (the
    `regress` engine, a hard dependency: without it this raises, it never skips the check); any
    disagreement is an internal error, never an output."""
    inv = pl.inventory
    for it in synthesis.items:
        bad = [c for c in (",", "=", " ", "\t", "{", "}") if c in it.pattern]
        if bad:
            raise SynthesisError(f"pattern {it.pattern!r} contains {bad[0]!r}")
    if not _verify(inv, pl, synthesis.items):
        raise SynthesisError(f"the compiled rules {synthesis.value!r} do not reproduce the placement")
    if not _verify(inv, pl, synthesis.items, ecmascript=True):
        raise SynthesisError(f"ECMAScript reads {synthesis.value!r} differently from Python re")
