"""What C++ `std::regex` (ECMAScript grammar) accepts, and how it matches.

Matching is simulated with the `regress` engine (ECMAScript). `regress` follows ES2018+, which
has features `std::regex` lacks (lookbehind, named groups); those are reported as unsupported
before anything is matched, because the engine would throw when it compiles the pattern."""

from __future__ import annotations

import re
from dataclasses import dataclass

# (pattern, what it is) for syntax std::regex's ECMAScript grammar does not have
_UNSUPPORTED = [
    (re.compile(r"\(\?<[=!]"), "lookbehind (?<= / (?<!"),
    (re.compile(r"\(\?P?<[A-Za-z_]"), "a named group (?<name> / (?P<name>"),
    (re.compile(r"\(\?P[=>]"), "a Python named-group reference"),
    (re.compile(r"\(\?[aiLmsux-]+[):]"), "inline flags like (?i)"),
    (re.compile(r"\(\?>"), "an atomic group (?>"),
    (re.compile(r"(?<!\\)(?:\\\\)*\\[AZz]"), r"the anchors \A \Z \z"),
    (re.compile(r"(?<!\\)(?:\\\\)*\\[pP]\{"), r"Unicode classes \p{...}"),
    (re.compile(r"(?<![\\(])[*+?}]\+"), "a possessive quantifier (*+ ++ ?+)"),
]


@dataclass(frozen=True)
class RegexProblem:
    offset: int
    message: str
    kind: str  # "unsupported" | "invalid"


def check_regex(pattern: str) -> RegexProblem | None:
    """Why `std::regex(pattern, ECMAScript)` would not compile it, or None."""
    for rx, what in _UNSUPPORTED:
        m = rx.search(pattern)
        if m:
            return RegexProblem(m.start(), f"{what} is not in std::regex's ECMAScript grammar", "unsupported")
    import regress

    try:
        regress.Regex(pattern)
    except Exception as e:  # regress raises RegressError (a plain Exception subclass)
        return RegexProblem(0, f"not a valid ECMAScript regex: {str(e).rstrip('.')}", "invalid")
    return None
