"""Find engine invocations in launch files: shell scripts, docker compose files, llama-swap
configs, .env files and systemd units. Each becomes a `Launch`: argv and env words with their
file positions, plus what the file says about the engine (directive, image, binary path)."""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from moeconf.engines.argvread import Arg
from moeconf.linting.shell import (
    MAX_EXPANSION,
    MAX_WORDS,
    Budget,
    Fixed,
    PosArg,
    PosMap,
    Segmented,
    ShellText,
    Word,
    leading_assignments,
    to_arg,
)

_BINARY = re.compile(r"(^|/)(llama-server|llama-cli|llama-completion|llama-mtmd-cli|llama-bench|server|main)(\.exe)?$")
_IMAGE = re.compile(r"(ggml-org/llama\.cpp|ik-llama-cpp|ik_llama|llama\.cpp:|llama-cpp)", re.I)
_DIRECTIVE = re.compile(r"#\s*moeconf:\s*(.*)$")
MAX_FILE_BYTES = 64 << 20  # larger files are skipped with a note: no launch file is this big
MAX_LAUNCHES = 256  # engine invocations linted per file; the rest are counted in a note
_ENGINE_ARGS = {"-ot", "--override-tensor", "-ngl", "--n-gpu-layers", "--gpu-layers", "--n-cpu-moe", "-ncmoe",
                "--cpu-moe", "-cmoe", "-m", "--model"}


@dataclass
class Launch:
    """One engine invocation found in a file."""

    path: str
    kind: str  # shell, compose, llama-swap, env, systemd
    line: int
    column: int
    args: list[Arg] = field(default_factory=list)  # binary first when known
    env: dict[str, Arg] = field(default_factory=dict)
    image: str | None = None
    name: str = ""  # service / model name
    has_binary: bool = True

    @property
    def end_line(self) -> int:
        return max([self.line, *(a.line for a in self.args), *(a.line for a in self.env.values())])


@dataclass(frozen=True)
class Note:
    """Something about the file itself rather than an engine invocation in it.

    kind: "invalid" (the file is broken: the tool that reads it would refuse it), "skipped" (not
    read: not a regular file, too large), "cannot-check" (a part whose value the file does not fix,
    or over a budget), "capped" (more of something than moeconf checks)."""

    kind: str
    line: int
    column: int
    message: str


@dataclass
class SourceFile:
    path: str
    text: str
    lines: list[str]
    directives: dict[int, dict[str, str]]  # line -> {key: value}; ignore[...] as key "ignore"
    launches: list[Launch]
    notes: list[Note] = field(default_factory=list)


def parse_directives(lines: list[str]) -> dict[int, dict[str, str]]:
    out: dict[int, dict[str, str]] = {}
    for n, line in enumerate(lines, start=1):
        if "moeconf" not in line or len(line) > 4096:  # a directive is short; a huge comment line is not one
            continue
        m = _DIRECTIVE.search(line)
        if not m:
            continue
        d: dict[str, str] = {}
        for part in re.findall(r"ignore\[[^\]]*\]|(?<![A-Za-z_])[A-Za-z_]+=\S+", m.group(1)):
            if part.startswith("ignore["):
                d["ignore"] = (d.get("ignore", "") + "," + part[7:-1]).strip(",")
            else:
                k, _, v = part.partition("=")
                d[k] = v
        out[n] = d
    return out


def _header_end(lines: list[str]) -> int:
    """The last line of the file's opening comment block (shebang and comments)."""
    n = 0
    for n, line in enumerate(lines, start=1):
        s = line.strip()
        if s and not s.startswith("#"):
            return n - 1
    return n


def file_directive(src: SourceFile, key: str, launch: Launch | None = None) -> str | None:
    """`# moeconf: key=value` for a launch: the last one inside the launch (or on the line just
    above it), else one in the file's opening comment block."""
    header = _header_end(src.lines)
    value = None
    for n in sorted(src.directives):
        if key not in src.directives[n]:
            continue
        if n <= header:
            value = value or src.directives[n][key]
    if launch is not None:
        for n in sorted(src.directives):
            if key in src.directives[n] and launch.line - 1 <= n <= launch.end_line and n > header:
                value = src.directives[n][key]
    return value


_MACRO = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")
_COMPOSE_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_TOO_LARGE = "an expansion too large to check"


def _substitute(text: str, macros: _Macros) -> tuple[str, list[tuple[int, int, int, int]], str]:
    """llama-swap's textual ${macro} substitution. Returns the text, its segments for `Segmented`
    (text start, original column - 1, step, length) and why it cannot be checked ("" if it can)."""
    out: list[str] = []
    segs: list[tuple[int, int, int, int]] = []
    size = 0
    last = 0
    why = ""
    for m in _MACRO.finditer(text):
        if m.group(1) not in macros:
            continue
        value = macros[m.group(1)]
        if value is None:
            why = _TOO_LARGE
            continue
        if m.start() > last:
            segs.append((size, last, 1, m.start() - last))
            out.append(text[last:m.start()])
            size += m.start() - last
        if value:
            segs.append((size, m.start(), 0, len(value)))
            out.append(value)
            size += len(value)
        last = m.end()
    if last < len(text):
        segs.append((size, last, 1, len(text) - last))
        out.append(text[last:])
    return "".join(out), segs, why


