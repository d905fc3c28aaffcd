"""Placement -> the shortest ordered list of `regex=DEVICE` items that the engine maps back to
exactly that placement on this inventory.

For each device, candidate regexes are built from two shapes and the shortest valid one wins:
- substrings of the tensor names (`exps`, `^output\\.`), joined with `|`;
- rectangles `blk\\.LAYERS\\.KIND`: a layer-set regex (`moeconf.synth.layers`) times a kind
  pattern (`.*exps`, `ffn_(up|down)`), one per group of kinds that share a layer set.
Then two layouts are tried: *direct* (one item per device, matching nothing it must not), and
*carved* (a broad item last, with earlier items that catch its exceptions first, as the engines'
first-match-wins allows). Items that change nothing are dropped. Every candidate is simulated
against the inventory; a layout that does not reproduce the placement is never returned.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from moeconf.engines import AUTO_GPU
from moeconf.engines.simulate import OverrideItem, ecmascript_matcher, python_matcher, simulate
from moeconf.model.inventory import Inventory, Tensor
from moeconf.placement import Placement
from moeconf.synth.layers import layer_set_regex

_SPECIAL = set("\\.^$|?*+()[]{}/")
_HEX = {",": r"\x2c", "=": r"\x3d", " ": r"\x20", "\t": r"\x09"}


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


@dataclass(frozen=True)
class _Names:
    """A tensor name split as the rectangles see it: layer and the rest after `blk.N.`."""

    name: str
    layer: int | None
    rest: str


def _split(t: Tensor) -> _Names:
    if t.layer is None:
        return _Names(t.name, None, t.name)
    prefix = f"blk.{t.layer}."
    return _Names(t.name, t.layer, t.name[len(prefix):] if t.name.startswith(prefix) else t.name)


# --- substring covers -----------------------------------------------------------------------


_SEPARATORS = "._"


def _boundaries(s: str) -> list[int]:
    b = {0, len(s)}
    for k, ch in enumerate(s):
        if ch in _SEPARATORS:
            b.add(k)
            b.add(k + 1)
    return sorted(b)


def _substrings(s: str) -> set[str]:
    """Whole name parts only (`exps`, `_exps`, `ffn_up`, `exps.`), never fragments such as `xp`:
    the rules stay readable and keep their meaning on other quantizations of the same model."""
    b = _boundaries(s)
    out = set()
    for x, i in enumerate(b):
        for j in b[x + 1:]:
            sub = s[i:j]
            if sub.strip(_SEPARATORS):
                out.add(sub)
    return out


def substring_cover(
    must: Sequence[str], forbid: Sequence[str], *, sources: Sequence[str] | None = None, anchored: bool = True
) -> list[str] | None:
    """Regex alternatives (already escaped) such that every `must` string contains one and no
    `forbid` string contains any; `^prefix` alternatives are allowed when `anchored`. Greedy
    weighted set cover; None when some must string cannot be separated."""
    if not must:
        return []
    fset = list(set(forbid))
    # one string to search: no name contains a newline, so no match spans two names
    haystack = "\n" + "\n".join(fset) + "\n"
    cands: dict[str, set[int]] = {}
    src = sources if sources is not None else must
    for s in set(src):
        for sub in _substrings(s):
            if sub not in cands and sub not in haystack:
                cands[sub] = set()
    must_text = list(must)
    for sub in cands:
        cands[sub] = {i for i, m in enumerate(must_text) if sub in m}
    if anchored:
        # ^prefix alternatives, for names outside blocks (`^output\.`); whole blocks are the
        # rectangles' job, where the layer number is bounded
        for m in {x for x in must if not x.startswith("blk.")}:
            for j in _boundaries(m)[1:]:
                p = m[:j]
                if ("\n" + p) in haystack:
                    continue
                cands["^" + p] = {i for i, x in enumerate(must_text) if x.startswith(p)}
                break
    cands = {k: v for k, v in cands.items() if v}
    uncovered = set(range(len(must)))
    chosen: list[str] = []
    costs = {k: len(escape(k[1:])) + 1 if k.startswith("^") else len(escape(k)) for k in cands}
    while uncovered:
        best = None
        for k, cov in cands.items():
            gain = len(cov & uncovered)
            if not gain:
                continue
            score = (costs[k] + 1) / gain
            if best is None or (score, costs[k], k) < best[0]:
                best = ((score, costs[k], k), k)
        if best is None:
            return None
        k = best[1]
        chosen.append(k)
        uncovered -= cands[k]
    # drop alternatives made redundant by later ones
    for k in list(chosen):
        rest = [c for c in chosen if c != k]
        if set().union(*(cands[c] for c in rest)) >= set(range(len(must))) if rest else False:
            chosen = rest
    return ["^" + escape(k[1:]) if k.startswith("^") else escape(k) for k in chosen]


def _alternation(parts: Sequence[str]) -> str:
    return "|".join(sorted(set(parts), key=lambda p: (len(p), p)))


# --- kind patterns (what follows blk\.N\.) --------------------------------------------------


def kind_patterns(must: Iterable[str], forbid: Iterable[str]) -> list[str]:
    """Patterns K, each anchored right after `blk\\.N\\.`, matching every `must` rest and no
    `forbid` rest: '' when nothing is forbidden, `.*sub1|...`, or a factored prefix list."""
    ms = sorted(set(must))
    fs = sorted(set(forbid))
    out: list[str] = []
    if not fs:
        out.append("")
    cover = substring_cover(ms, fs, anchored=False)
    if cover is not None:
        if len(cover) == 1:
            out.append(".*" + cover[0])
        else:
            out.append(".*(" + "|".join(sorted(cover)) + ")")
    prefixes = []
    for m in ms:
        for j in _boundaries(m)[1:]:
            if not any(f.startswith(m[:j]) for f in fs):
                prefixes.append(m[:j])
                break
        else:
            prefixes = []
            break
    if prefixes:
        out.append(_factor(sorted(set(prefixes))))
    return out


def _factor(words: list[str]) -> str:
    """`ffn_up_e`, `ffn_gate_e` -> `ffn_(up|gate)_e`: common prefix and suffix pulled out."""
    words = _minimal_prefixes(words)
    if len(words) == 1:
        return escape(words[0])
    pre = _common_prefix(words)
    rest = [w[len(pre):] for w in words]
    suf = _common_prefix([r[::-1] for r in rest])[::-1]
    if any(len(r) - len(suf) <= 0 for r in rest):
        suf = ""
    mid = [r[: len(r) - len(suf)] if suf else r for r in rest]
    if any(not m for m in mid):
        return escape(pre) + "(" + "|".join(escape(r) for r in rest) + ")"
    return escape(pre) + "(" + "|".join(escape(m) for m in mid) + ")" + escape(suf)


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
    return lo[:i]


# --- covering one device's tensors ---------------------------------------------------------


def cover(must: Sequence[Tensor], forbid: Sequence[Tensor]) -> list[str]:
    """Candidate regexes that match every `must` tensor name and no `forbid` one, shortest first."""
    if not must:
        return []
    m_split = [_split(t) for t in must]
    f_split = [_split(t) for t in forbid]
    options: list[str] = []

    # A. plain substrings of names (from the part after blk.N.), and ^prefixes
    sources = [x.rest for x in m_split] + (["blk."] if all(x.layer is not None for x in m_split) else [])
    sub = substring_cover([x.name for x in m_split], [x.name for x in f_split], sources=sources)
    if sub is not None:
        options.append(_alternation(sub))

    # B. rectangles for tensors in blocks, A. for the global ones
    blocks = [x for x in m_split if x.layer is not None]
    globals_ = [x for x in m_split if x.layer is None]
    parts: list[str] = []
    if globals_:
        g = substring_cover([x.name for x in globals_], [x.name for x in f_split])
        if g is None:
            g = ["^" + escape(x.name) + "$" for x in globals_]
        parts.extend(g)
    if blocks:
        rect = _rectangles(blocks, f_split)
        if rect is not None:
            parts.append(rect)
            options.append(_alternation(parts))
    # C. exact names: always possible
    options.append(_exact_names(must))
    return sorted(set(options), key=lambda r: (len(r), r))


def _exact_names(tensors: Sequence[Tensor]) -> str:
    return "^(" + "|".join(escape(t.name) for t in tensors) + ")$"


def _rectangles(blocks: list[_Names], forbid: list[_Names]) -> str | None:
    """`blk\\.L\\.K` terms, one per group of rests sharing a layer set, joined with `|`."""
    layers_of: dict[str, set[int]] = defaultdict(set)
    for x in blocks:
        assert x.layer is not None
        layers_of[x.rest].add(x.layer)
    groups: dict[frozenset[int], list[str]] = defaultdict(list)
    for rest, layer_set in layers_of.items():
        groups[frozenset(layer_set)].append(rest)
    forbid_by_layer: dict[int, list[str]] = defaultdict(list)
    for f in forbid:
        if f.layer is not None:
            forbid_by_layer[f.layer].append(f.rest)
    names_of: dict[str, list[str]] = defaultdict(list)
    for x in blocks:
        names_of[x.rest].append(x.name)
    forbid_names = [f.name for f in forbid]
    terms: list[str] = []
    for ls, rests in groups.items():
        best: str | None = None
        # the group may not need its layers named at all
        plain = substring_cover([n for r in rests for n in names_of[r]], forbid_names,
                                sources=rests, anchored=False)
        if plain is not None:
            best = _alternation(plain)
        inside = [r for layer in ls for r in forbid_by_layer.get(layer, ())]
        for k in kind_patterns(rests, inside):
            krx = re.compile(k)
            bad_layers = {layer for layer, rs in forbid_by_layer.items()
                          if layer not in ls and any(krx.match(r) for r in rs)}
            lrx = layer_set_regex(ls, bad_layers)
            term = r"blk\." + lrx + r"\." + k
            if best is None or len(term) < len(best):
                best = term
        if best is None:
            return None
        terms.append(best)
    return _alternation(terms)


# --- layouts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synthesis:
    items: tuple[OverrideItem, ...]

    @property
    def value(self) -> str:
        """The comma-joined `-ot` value ('' when no item is needed)."""
        return ",".join(it.render() for it in self.items)


def _device_order(devices: Iterable[str]) -> list[str]:
    return sorted(set(devices), key=lambda d: (d == "CPU", d))


def _verify(inv: Inventory, pl: Placement, items: Sequence[OverrideItem], ecmascript: bool = False) -> bool:
    matcher = ecmascript_matcher if ecmascript else python_matcher
    sim = simulate(inv, items, pl.defaults, matcher)
    return all(sim.devices[n] == d for n, d in pl.devices.items() if d is not None)


def top_level_alternatives(pattern: str) -> list[str]:
    """`a|b(c|d)|[|]e` -> ['a', 'b(c|d)', '[|]e']: split on `|` outside groups and classes."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _prune(inv: Inventory, pl: Placement, items: list[OverrideItem]) -> list[OverrideItem]:
    """Drop items, then alternatives inside items, whose removal keeps the placement (a
    carve-out nothing needs, a rectangle another one already covers)."""
    i = 0
    while i < len(items):
        trial = items[:i] + items[i + 1:]
        if _verify(inv, pl, trial):
            items = trial
        else:
            i += 1
    for i, it in enumerate(items):
        alts = top_level_alternatives(it.pattern)
        j = 0
        while len(alts) > 1 and j < len(alts):
            fewer = alts[:j] + alts[j + 1:]
            trial = [*items[:i], OverrideItem("|".join(fewer), it.device, it.origin), *items[i + 1:]]
            if _verify(inv, pl, trial):
                alts = fewer
                items = trial
            else:
                j += 1
    return items


