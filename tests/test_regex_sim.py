r"""User regexes are simulated as libstdc++'s std::regex reads them, in bounded time, and never
raise: ECMAScript-only escapes, libstdc++-only refusals, catastrophic backtracking. Where a C++
compiler is present, every case is also checked against a real std::regex."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from moeconf.cli import main
from moeconf.engines import regex as rxmod
from moeconf.engines.regex import check_regex, ecmascript_search, misreadings, python_disagreement
from tests.conftest import EXAMPLES

NAMES = ["blk.0.q]}Aa-1", "aaaaaa", "ab", "b", "", "blk.12.ffn_up_exps.weight", "token_embd.weight", "a{",
         "k", "q", "A", "Z", "blk.1.attn_q.weight", "-", "{"]

# (pattern, None if std::regex refuses it, else which of NAMES it finds) -- read from libstdc++ 12
CASES: list[tuple[str, str | None]] = [
    (r'\q', '100000000100100'), ('[]', '000000000000000'), ('[^]', '111101111111111'), (r'\1', None),
    (r'(a)\2', None), ('a{,3}', None), ('a{', None), ('{', None), ('a{x}', None), (r'\k', '100001101000100'),
    (r'\c', None), (']', '100000000000000'), ('}', '100000000000000'), (r'\u0041', '100000000010000'),
    (r'\x4', None), (r'[\d-z]', None), ('a**', '111111111111111'), ('(?=a)', '111000010000100'), ('\\', None),
    ('a*+', '111111111111111'), ('a++', '111000010000100'), ('a{2}*', '111111111111111'),
    ('a{2}{3}', '010000000000000'), ('(?i)a', None), ('(?<=a)b', None), (r'\Ab', '000000000000000'),
    (r'a\Z', '000000000000000'), (r'\A', '100000000010000'), ('(?P<n>a)', None), (r'\p{L}', None),
    ('x|', '111111111111111'), ('a{2', None), ('[a-', None), ('(', None), (')', None), ('[z-a]', None),
    ('*a', None), ('a|*b', None), ('^*', None), ('a{3,2}', None), ('a{2,}', '010000000000000'),
    (r'(a\1)', None), (r'[a-\d]', None), (r'[\w-z]', None), ('[a-]', '111000010000110'),
    (r'\cA', '100000000010000'), (r'\u004', None), (r'[\q]', '100000000100100'), (r'\b+', None),
    ('(?=a)*', None), ('[', None), ('[]a]', '000000000000000'), (r'blk\.(1|2)\.', '000000000000100'),
    (r'^blk\.[0-9]+\.ffn_.*_exps\.weight$', '000001000000000'),
    (r'\.ffn_(up|down|gate)_(ch|)exps', '000001000000000'), (r'[\]]', '100000000000000'),
    ('a{1,3}?', '111000010000100'), ('(a|b)+', '111101110000100'),
]


@pytest.mark.parametrize(("pattern", "expected"), CASES, ids=[c[0] for c in CASES])
def test_reads_patterns_as_libstdcxx(pattern: str, expected: str | None) -> None:
    problem = check_regex(pattern)
    if expected is None:
        assert problem is not None and problem.refused, pattern
        return
    assert problem is None, problem
    found = ecmascript_search(pattern, NAMES)
    assert isinstance(found, frozenset)
    assert "".join("1" if n in found else "0" for n in NAMES) == expected


@pytest.fixture(scope="module")
def stdregex(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build a std::regex oracle")
    d = tmp_path_factory.mktemp("stdregex")
    src = d / "rx.cpp"
    src.write_text(
        "#include <regex>\n#include <iostream>\nint main(int argc, char** argv) {\n"
        "  try { std::regex r(argv[1]);\n"
        "    for (int i = 2; i < argc; i++) std::cout << (std::regex_search(argv[i], r) ? 1 : 0);\n"
        "    std::cout << \"\\n\"; } catch (std::regex_error&) { std::cout << \"ERR\\n\"; } }\n")
    exe = d / "rx"
    subprocess.run([cxx, "-O1", "-o", str(exe), str(src)], check=True, timeout=300)
    return exe


@pytest.mark.engine  # builds a C++ program (~15 s): runs with the engine suite
def test_cases_agree_with_a_real_std_regex(stdregex: Path) -> None:
    """The table above is what libstdc++ says (a compiler upgrade that changes it fails here)."""
    for pattern, expected in CASES:
        out = subprocess.run([str(stdregex), pattern, *NAMES], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        assert out == (expected or "ERR"), pattern


def test_never_raises_on_any_short_pattern() -> None:
    alphabet = ["\\", "[", "]", "(", ")", "{", "}", "*", "+", "?", "|", "^", "$", ".", "-", "a", "1", "q",
                "d", ",", ":", "=", "!", "<", "x", "c", "u"]
    import itertools

    rng = random.Random(8)
    short = ["".join(c) for n in (1, 2) for c in itertools.product(alphabet, repeat=n)]
    for p in short + ["".join(rng.choice(alphabet) for _ in range(rng.randint(3, 8))) for _ in range(2000)]:
        check_regex(p)
        misreadings(p)
        python_disagreement(p)
        r = ecmascript_search(p, NAMES, time_limit=1.0)
        assert isinstance(r, frozenset) or r.refused


@pytest.mark.parametrize("pattern", ["(.|.)*Q", "(a+)+$", "(a|aa)*c", "(x*)*y", ".*.*.*.*.*.*Q", "(\\w+\\.?)+Q"])
def test_catastrophic_patterns_are_reported_in_bounded_time(pattern: str) -> None:
    names = [f"blk.{i}.ffn_{k}_exps.weight" for i in range(61) for k in ("up", "down", "gate")]
    names += ["a" * 40 + "!", "x" * 40 + "!"]
    t = time.monotonic()
    r = ecmascript_search(pattern, names, time_limit=0.5)
    assert time.monotonic() - t < 3
    assert not isinstance(r, frozenset) and r.kind == "slow" and r.refused
    assert "takes too long to match" in r.message and "std::regex" in r.message


def test_cheap_patterns_are_not_reported() -> None:
    names = [f"blk.{i}.ffn_{k}_exps.weight" for i in range(61) for k in ("up", "down", "gate")]
    for p in [r"blk\.(1|2|3)\.ffn_.*_exps", "(ffn_(up|down)_exps)+", r"(\d+\.)+ffn", "exps"]:
        assert isinstance(ecmascript_search(p, names, time_limit=2.0), frozenset), p


def test_static_screen_decides_who_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cheap patterns never fork; a suspect one always does (a worker that lies is believed)."""
    calls: list[str] = []

    def fake_fork(pattern: str, names: tuple[str, ...], limit: float, why: str) -> frozenset[str]:
        calls.append(pattern)
        return frozenset(names[:1])

    monkeypatch.setattr(rxmod, "_search_forked", fake_fork)
    monkeypatch.setattr(rxmod, "_RESULTS", {})
    names = ["blk.0.ffn_up_exps.weight", "blk.1.ffn_up_exps.weight"]
    assert ecmascript_search(r"blk\.1\.", names) == frozenset({"blk.1.ffn_up_exps.weight"})
    assert ecmascript_search("(.|.)*exps", names) == frozenset({"blk.0.ffn_up_exps.weight"})
    assert calls == ["(.|.)*exps"]


