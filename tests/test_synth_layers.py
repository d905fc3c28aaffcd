"""Layer-set regexes: exact on random universes, and as short as an exhaustive search."""

from __future__ import annotations

import itertools
import re

import regress
from hypothesis import example, given, settings
from hypothesis import strategies as st

from moeconf.synth.layers import DIGITS, Term, layer_set_regex, render_atom


def check_exact(must: set[int], forbid: set[int], regex: str) -> None:
    py = re.compile(r"blk\." + regex + r"\.")
    es = regress.Regex(r"blk\." + regex + r"\.")
    for n in must:
        assert py.search(f"blk.{n}.ffn_up_exps.weight"), (regex, n)
        assert es.find(f"blk.{n}.ffn_up_exps.weight") is not None, (regex, n)
    for n in forbid:
        assert not py.search(f"blk.{n}.ffn_up_exps.weight"), (regex, n)
        assert es.find(f"blk.{n}.ffn_up_exps.weight") is None, (regex, n)
    for bad in (",", "=", " ", "{", "}"):
        assert bad not in regex


@st.composite
def universes(draw: st.DrawFn, max_size: int = 1000) -> tuple[set[int], set[int]]:
    size = draw(st.integers(1, max_size))
    holes = draw(st.sets(st.integers(0, size - 1), max_size=size // 4))
    universe = set(range(size)) - holes or {0}
    must = draw(st.sets(st.sampled_from(sorted(universe)), min_size=1))
    return must, universe - must


@settings(max_examples=150, deadline=None)
@given(universes())
def test_matches_exactly_the_set(case: tuple[set[int], set[int]]) -> None:
    must, forbid = case
    check_exact(must, forbid, layer_set_regex(must, forbid))


@given(st.integers(1, 300), st.data())
@settings(max_examples=60, deadline=None)
def test_ranges(size: int, data: st.DataObject) -> None:
    lo = data.draw(st.integers(0, size - 1))
    hi = data.draw(st.integers(lo, size - 1))
    must = set(range(lo, hi + 1))
    forbid = set(range(size)) - must
    check_exact(must, forbid, layer_set_regex(must, forbid))


def test_known_answers() -> None:
    # 14..47 of 48 blocks: 48-99 do not exist, so 4[0-7] widens to 4\d
    assert layer_set_regex(range(14, 48), range(0, 14)) == r"(1[4-9]|[2-4]\d)"
    assert layer_set_regex([1, 3, 5, 6, 7], [0, 2, 4, 8, 9, 10, 11]) == "[135-7]"
    assert layer_set_regex(range(1, 47, 2), range(0, 47, 2)) == r"\d?[13579]"
    assert layer_set_regex([7], set(range(61)) - {7}) == "7"
    assert len(layer_set_regex(range(0, 31), range(31, 93))) <= len(r"([0-9]|[1-2][0-9]|30)")


# --- optimality against an exhaustive search over the same term space ----------------------

ATOMS = [frozenset(DIGITS[lo : hi + 1]) for lo in range(10) for hi in range(lo, 10)]


def all_terms(max_len: int) -> list[Term]:
    out = []
    for n in range(1, max_len + 1):
        for atoms in itertools.product(ATOMS, repeat=n):
            out.append(Term(tuple(atoms)))
            if n >= 2:
                out.append(Term(tuple(atoms), True))
    return out


TERMS_2 = all_terms(2)


def brute_force_optimum(must: set[int], forbid: set[int]) -> int:
    ms = sorted(str(n) for n in must)
    fs = [str(n) for n in forbid]
    valid = []
    for t in TERMS_2:
        if any(t.matches(f) for f in fs):
            continue
        mask = sum(1 << i for i, s in enumerate(ms) if t.matches(s))
        if mask:
            valid.append((mask, t.cost))
    full = (1 << len(ms)) - 1
    single = min((c for m, c in valid if m == full), default=None)
    inf = 10**9
    dp = [inf] * (full + 1)
    dp[0] = 0
    for mask in range(full + 1):
        if dp[mask] == inf:
            continue
        for m, c in valid:
            nm = mask | m
            if dp[mask] + c + 1 < dp[nm]:
                dp[nm] = dp[mask] + c + 1
    multi = dp[full] - 1 + 2
    return min(multi, single) if single is not None else multi


@settings(max_examples=40, deadline=None)
@given(universes(max_size=40).filter(lambda c: len(c[0]) <= 10))
# an optional first digit whose last atom is wide only for the shorter numbers: 1?[2-4]
@example(({2, 3, 4, 12}, {5, 6, 7, 8, 9, 10, 11}))
def test_no_longer_than_exhaustive_optimum(case: tuple[set[int], set[int]]) -> None:
    must, forbid = case
    ours = layer_set_regex(must, forbid)
    assert len(ours) <= brute_force_optimum(must, forbid), ours


def test_render_atom() -> None:
    assert render_atom(frozenset("5")) == "5"
    assert render_atom(frozenset(DIGITS)) == r"\d"
    assert render_atom(frozenset("12")) == "[12]"
    assert render_atom(frozenset("1234")) == "[1-4]"
    assert render_atom(frozenset("13567")) == "[135-7]"