def synthesize(pl: Placement) -> Synthesis:
    """The shortest verified item list for `pl`. Raises SynthesisError if none reproduces it."""
    inv = pl.inventory
    live = [t for t in inv.tensors if pl.devices[t.name] is not None]
    want = {t.name: pl.devices[t.name] for t in live}
    need = [t for t in live if want[t.name] != pl.defaults[t.name]]
    if not need:
        return Synthesis(())
    by_dev: dict[str, list[Tensor]] = defaultdict(list)
    for t in need:
        d = want[t.name]
        assert d is not None
        by_dev[d].append(t)

    layouts: list[list[OverrideItem]] = []
    # direct: one item per device, matching nothing that wants another device
    direct = []
    for d in _device_order(by_dev):
        forbid = [t for t in live if want[t.name] != d]
        direct.append(OverrideItem(cover(by_dev[d], forbid)[0], d))
    layouts.append(direct)

    # carved: a broad item for device B last; earlier items catch what it must not take
    need_names = {t.name for t in need}
    for broad_dev in by_dev:
        # how much the broad item may over-match, from anything to nearly nothing
        levels = [
            [],
            [t for t in live if want[t.name] == AUTO_GPU],
            [t for t in live if want[t.name] != broad_dev and t.name not in need_names],
        ]
        broads: list[str] = []
        for forbid_level in levels:
            for b in cover(by_dev[broad_dev], forbid_level)[:2]:
                if b not in broads:
                    broads.append(b)
        for broad in broads:
            rx = re.compile(broad)
            wrongly = [t for t in live if want[t.name] != broad_dev and rx.search(t.name)]
            if any(want[t.name] == AUTO_GPU for t in wrongly):
                continue  # those must match no rule at all: no carve-out can name their device
            extra: dict[str, list[Tensor]] = defaultdict(list)
            for t in wrongly:
                d = want[t.name]
                assert d is not None
                extra[d].append(t)
            items: list[OverrideItem] = []
            ok = True
            for d in _device_order(set(by_dev) | set(extra)):
                if d == broad_dev:
                    continue
                catch = by_dev.get(d, []) + extra.get(d, [])
                if not catch:
                    continue
                forbid = [t for t in live if want[t.name] != d]
                opts = cover(catch, forbid)
                if not opts:
                    ok = False
                    break
                items.append(OverrideItem(opts[0], d))
            if ok:
                layouts.append([*items, OverrideItem(broad, broad_dev)])

    best: list[OverrideItem] | None = None
    best_key: tuple[int, str] | None = None
    for layout in layouts:
        if not _verify(inv, pl, layout):
            continue
        layout = _prune(inv, pl, layout)
        value = ",".join(it.render() for it in layout)
        if best_key is None or (len(value), value) < best_key:
            best, best_key = layout, (len(value), value)
    if best is None:
        fallback = [OverrideItem(_exact_names(ts), d) for d, ts in by_dev.items()]
        if not _verify(inv, pl, fallback):
            raise SynthesisError("no rule list reproduces the placement (exact names failed too)")
        best = fallback
    return Synthesis(tuple(best))


def check(pl: Placement, synthesis: Synthesis) -> None:
    """Re-simulate the items against the inventory, under Python `re` and ECMAScript when the
    `regress` engine is installed; any disagreement is an internal error, never an output."""
    inv = pl.inventory
    for it in synthesis.items:
        bad = [c for c in (",", "=", " ", "\t", "{", "}") if c in it.pattern]
        if bad:
            raise SynthesisError(f"pattern {it.pattern!r} contains {bad[0]!r}")
    if not _verify(inv, pl, synthesis.items):
        raise SynthesisError(f"the compiled rules {synthesis.value!r} do not reproduce the placement")
    try:
        import regress  # noqa: F401
    except ImportError:
        return
    if not _verify(inv, pl, synthesis.items, ecmascript=True):
        raise SynthesisError(f"ECMAScript reads {synthesis.value!r} differently from Python re")
