"""The shortest regex for a set of block numbers, used between `blk\\.` and `\\.`.

The regex must match the decimal string of every number in `must`, and of no number in
`forbid`; every other string (numbers the model does not have, leading zeros) is a don't-care,
which is what makes `14..47 of 48` come out as `(1[4-9]|[2-4]\\d)`.

The search space is alternations of *terms*; a term is a sequence of digit atoms (a digit `5`, a
range class `[1-3]`, or `\\d`), optionally with a leading `?` atom (`[12]?\\d` covers 0-29).
Valid terms are enumerated with pruning, then a weighted set cover picks the cheapest
alternation: exactly (branch and bound) for small sets, greedily with a clean-up pass otherwise.
No regex contains `,`, `=`, whitespace or `{}` quantifiers, so it survives `-ot` parsing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from operator import eq

DIGITS = "0123456789"


@cache
def _atoms() -> tuple[frozenset[str], ...]:
    """Contiguous digit ranges: singletons, [a-b] classes, and \\d."""
    out = []
    for lo in range(10):
        for hi in range(lo, 10):
            out.append(frozenset(DIGITS[lo : hi + 1]))
    return tuple(out)


def render_atom(atom: frozenset[str]) -> str:
    """A digit set as the shortest of `5`, `\\d` or a class: runs of three or more as `a-c`."""
    ds = sorted(atom)
    if len(ds) == 10:
        return r"\d"
    if len(ds) == 1:
        return ds[0]
    parts: list[str] = []
    run = [ds[0]]
    for d in ds[1:]:
        if int(d) == int(run[-1]) + 1:
            run.append(d)
            continue
        parts.append(_run(run))
        run = [d]
    parts.append(_run(run))
    return "[" + "".join(parts) + "]"


def _run(run: list[str]) -> str:
    return f"{run[0]}-{run[-1]}" if len(run) >= 3 else "".join(run)


@dataclass(frozen=True)
class Term:
    atoms: tuple[frozenset[str], ...]
    optional_first: bool = False

    def render(self) -> str:
        parts = [_atom_str(a) for a in self.atoms]
        if self.optional_first:
            parts[0] += "?"
        return "".join(parts)

    @property
    def cost(self) -> int:
        return len(self.render())

    def matches(self, s: str) -> bool:
        n = len(self.atoms)
        if len(s) == n:
            return all(c in a for c, a in zip(s, self.atoms, strict=True))
        if self.optional_first and len(s) == n - 1:
            return all(c in a for c, a in zip(s, self.atoms[1:], strict=True))
        return False


_ATOM_STR: dict[frozenset[str], str] = {}


def _atom_str(a: frozenset[str]) -> str:
    r = _ATOM_STR.get(a)
    if r is None:
        r = _ATOM_STR[a] = render_atom(a)
    return r


@cache
def _atom_index() -> dict[tuple[int, int], int]:
    return {(int(min(a)), int(max(a))): k for k, a in enumerate(_atoms())}


def _enumerate(length: int, must: list[str], forbid: list[str],
               shorter: Iterable[str] = (), short_forbid: Iterable[str] = ()) -> list[tuple[tuple[int, ...], int]]:
    """Products of atoms (as indices into `_atoms()`) of this length that cover >= 1 of `must`
    and none of `forbid`, with the bitmask (over `must`) of what each covers. Atoms that another
    atom beats at no higher cost are skipped: an atom whose end digit no remaining must-string
    has there is no better than the one trimmed to such digits (a trimmed range never costs more,
    except that `\\d` stays), and in the last position, of the ranges of three or more digits
    (all `[a-c]`, five characters) only the widest that avoids the forbidden digits is needed.
    `shorter`: the must-strings one digit shorter, which a product with an optional first atom
    also covers through its other atoms; their digits count as wanted at the position after."""
    atoms = _atoms()
    index = _atom_index()
    dm = [[0] * 10 for _ in range(length)]
    df = [[0] * 10 for _ in range(length)]
    for i, s in enumerate(must):
        for p, c in enumerate(s):
            dm[p][ord(c) - 48] |= 1 << i
    for i, s in enumerate(forbid):
        for p, c in enumerate(s):
            df[p][ord(c) - 48] |= 1 << i
    wanted_short: list[set[int]] = [set() for _ in range(length)]
    for s in shorter:
        for p, c in enumerate(s):
            wanted_short[p + 1].add(ord(c) - 48)
    # digits that end a forbidden string one shorter: an optional-first form must avoid them too
    short_bad = {ord(s[-1]) - 48 for s in short_forbid if s}
    m_masks = [[0] * len(atoms) for _ in range(length)]
    f_masks = [[0] * len(atoms) for _ in range(length)]
    for p in range(length):
        for (lo, hi), k in index.items():
            mm = ff = 0
            for d in range(lo, hi + 1):
                mm |= dm[p][d]
                ff |= df[p][d]
            m_masks[p][k] = mm
            f_masks[p][k] = ff
    all_digits = index[(0, 9)]
    out: list[tuple[tuple[int, ...], int]] = []

    def choices(pos: int, m: int, f: int) -> list[int]:
        ds = [d for d in range(10) if dm[pos][d] & m or d in wanted_short[pos]]
        if pos < length - 1:
            ks = {index[(lo, hi)] for x, lo in enumerate(ds) for hi in ds[x:]}
            ks.add(all_digits)
            return list(ks)
        bad = {d for d in range(10) if df[pos][d] & f}
        picks = last_choices(ds, bad)
        if short_bad - bad:
            picks = list({*picks, *last_choices(ds, bad | short_bad)})
        return picks

    def last_choices(ds: list[int], bad: set[int]) -> list[int]:
        if not bad:
            return [all_digits, *(index[(d, d)] for d in ds), *(index[(d, d + 1)] for d in ds if d + 1 in ds)]
        ks = set()
        for d in ds:
            if d in bad:
                continue
            ks.add(index[(d, d)])
            if d + 1 in ds and d + 1 not in bad:
                ks.add(index[(d, d + 1)])
        run: list[int] = []
        for d in [*range(10), -1]:
            if d >= 0 and d not in bad:
                run.append(d)
                continue
            inside = [x for x in run if x in ds]
            if len(inside) >= 2 and inside[-1] - inside[0] >= 2:
                ks.add(index[(inside[0], inside[-1])])
            run = []
        return list(ks)

    def rec(pos: int, m: int, f: int, chosen: tuple[int, ...]) -> None:
        mm, fm = m_masks[pos], f_masks[pos]
        last = pos == length - 1
        for k in choices(pos, m, f):
            m2 = m & mm[k]
            if not m2:
                continue
            if last:
                if not f & fm[k]:
                    out.append(((*chosen, k), m2))
            else:
                rec(pos + 1, m2, f & fm[k], (*chosen, k))

    rec(0, (1 << len(must)) - 1, (1 << len(forbid)) - 1, ())
    return out


def candidate_terms(must: Iterable[str], forbid: Iterable[str]) -> list[tuple[Term, frozenset[str]]]:
    """Valid terms with the must-strings each covers, dominated ones removed."""
    must_l, kept = _candidates(must, forbid)
    return [(t, frozenset(must_l[i] for i in range(len(must_l)) if cov >> i & 1)) for t, _c, cov in kept]


def _candidates(must: Iterable[str], forbid: Iterable[str]) -> tuple[list[str], list[tuple[Term, int, int]]]:
    """(must strings in bit order, [(term, cost, coverage bitmask)]) with dominated terms removed."""
    atoms = _atoms()
    astr = [_atom_str(a) for a in atoms]
    must_l = sorted(set(must), key=lambda s: (len(s), s))
    index = {s: i for i, s in enumerate(must_l)}
    forbid_s = set(forbid)
    by_len_m: dict[int, list[str]] = {}
    by_len_f: dict[int, list[str]] = {}
    for s in must_l:
        by_len_m.setdefault(len(s), []).append(s)
    for s in forbid_s:
        by_len_f.setdefault(len(s), []).append(s)
    # (atom indices, optional first) -> coverage bitmask over must_l
    terms: dict[tuple[tuple[int, ...], bool], int] = {}
    # for the optional-first forms: which shorter strings the rest of a product covers (None: it
    # also covers a forbidden one)
    rest_cov: dict[tuple[int, ...], int | None] = {}
    for n, ms in sorted(by_len_m.items()):
        offset = index[ms[0]]  # must_l is sorted by length: each length's strings are contiguous
        shorter = by_len_m.get(n - 1) if n >= 2 else None
        if shorter:
            short_idx = [index[s] for s in shorter]
            short_f = by_len_f.get(n - 1, [])
        for ats, mask in _enumerate(n, ms, by_len_f.get(n, []), shorter or (),
                                    by_len_f.get(n - 1, []) if shorter else ()):
            cov = mask << offset
            terms[(ats, False)] = cov
            # the same term with an optional first atom also covers shorter strings
            if not shorter:
                continue
            rest = ats[1:]
            extra = rest_cov.get(rest, 0)
            if rest not in rest_cov:
                rest_atoms = [atoms[k] for k in rest]
                if any(all(c in a for c, a in zip(s, rest_atoms, strict=True)) for s in short_f):
                    extra = None
                else:
                    extra = 0
                    for s, gi in zip(shorter, short_idx, strict=True):
                        if all(c in a for c, a in zip(s, rest_atoms, strict=True)):
                            extra |= 1 << gi
                rest_cov[rest] = extra
            if extra:
                terms[(ats, True)] = cov | extra
    # dominance: drop a term when another covers a superset at no higher cost
    cheapest: dict[int, tuple[int, str, tuple[tuple[int, ...], bool]]] = {}
    get = cheapest.get
    for key_t, cov in terms.items():
        ats, opt = key_t
        r = "".join(map(astr.__getitem__, ats))
        if opt:
            r = r[: len(astr[ats[0]])] + "?" + r[len(astr[ats[0]]):]
        old = get(cov)
        if old is None or (len(r), r) < old[:2]:
            cheapest[cov] = (len(r), r, key_t)
    # cheapest first, then the widest, then by text (one term per text: no two items tie)
    items = sorted((c, -cov.bit_count(), r, t, cov) for cov, (c, r, t) in cheapest.items())
    kept: list[tuple[Term, int, int]] = []
    # kept masks indexed by each bit they cover: a superset of `cov` holds every bit of cov,
    # so only the shortest of those lists needs checking
    by_bit: dict[int, list[int]] = {}
    no: list[int] = []
    for c, _, _, (ats, opt), cov in items:
        lo = by_bit.get(cov & -cov, no)
        hi = by_bit.get(1 << (cov.bit_length() - 1), no)
        supersets = lo if len(lo) < len(hi) else hi
        if any(map(eq, map(cov.__or__, supersets), supersets)):  # cov | c2 == c2: c2 holds cov
            continue
        kept.append((Term(tuple(map(atoms.__getitem__, ats)), opt), c, cov))
        m = cov
        while m:
            low = m & -m
            by_bit.setdefault(low, []).append(cov)
            m ^= low
    return must_l, kept


def _join(terms: list[Term]) -> str:
    rendered = sorted((t.render() for t in terms), key=_sort_key)
    if len(rendered) == 1:
        return rendered[0]
    return "(" + "|".join(rendered) + ")"


def _sort_key(s: str) -> tuple[int, str]:
    # shorter numbers first, then lexically: (1[4-9]|[2-4]\d) reads in layer order
    return (len(s.replace("\\d", "d").replace("?", "")), s)


_Cand = tuple[Term, int, int]  # term, cost, coverage bitmask


def _greedy(universe: int, cands: list[_Cand]) -> list[_Cand]:
    uncovered = universe
    chosen: list[_Cand] = []
    while uncovered:
        best = min(
            (c for c in cands if c[2] & uncovered),
            key=lambda c: ((c[1] + 1) / (c[2] & uncovered).bit_count(), c[1], c[0].render()),
        )
        chosen.append(best)
        uncovered &= ~best[2]
    # clean-up: drop terms made redundant by later picks
    changed = True
    while changed:
        changed = False
        for i in range(len(chosen)):
            others = 0
            for j, c in enumerate(chosen):
                if j != i:
                    others |= c[2]
            if universe & ~others == 0:
                del chosen[i]
                changed = True
                break
    return chosen


def _exact(universe: int, cands: list[_Cand], upper: int, node_limit: int) -> list[_Cand] | None:
    """Branch and bound over covers minimising sum(cost + 1); None if it found nothing better."""
    best: list[list[_Cand] | None] = [None]
    best_cost = [upper]
    nodes = [0]
    covering: dict[int, list[_Cand]] = {}
    for c in cands:
        m = c[2]
        while m:
            low = m & -m
            covering.setdefault(low, []).append(c)
            m ^= low
    min_cost = min(c[1] + 1 for c in cands)
    max_cover = max(c[2].bit_count() for c in cands)

    def rec(uncovered: int, chosen: list[_Cand], cost: int) -> None:
        nodes[0] += 1
        if nodes[0] > node_limit:
            return
        if not uncovered:
            if cost < best_cost[0]:
                best_cost[0] = cost
                best[0] = list(chosen)
            return
        lower = cost + -(-uncovered.bit_count() // max_cover) * min_cost
        if lower >= best_cost[0]:
            return
        pivot = -1
        fewest = 1 << 30
        m = uncovered
        while m:
            low = m & -m
            n = len(covering[low])
            if n < fewest:
                pivot, fewest = low, n
            m ^= low
        options = sorted(covering[pivot], key=lambda c: (c[1] + 1) / (c[2] & uncovered).bit_count())
        for c in options:
            chosen.append(c)
            rec(uncovered & ~c[2], chosen, cost + c[1] + 1)
            chosen.pop()

    rec(universe, [], 0)
    return best[0]


def _merge(terms: list[Term]) -> list[Term]:
    """Merge terms that differ only in one position into one with a wider class, while that is
    shorter. The union of such products is exactly the merged product, so it stays valid."""
    terms = list(terms)
    while True:
        best: tuple[int, list[Term], Term] | None = None
        for k in range(max((len(t.atoms) for t in terms), default=0)):
            groups: dict[tuple[object, ...], list[Term]] = {}
            for t in terms:
                if k < len(t.atoms):
                    key = (len(t.atoms), t.optional_first, t.atoms[:k], t.atoms[k + 1 :])
                    groups.setdefault(key, []).append(t)
            for group in groups.values():
                if len(group) < 2:
                    continue
                atoms = list(group[0].atoms)
                atoms[k] = frozenset().union(*(t.atoms[k] for t in group))
                merged = Term(tuple(atoms), group[0].optional_first)
                saving = sum(t.cost + 1 for t in group) - 1 - merged.cost
                # ties merge too: one class reads better than an alternation of digits
                if saving >= 0 and (best is None or saving > best[0]):
                    best = (saving, group, merged)
        if best is None:
            return terms
        _, group, merged = best
        terms = [t for t in terms if t not in group] + [merged]


def layer_set_regex(must: Iterable[int], forbid: Iterable[int]) -> str:
    """Shortest regex (in the term space above) for the decimal strings of `must` that matches
    none of `forbid`. Every other number is a don't-care. `must` must not be empty."""
    return _layer_set_regex(frozenset(must), frozenset(forbid))


@cache
def _layer_set_regex(must: frozenset[int], forbid: frozenset[int], node_limit: int = 20000) -> str:
    must_s = frozenset(str(n) for n in must)
    forbid_s = frozenset(str(n) for n in forbid)
    if not must_s:
        raise ValueError("layer_set_regex needs at least one number to match")
    if must_s & forbid_s:
        raise ValueError(f"numbers both required and forbidden: {sorted(must_s & forbid_s, key=int)}")
    must_l, cands = _candidates(must_s, forbid_s)
    universe = (1 << len(must_l)) - 1
    # a single term covering everything needs no group
    single = [c for c in cands if c[2] == universe]
    best_single = min(single, key=lambda c: (c[1], c[0].render()))[0] if single else None
    greedy = _greedy(universe, cands)
    multi = greedy
    exact = _exact(universe, cands, sum(c[1] + 1 for c in greedy), node_limit)
    if exact is not None:
        multi = exact
    multi_t = [c[0] for c in multi]
    greedy_t = [c[0] for c in greedy]
    options = [multi_t, _merge(multi_t), _merge(greedy_t)]
    if best_single is not None:
        options.append([best_single])
    return min((_join(o) for o in options), key=lambda r: (len(r), r.count("|"), r))