def test_disagreements_with_python_are_said() -> None:
    assert "Python's re refuses it" in (python_disagreement(r"\q") or "")
    assert "matches nothing" in (python_disagreement("[]a]") or "")
    assert "any character" in (python_disagreement("[^]") or "")
    assert "anchor" in (python_disagreement(r"\Ablk") or "")
    assert "possessive" in (python_disagreement("a*+") or "")
    assert python_disagreement(r"blk\.\d+\.ffn_(up|down)_exps") is None
    assert [m.kind for m in misreadings(r"\Ablk")] == ["misread"]
    assert "letter 'A'" in misreadings(r"\Ablk")[0].message


MANIFEST = EXAMPLES / "models" / "qwen3-30b-a3b.manifest.json"


@pytest.mark.parametrize(("ot", "fragment", "code"), [
    (r"\qexps=CPU", "read as ECMAScript (std::regex), not as Python's re", 0),
    ("[]=CPU", "a class that matches nothing", 0),  # loads, matches nothing
    (r"\1=CPU", "back-reference \\1 to a group that does not exist", 1),
    ("(.|.)*Q=CPU", "takes too long to match", 1),
    (r"\Aexps=CPU", "reads \\A as the letter 'A'", 0),  # loads, means something else
])
def test_explain_on_hostile_patterns(capsys: pytest.CaptureFixture[str], ot: str, fragment: str,
                                     code: int) -> None:
    t = time.monotonic()
    got = main(["explain", str(MANIFEST), "--ot", ot])
    out, err = capsys.readouterr()
    assert time.monotonic() - t < 10
    assert fragment in out + err
    assert "Traceback" not in err
    assert got == code