# --- shell -----------------------------------------------------------------------------------

def _engine_start(words: list[Word]) -> tuple[int, str | None] | None:
    """Where the engine's argv starts in a command (its binary), and a docker image if any.
    One pass from each end (a command may have thousands of words)."""
    _, i = leading_assignments(words)
    texts = [w.text for w in words]
    n = len(texts)
    engine_arg_after = [False] * (n + 1)  # some engine option follows word k
    image_at = [-1] * (n + 1)  # the first docker image at or after word k
    for k in range(n - 1, -1, -1):
        engine_arg_after[k] = engine_arg_after[k + 1] or texts[k] in _ENGINE_ARGS
        t = texts[k]
        image_at[k] = k if len(t) < 1024 and not t.startswith("-") and _IMAGE.search(t) else image_at[k + 1]
    for k in range(i, n):
        t = texts[k]
        if len(t) < 256 and _BINARY.search(t) and (t.rsplit("/", 1)[-1].startswith("llama") or
                                                   engine_arg_after[k + 1]):
            return k, None
        if t in ("run", "create") and k > 0 and texts[k - 1] == "docker" and image_at[k + 1] != -1:
            j = image_at[k + 1]
            return j, texts[j]
    return None


class _Collector:
    """Launches of one file, at most MAX_LAUNCHES of them; the rest are only counted."""

    def __init__(self, path: str, noun: str = "engine invocation(s)") -> None:
        self.path, self.noun = path, noun
        self.launches: list[Launch] = []
        self.notes: list[Note] = []
        self.more = 0
        self.first_more: tuple[int, int] = (0, 0)

    def add(self, launch: Launch) -> None:
        if len(self.launches) < MAX_LAUNCHES:
            self.launches.append(launch)
            return
        if not self.more:
            self.first_more = (launch.line, launch.column)
        self.more += 1

    def full(self) -> bool:
        return len(self.launches) >= MAX_LAUNCHES

    def finish(self) -> tuple[list[Launch], list[Note]]:
        if self.more:
            line, col = self.first_more
            self.notes.append(Note("capped", line, col, f"{self.more} more {self.noun} in this file were "
                                                        f"not linted (moeconf lints the first {MAX_LAUNCHES})"))
        return self.launches, self.notes


_MAYBE_ENGINE = re.compile(r"llama|server|main|docker|export|bench|completion|mtmd")
_BINARY_LINE = re.compile(r"^[^#\n]*?(?:^|[\s/'\"])(?:llama-server|llama-cli|llama-completion|llama-mtmd-cli|"
                          r"llama-bench|server|main)(?:\.exe)?(?=[\s'\"]|$)|^[^#\n]*docker\s+(?:run|create)\s", re.M)


def shell_launches(path: str, text: str, kind: str = "shell") -> tuple[list[Launch], list[Note]]:
    st = ShellText(text)
    st.interesting = lambda line: bool(_MAYBE_ENGINE.search(line))
    out = _Collector(path)
    notes: list[Note] = []
    exported: dict[str, Word] = {}
    for cmd in st.commands():
        ws = cmd.words
        if cmd.cut:
            if _engine_start(ws) is not None:
                line, col = ws[0].start
                notes.append(Note("cannot-check", line, col, f"cannot check this command: it has more than "
                                                             f"{MAX_WORDS:,} words"))
            continue
        if ws and ws[0].text == "export":
            for w in ws[1:]:
                if "=" in w.text:
                    var = w.text.split("=", 1)[0]
                    exported[var] = w.tail(len(var) + 1)
            continue
        start = _engine_start(ws)
        if start is None:
            continue
        k, image = start
        line, col = ws[k].start
        prefix_env, _ = leading_assignments(ws)
        env = {name: to_arg(w, path) for name, w in {**exported, **prefix_env}.items() if name.startswith("LLAMA_ARG")}
        if image:
            # docker run ... -e K=V ... IMAGE args: collect -e/--env values
            texts = [w.text for w in ws]
            for j in range(k):
                if texts[j] in ("-e", "--env") and j + 1 < k and "=" in texts[j + 1]:
                    w = ws[j + 1]
                    name = w.text.split("=", 1)[0]
                    env[name] = to_arg(w.tail(len(name) + 1), path)
            args = [to_arg(w, path) for w in ws[k + 1:]]
            out.add(Launch(path, kind, line, col, args=args, env=env, image=image, has_binary=False))
        else:
            args = [to_arg(w, path) for w in ws[k:]]
            out.add(Launch(path, kind, line, col, args=args, env=env))
        if out.full():
            st.skip_rest = cmd.line  # stop at the next command
    launches, capped = out.finish()
    notes += capped + [Note("invalid", p.line, p.column, p.message) for p in st.problems]
    if st.stopped_at is not None:
        # the rest is not read; say how many of its lines name an engine
        line = text.count("\n", 0, st.stopped_at) + 1
        more = sum(1 for _ in _BINARY_LINE.finditer(text, st.stopped_at))
        notes.append(Note("capped", line, 1, f"not read from here on: moeconf lints the first {MAX_LAUNCHES} engine "
                                             f"invocations of a file ({more} more line(s) below name an engine)"))
    return launches, notes


# --- YAML (compose, llama-swap) ----------------------------------------------------------------

class _Broken(Exception):
    """A YAML node of the wrong shape where compose or llama-swap needs a given one."""

    def __init__(self, node: Any, message: str, at: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.line: int = at[0] if at else node.start_mark.line + 1
        self.column: int = at[1] if at else node.start_mark.column + 1
        self.message = message


class _OverBudget(Exception):
    def __init__(self, node: Any) -> None:
        super().__init__("over budget")
        self.line = node.start_mark.line + 1
        self.column = node.start_mark.column + 1


class _YamlBudget(Budget):
    """Expansion budget plus a budget of scalar text read, so that aliases (one node reused
    many times) cannot multiply the work."""

    def __init__(self, text_size: int) -> None:
        super().__init__()
        self.work = 4 * text_size + (1 << 20)

    def take_work(self, n: int) -> bool:
        self.work -= n
        return self.work >= 0


def _shape(node: Any) -> str:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "a string"


def _scalar(node: Any, what: str, budget: _YamlBudget | None = None) -> str:
    """The text of a scalar node; anything else is an error (never str() of a collection: that
    would expand every alias in it)."""
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        raise _Broken(node, f"{what} must be a string, not {_shape(node)}")
    value = str(node.value)
    if budget is not None and not budget.take_work(len(value)):
        raise _OverBudget(node)
    return value


def _quote_offset(node: Any) -> int:
    return 1 if node.style in ("'", '"') else 0


def _scalar_args(node: Any, path: str, lines: list[str], variables: dict[str, str] | _Macros,
                 compose: bool, budget: _YamlBudget, what: str) -> tuple[list[Arg], str]:
    """A YAML scalar holding a command line: split like a shell, positions in the file. Also
    returns why it cannot be checked ("" if it can).

    Block scalars (`|`, `>`) are read from the file's own lines, one line at a time, so every
    word keeps its line and column; folding only joins lines with spaces, which a shell split
    does not distinguish from newlines."""
    value = _scalar(node, what, budget)
    style = node.style
    sl, sc = node.start_mark.line, node.start_mark.column
    pieces: list[tuple[str, PosMap, str]] = []
    why = ""
    if style in ("|", ">"):
        el = node.end_mark.line if node.end_mark.column == 0 else node.end_mark.line + 1
        for fl in range(sl + 1, min(el, len(lines))):
            raw = lines[fl]
            body = raw.lstrip()
            indent = len(raw) - len(body)
            if not compose and body.startswith("#"):
                continue  # llama-swap drops comment lines
            if body.endswith("\\"):
                body = body[:-1]
            pieces.append(_piece(body, fl + 1, indent, variables, compose))
    else:
        pieces.append(_piece(value, sl + 1, sc + _quote_offset(node), variables, compose))
    args: list[Arg] = []
    for text, posmap, piece_why in pieces:
        why = why or piece_why
        st = ShellText(text, variables if isinstance(variables, dict) else {}, posmap, assign=False, budget=budget)
        for cmd in st.commands():
            args.extend(to_arg(w, path) for w in cmd.words)
        if st.problems:
            p = st.problems[0]
            raise _Broken(node, f"{what}: {p.message}", (p.line, p.column))
    return args, why


def _piece(text: str, line: int, col0: int, variables: dict[str, str] | _Macros,
           compose: bool) -> tuple[str, PosMap, str]:
    if isinstance(variables, dict):
        return text.replace("$$", "$"), Fixed(line, col0), ""
    out, segs, why = _substitute(text, variables)
    return out, Segmented(line, col0, segs), why


def _compose_interpolate(value: str, variables: dict[str, str]) -> tuple[str, str]:
    """Compose's `${VAR}` / `$VAR` interpolation from `.env`; also returns which variable the
    value depends on when the file does not set it ("" if none)."""
    why = ""

    def sub(m: re.Match[str]) -> str:
        nonlocal why
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if name in variables and not (m.group(2) == ":-" and variables[name] == ""):
            return variables[name]
        if m.group(3) is not None:
            return m.group(3)
        why = why or f"the variable ${name}, which this file does not set"
        return m.group(0)

    return _COMPOSE_VAR.sub(sub, value), why


class _Macros:
    """llama-swap macros, expanded on use (macros may use macros, a few levels deep), within the
    file's budget: a macro whose expansion is too large reads as None."""

    def __init__(self, raw: dict[str, str], budget: Budget) -> None:
        self.raw, self.budget = raw, budget
        self.memo: dict[str, str | None] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.raw

    def __getitem__(self, name: str) -> str | None:
        if name not in self.memo:
            self.memo[name] = self._expand(self.raw[name])
        return self.memo[name]

    def _expand(self, value: str) -> str | None:
        for _ in range(5):
            size = len(value)
            too_large = False

            def sub(m: re.Match[str]) -> str:
                nonlocal size, too_large
                v = self.raw.get(m.group(1))
                if v is None or too_large:
                    return m.group(0)
                size += len(v)
                if size > MAX_EXPANSION or not self.budget.take(len(v)):
                    too_large = True
                    return ""
                return v

            new = _MACRO.sub(sub, value)
            if too_large:
                return None
            if new == value:
                break
            value = new
        return value


def _seq_args(node: Any, path: str, variables: dict[str, str], budget: _YamlBudget, what: str) -> list[Arg]:
    out: list[Arg] = []
    for item in node.value:
        v, why = _compose_interpolate(_scalar(item, f"each item of {what}", budget), variables)
        out.append(PosArg(v, path, item.start_mark.line + 1, item.start_mark.column + 1 + _quote_offset(item),
                          depends=why))
    return out


def _env_node(node: Any, path: str, variables: dict[str, str], budget: _YamlBudget, what: str) -> dict[str, Arg]:
    import yaml

    env: dict[str, Arg] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = _scalar(k, f"a name in {what}", budget)
            if isinstance(v, yaml.ScalarNode) and v.tag == "tag:yaml.org,2002:null":
                continue  # `KEY:` with no value: taken from the host's environment
            text, why = _compose_interpolate(_scalar(v, f"{what} {key}", budget), variables)
            env[key] = PosArg(text, path, v.start_mark.line + 1, v.start_mark.column + 1 + _quote_offset(v),
                              depends=why)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            text, why = _compose_interpolate(_scalar(item, f"each item of {what}", budget), variables)
            if "=" in text:
                k, _, v = text.partition("=")
                offset = _quote_offset(item) + len(k) + 1
                env[k] = PosArg(v, path, item.start_mark.line + 1, item.start_mark.column + 1 + offset, depends=why)
    elif not (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
        raise _Broken(node, f"{what} must be a mapping or a list of KEY=VALUE strings, not {_shape(node)}")
    return env


def _mapping_get(node: Any, key: str, depth: int = 0) -> Any:
    """`node[key]` for a YAML mapping, following `<<` merge keys (a few levels deep)."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return None
    merges: list[Any] = []
    for k, v in node.value:
        kv = getattr(k, "value", None)
        if kv == key:
            return v
        if kv == "<<" and depth < 8:
            merges.extend(v.value if isinstance(v, yaml.SequenceNode) else [v])
    for m in merges[:16]:
        found = _mapping_get(m, key, depth + 1)
        if found is not None:
            return found
    return None


def _keys(node: Any) -> list[Any]:
    import yaml

    return [k for k, _ in node.value if isinstance(k, yaml.ScalarNode)] if isinstance(node, yaml.MappingNode) else []


def _dotenv_vars(folder: str) -> dict[str, str]:
    p = os.path.join(folder, ".env")
    out: dict[str, str] = {}
    if not_regular(p) is None:
        try:
            text = read_regular(p)
        except OSError:
            return out
        for k, a in dotenv_entries(p, text).items():
            out[k] = a.text
    return out


# llama-swap's own top-level keys: a file with one of these is a llama-swap config for sure
_SWAP_KEYS = {"macros", "healthCheckTimeout", "groups", "startPort", "logLevel", "hooks", "includeAliasesInList",
              "metricsMaxInMemory", "logRequests", "apiKeys", "peers"}
_SWAP_MODEL_KEYS = {"cmd", "cmdStop", "proxy", "aliases", "env", "checkEndpoint", "ttl", "unlisted",
                    "filters", "macros", "name", "description", "concurrencyLimit", "useModelName", "metadata"}


MAX_YAML_NODES = 250_000  # nodes kept from one YAML file (a launch file has a few hundred)
_NULLS = {"", "~", "null", "Null", "NULL"}


class _Stop(Exception):
    """Stop reading the YAML stream here (a cap was reached); the note says why."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


def compose_limited(text: str) -> tuple[list[Any], Note | None]:
    """The YAML documents of `text` as PyYAML nodes (aliases shared, never copied), read from
    libyaml's event stream without recursion. Reading stops, with a note, after MAX_YAML_NODES
    nodes or after MAX_LAUNCHES entries of a top-level `services:` or `models:`: only what is
    read is linted. Raises yaml.MarkedYAMLError for a syntax error in the part read."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    roots: list[Any] = []
    anchors: dict[str, Any] = {}
    stack: list[list[Any]] = []  # [node, pending mapping key]
    count = 0
    note = None

    def add(node: Any, ev: Any) -> None:
        if not stack:
            roots.append(node)
            return
        top = stack[-1]
        if isinstance(top[0], yaml.SequenceNode):
            top[0].value.append(node)
        elif top[1] is None:
            top[1] = node
            if len(stack) == 2 and len(top[0].value) >= MAX_LAUNCHES:
                key, value = stack[0][0].value[-1]
                if value is top[0] and getattr(key, "value", None) in ("services", "models"):
                    raise _Stop(ev.start_mark.line + 1, f"not read from here on: moeconf lints the first "
                                                        f"{MAX_LAUNCHES} entries of `{key.value}:`")
        else:
            top[0].value.append((top[1], node))
            top[1] = None

    ev: Any  # libyaml's events and marks are not typed as PyYAML's
    try:
        for ev in yaml.parse(text, Loader=loader):
            sm: Any = ev.start_mark
            em: Any = ev.end_mark
            if isinstance(ev, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                count += 1
                if count > MAX_YAML_NODES:
                    raise _Stop(sm.line + 1, f"not read from here on: more than {MAX_YAML_NODES:,} YAML "
                                                        f"nodes, far more than a launch file holds")
            if isinstance(ev, yaml.ScalarEvent):
                tag = ev.tag or ("tag:yaml.org,2002:null" if ev.implicit[0] and ev.value in _NULLS
                                 else "tag:yaml.org,2002:str")
                node: Any = yaml.ScalarNode(tag, ev.value, sm, em, style=ev.style)
            elif isinstance(ev, yaml.SequenceStartEvent):
                node = yaml.SequenceNode(ev.tag or "tag:yaml.org,2002:seq", [], sm, em,
                                         flow_style=ev.flow_style)
            elif isinstance(ev, yaml.MappingStartEvent):
                node = yaml.MappingNode(ev.tag or "tag:yaml.org,2002:map", [], sm, em,
                                        flow_style=ev.flow_style)
            elif isinstance(ev, yaml.AliasEvent):
                target = anchors.get(str(ev.anchor))
                if target is None or any(e[0] is target for e in stack):
                    what = "undefined" if target is None else "recursive"
                    raise yaml.MarkedYAMLError(None, None, f"found {what} alias {ev.anchor!r}", sm)
                add(target, ev)
                continue
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                done = stack.pop()[0]
                done.end_mark = ev.end_mark
                continue
            elif isinstance(ev, yaml.DocumentStartEvent):
                anchors = {}
                continue
            else:
                continue
            if ev.anchor:
                anchors[ev.anchor] = node
            add(node, ev)
            if not isinstance(node, yaml.ScalarNode):
                stack.append([node, None])
    except _Stop as e:
        note = Note("capped", e.line, 1, e.message)
        while stack:
            stack.pop()
    return roots, note


def yaml_launches(path: str, text: str, lines: list[str] | None = None,
                  variables: dict[str, str] | None = None) -> tuple[list[Launch], list[Note]]:
    import yaml

    try:
        roots, stopped = compose_limited(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = " ".join(x for x in (e.context, e.problem) if x)
        return [], [Note("invalid", line, col, f"YAML syntax: {what}; fix the YAML (the tool that reads this "
                                               f"file would refuse it)")]
    except (yaml.YAMLError, RecursionError) as e:
        return [], [Note("invalid", 1, 1, f"YAML: {type(e).__name__}: cannot be read")]
    lines = text.split("\n") if lines is None else lines
    budget = _YamlBudget(len(text))
    out = _Collector(path, "service(s) or model(s)")
    for root in roots:
        try:
            if _mapping_get(root, "services") is not None:
                _compose(root, path, lines, budget, out, variables)
            elif _mapping_get(root, "models") is not None:
                _swap(root, path, lines, budget, out)
        except _Broken as e:
            out.notes.append(Note("invalid", e.line, e.column, e.message))
        except _OverBudget as e:
            out.notes.append(Note("cannot-check", e.line, e.column,
                                  "cannot check the rest of this file: its aliases expand to more text than "
                                  "moeconf reads (a YAML alias bomb?)"))
    launches, notes = out.finish()
    return launches, notes + ([stopped] if stopped else [])


def _compose(root: Any, path: str, lines: list[str], budget: _YamlBudget, out: _Collector,
             variables: dict[str, str] | None = None) -> None:
    """A compose file's services. `variables` are what compose interpolates (default: the `.env`
    file next to `path`)."""
    import yaml

    services = _mapping_get(root, "services")
    if isinstance(services, yaml.ScalarNode) and services.tag == "tag:yaml.org,2002:null":
        return
    if not isinstance(services, yaml.MappingNode):
        raise _Broken(services, f"compose `services:` must be a mapping of service names to services, "
                                f"not {_shape(services)}")
    if variables is None:
        variables = _dotenv_vars(os.path.dirname(os.path.abspath(path)))
    for name_node, svc in services.value:
        name = _scalar(name_node, "a service name", budget)
        if isinstance(svc, yaml.ScalarNode) and svc.tag == "tag:yaml.org,2002:null":
            continue
        if not isinstance(svc, yaml.MappingNode):
            raise _Broken(svc, f"service {name!r} must be a mapping, not {_shape(svc)}")
        if out.full():
            out.add(Launch(path, "compose", name_node.start_mark.line + 1, name_node.start_mark.column + 1))
            continue
        try:
            _compose_service(name_node, name, svc, path, lines, variables, budget, out)
        except _Broken as e:
            out.notes.append(Note("invalid", e.line, e.column, e.message))


def _compose_service(name_node: Any, name: str, svc: Any, path: str, lines: list[str], variables: dict[str, str],
                     budget: _YamlBudget, out: _Collector) -> None:
    import yaml

    image_node = _mapping_get(svc, "image")
    image = _scalar(image_node, f"service {name!r} image", budget) if image_node is not None else None
    args: list[Arg] = []
    has_binary = False
    whys = []
    for key in ("entrypoint", "command"):
        node = _mapping_get(svc, key)
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
            continue
        what = f"service {name!r} {key}"
        if isinstance(node, yaml.SequenceNode):
            args += _seq_args(node, path, variables, budget, what)
        else:
            got, why = _scalar_args(node, path, lines, variables, True, budget, what)
            args += got
            whys.append(why)
        if key == "entrypoint":
            has_binary = bool(args)
    env_node = _mapping_get(svc, "environment")
    env = _env_node(env_node, path, variables, budget, f"service {name!r} environment") if env_node is not None else {}
    engine_like = (image and len(image) < 1024 and _IMAGE.search(image)) or any(
        a.text in _ENGINE_ARGS for a in args) or any(k.startswith("LLAMA_ARG") for k in env)
    if not engine_like:
        return
    out.add(Launch(path, "compose", name_node.start_mark.line + 1, name_node.start_mark.column + 1,
                   args=args, env={k: v for k, v in env.items() if k.startswith("LLAMA_ARG")},
                   image=image, name=name, has_binary=has_binary))


def _swap(root: Any, path: str, lines: list[str], budget: _YamlBudget, out: _Collector) -> None:
    import yaml

    models = _mapping_get(root, "models")
    top = {k.value for k in _keys(root)}
    if isinstance(models, yaml.SequenceNode):
        looks_swap = bool(top & _SWAP_KEYS) or any(
            {k.value for k in _keys(m)} & (_SWAP_MODEL_KEYS | {"command"}) - {"name", "description", "metadata"}
            for m in models.value[:64])
        if looks_swap:
            raise _Broken(models, "llama-swap `models:` must be a mapping of model names to models, not a list: "
                                  "write `models:` then `  my-model:` with `cmd:` under it")
        return
    if not isinstance(models, yaml.MappingNode):
        if top & _SWAP_KEYS and not (isinstance(models, yaml.ScalarNode) and models.tag.endswith(":null")):
            raise _Broken(models, f"llama-swap `models:` must be a mapping of model names to models, "
                                  f"not {_shape(models)}")
        return
    if not top & _SWAP_KEYS and not any(
            {k.value for k in _keys(m)} & (_SWAP_MODEL_KEYS | {"command"}) - {"name", "description", "metadata"}
            for _, m in models.value[:64]):
        return  # some other tool's `models:` mapping
    macros: dict[str, str] = {}
    mnode = _mapping_get(root, "macros")
    if isinstance(mnode, yaml.MappingNode):
        for k, v in mnode.value:
            macros[_scalar(k, "a macro name", budget)] = _scalar(v, "each macro value", budget)
    elif mnode is not None and not (isinstance(mnode, yaml.ScalarNode) and mnode.tag.endswith(":null")):
        raise _Broken(mnode, f"llama-swap `macros:` must be a mapping, not {_shape(mnode)}")
    for name_node, model in models.value:
        if out.full():
            out.add(Launch(path, "llama-swap", name_node.start_mark.line + 1, name_node.start_mark.column + 1))
            continue
        try:
            _swap_model(name_node, model, macros, path, lines, budget, out)
        except _Broken as e:
            out.notes.append(Note("invalid", e.line, e.column, e.message))


def _swap_model(name_node: Any, model: Any, macros: dict[str, str], path: str, lines: list[str],
                budget: _YamlBudget, out: _Collector) -> None:
    import yaml

    name = _scalar(name_node, "a model name", budget)
    if not isinstance(model, yaml.MappingNode):
        raise _Broken(model, f"llama-swap model {name!r} must be a mapping with `cmd:`, not {_shape(model)}")
    cmd = _mapping_get(model, "cmd")
    if cmd is None:
        keys = [k for k in _keys(model) if k.value not in _SWAP_MODEL_KEYS]
        for k in keys:
            close = difflib.get_close_matches(str(k.value), ["cmd", "command"], n=1, cutoff=0.6)
            if close or str(k.value).lower() in ("command", "cmd"):
                raise _Broken(k, f"llama-swap model {name!r} has `{k.value}:` but no `cmd:`; did you mean `cmd:`?")
        return
    if isinstance(cmd, yaml.SequenceNode):
        raise _Broken(cmd, f"llama-swap model {name!r}: `cmd:` must be a string, not a list (llama-swap refuses "
                           f"a list); write it as a block scalar, `cmd: |` with one option a line")
    local = dict(macros)
    local.setdefault("PORT", "8080")
    lm = _mapping_get(model, "macros")
    if isinstance(lm, yaml.MappingNode):
        for k, v in lm.value:
            local[_scalar(k, "a macro name", budget)] = _scalar(v, "each macro value", budget)
    args, why = _scalar_args(cmd, path, lines, _Macros(local, budget), False, budget,
                             f"llama-swap model {name!r} cmd")
    if why:
        out.notes.append(Note("cannot-check", cmd.start_mark.line + 1, cmd.start_mark.column + 1,
                              f"cannot check model {name!r}: its cmd depends on {why}"))
        return
    env_node = _mapping_get(model, "env")
    env = _env_node(env_node, path, {}, budget, f"llama-swap model {name!r} env") if env_node is not None else {}
    out.add(Launch(path, "llama-swap", name_node.start_mark.line + 1, name_node.start_mark.column + 1,
                   args=args, env={k: v for k, v in env.items() if k.startswith("LLAMA_ARG")}, name=name))


# --- .env and systemd ------------------------------------------------------------------------

def dotenv_entries(path: str, text: str) -> dict[str, Arg]:
    env: dict[str, Arg] = {}
    for n, line in enumerate(text.split("\n"), start=1):
        s = line.strip()
        if not s or s.startswith("#") or "=" not in s:
            continue
        lead = len(line) - len(line.lstrip())
        body = line.lstrip()
        if body.startswith("export "):
            body = body[7:]
            lead += 7
        k, _, v = body.partition("=")
        col = lead + len(k) + 2
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
            col += 1
        env[k.strip()] = PosArg(v, path, n, col)
    return env


def dotenv_launches(path: str, text: str) -> list[Launch]:
    env = {k: v for k, v in dotenv_entries(path, text).items() if k.startswith("LLAMA_ARG")}
    if not env:
        return []
    first = min(env.values(), key=lambda a: a.line)
    return [Launch(path, "env", first.line, 1, args=[], env=env, has_binary=False)]


def systemd_launches(path: str, text: str) -> tuple[list[Launch], list[Note]]:
    lines = text.split("\n")
    env: dict[str, Arg] = {}
    out = _Collector(path)
    budget = Budget()
    # join continuation lines, remembering where each piece starts
    n = 0
    while n < len(lines):
        line = lines[n]
        start = n
        chunk = [(n, line)]
        while chunk[-1][1].rstrip().endswith("\\") and n + 1 < len(lines):
            n += 1
            chunk.append((n, lines[n]))
        n += 1
        key, eq, _ = line.partition("=")
        key = key.strip()
        if not eq:
            continue
        if key == "Environment":
            value_col = line.index("=") + 1
            st = ShellText(line[value_col:], position=Fixed(start + 1, value_col), assign=False, budget=budget)
            for c in st.commands():
                for w in c.words:
                    if "=" in w.text:
                        k = w.text.split("=", 1)[0]
                        if k.startswith("LLAMA_ARG"):
                            env[k] = to_arg(w.tail(len(k) + 1), path)
            out.notes += [Note("invalid", p.line, p.column, f"Environment=: {p.message}") for p in st.problems]
        elif key == "ExecStart":
            words: list[Word] = []
            problems = []
            for idx, (ln, content) in enumerate(chunk):
                col0 = content.index("=") + 1 if idx == 0 else 0
                piece = content[col0:].rstrip()
                if piece.endswith("\\"):
                    piece = piece[:-1]
                st = ShellText(piece, position=Fixed(ln + 1, col0), assign=False, budget=budget)
                for c in st.commands():
                    words.extend(c.words)
                problems += st.problems
            if problems:
                out.notes += [Note("invalid", p.line, p.column, f"ExecStart=: {p.message}") for p in problems]
                continue
            if not words:
                continue  # `ExecStart=` alone resets the list (drop-in files): nothing to lint
            first = words[0]
            first.lstrip("-@:+!")
            if not first.length:
                words = words[1:]
                if not words:
                    out.notes.append(Note("invalid", start + 1, line.index("=") + 2,
                                          "ExecStart= has only prefixes (-@:+!) and no command; "
                                          "give the command after them"))
                    continue
            first_line, first_col = words[0].start
            out.add(Launch(path, "systemd", first_line, first_col, args=[to_arg(w, path) for w in words]))
    launches, notes = out.finish()
    for la in launches:
        la.env = dict(env)
    return launches, notes


# --- dispatch --------------------------------------------------------------------------------

_FILE_TYPES = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def not_regular(path: str) -> str | None:
    """None for a regular file (or a link to one); else what it is, for a note. Only regular
    files are ever opened: a FIFO would block, a device never ends, opening some devices acts."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else "missing"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if stat.S_ISREG(st.st_mode):
        return None
    return _FILE_TYPES.get(stat.S_IFMT(st.st_mode), "not a regular file")


def read_regular(path: str, limit: int | None = None, *, newline: str | None = None) -> str:
    """Read a regular file (at most `limit` characters; `newline` as for open(): None translates
    CR-LF and CR to LF, "" keeps them). Raises OSError for anything else; the check is made on the
    open file (O_NONBLOCK: a FIFO swapped in after a stat cannot block)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8", errors="replace", newline=newline, closefd=False) as f:
            return f.read(limit) if limit is not None else f.read()
    finally:
        os.close(fd)


def kind_of(path: str, text: str | None = None) -> str | None:
    base = os.path.basename(path)
    low = base.lower()
    if low.endswith((".sh", ".bash", ".zsh")):
        return "shell"
    if low.endswith((".yml", ".yaml")):
        return "yaml"
    if low == ".env" or low.endswith(".env") or low.startswith(".env."):
        return "env"
    if low.endswith(".service"):
        return "systemd"
    if low.endswith(".toml") and low not in ("pyproject.toml", ".moeconf.toml"):
        return "plan"
    if "." not in base:
        head = text if text is not None else _head(path)
        if head.startswith("#!") and "sh" in head.split("\n", 1)[0]:
            return "shell"
    return None


def _head(path: str) -> str:
    if not_regular(path) is not None:
        return ""
    try:
        return read_regular(path, 200)
    except OSError:
        return ""


def read_source(path: str) -> SourceFile | None:
    """Launches in one file, or None if it is not a kind moeconf reads (plans are handled apart).
    The caller checks `not_regular` first; a file over MAX_FILE_BYTES gives a note only."""
    if os.path.getsize(path) > MAX_FILE_BYTES:
        kind = kind_of(path, "")
        if kind is None or kind == "plan":
            return None
        note = Note("skipped", 1, 1, f"not read: larger than {MAX_FILE_BYTES >> 20} MiB, far more than any "
                                     f"launch file; split it")
        return SourceFile(path, "", [], {}, [], [note])
    raw = read_regular(path, newline="")
    text = raw.replace("\r\n", "\n").replace("\r", "\n")  # as open() reads it: lines as their author meant them
    kind = kind_of(path, text)
    if kind is None or kind == "plan":
        return None
    lines = text.split("\n")
    if kind == "shell":
        launches, notes = shell_launches(path, text)
        crlf = _crlf_note(raw) if launches else None
        if crlf is not None:
            notes = [crlf, *notes]
    elif kind == "yaml":
        launches, notes = yaml_launches(path, text, lines)
    elif kind == "env":
        launches, notes = dotenv_launches(path, text), []
    else:
        launches, notes = systemd_launches(path, text)
    return SourceFile(path, text, lines, parse_directives(lines), launches, notes)


def _crlf_note(text: str) -> Note | None:
    """Windows line endings in a shell script: bash takes a line's CR as part of its last word, and a
    backslash before CR-LF escapes the CR instead of continuing the line. moeconf reads the lines as
    the author meant them; bash does not run that command."""
    cont = text.find("\\\r\n")
    first = text.find("\r\n")
    if first < 0:
        return None
    fix = "convert the file to LF line endings (dos2unix FILE, or sed -i 's/\\r$//' FILE)"
    if cont >= 0:
        line = text.count("\n", 0, cont) + 1
        col = cont - (text.rfind("\n", 0, cont) + 1) + 1
        return Note("invalid", line, col, "Windows (CR-LF) line endings: bash reads this backslash as escaping the CR, "
                                          "not as a line continuation, so the command ends on this line and the "
                                          f"lines after it run as commands of their own, their flags never reaching "
                                          f"the engine; {fix}")
    line = text.count("\n", 0, first) + 1
    word = text[:first].rsplit(None, 1)[-1] if text[:first].strip() else ""
    col = first - (text.rfind("\n", 0, first) + 1) + 1 - len(word)
    return Note("invalid", line, max(col, 1), f"Windows (CR-LF) line endings: bash keeps the CR in each line's last "
                                              f"word, so the command gets {word + chr(13)!r}, not {word!r}; {fix}")


def walk(paths: list[str]) -> Iterator[str]:
    """Files to lint under `paths` (directories searched, hidden folders skipped). Special files
    and broken links named like launch files are yielded too, for the caller to note and skip;
    symbolic links to directories are not followed."""
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__"))
                for f in sorted(files):
                    fp = os.path.join(root, f)
                    if kind_of(fp) is not None or (not_regular(fp) is not None and kind_of(fp, "") is not None):
                        yield fp
        else:
            yield p
