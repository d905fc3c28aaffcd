"""Find engine invocations in launch files: shell scripts, docker compose files, llama-swap
configs, .env files and systemd units. Each becomes a `Launch`: argv and env words with their
file positions, plus what the file says about the engine (directive, image, binary path)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from moeconf.engines.cmdline import Arg
from moeconf.linting.shell import PosArg, Word, leading_assignments, split_commands, to_arg

_BINARY = re.compile(r"(^|/)(llama-server|llama-cli|llama-completion|llama-mtmd-cli|llama-bench|server|main)(\.exe)?$")
_IMAGE = re.compile(r"(ggml-org/llama\.cpp|ik-llama-cpp|ik_llama|llama\.cpp:|llama-cpp)", re.I)
_DIRECTIVE = re.compile(r"#\s*moeconf:\s*(.*)$")
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


@dataclass
class SourceFile:
    path: str
    text: str
    lines: list[str]
    directives: dict[int, dict[str, str]]  # line -> {key: value}; ignore[...] as key "ignore"
    launches: list[Launch]


def parse_directives(lines: list[str]) -> dict[int, dict[str, str]]:
    out: dict[int, dict[str, str]] = {}
    for n, line in enumerate(lines, start=1):
        m = _DIRECTIVE.search(line)
        if not m:
            continue
        d: dict[str, str] = {}
        for part in re.findall(r"ignore\[[^\]]*\]|[A-Za-z_]+=\S+", m.group(1)):
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


PosFn = Callable[[int, int], tuple[int, int]]


def _on_line(position: PosFn, line: int) -> PosFn:
    """A position function for one line of text cut out of a larger mapping."""
    return lambda _ln, col: position(line, col)


def _fixed(line: int, col0: int) -> PosFn:
    return lambda _ln, col: (line, col0 + col)


def _mapped(line: int, col0: int, cols: list[int]) -> PosFn:
    """Positions in text whose characters came from columns `cols` of the original line."""
    return lambda _ln, col: (line, col0 + (cols[col - 1] if 0 < col <= len(cols) else col))


def _substitute(text: str, macros: dict[str, str]) -> tuple[str, list[int]]:
    """llama-swap's textual ${macro} substitution, with the original column of each character."""
    out: list[str] = []
    cols: list[int] = []
    i = 0
    while i < len(text):
        m = re.match(r"\$\{([A-Za-z0-9_.-]+)\}", text[i:])
        if m and m.group(1) in macros:
            for ch in macros[m.group(1)]:
                out.append(ch)
                cols.append(i + 1)
            i += m.end()
            continue
        out.append(text[i])
        cols.append(i + 1)
        i += 1
    return "".join(out), cols


# --- shell -----------------------------------------------------------------------------------

def _engine_start(words: list[Word]) -> tuple[int, str | None] | None:
    """Where the engine's argv starts in a command (its binary), and a docker image if any."""
    _, i = leading_assignments(words)
    texts = [w.text for w in words]
    for k in range(i, len(texts)):
        t = texts[k]
        if _BINARY.search(t) and (t.rsplit("/", 1)[-1].startswith("llama") or
                                  any(a in _ENGINE_ARGS for a in texts[k + 1:])):
            return k, None
        if t in ("run", "create") and k > 0 and texts[k - 1] == "docker":
            for j in range(k + 1, len(texts)):
                if _IMAGE.search(texts[j]) and not texts[j].startswith("-"):
                    return j, texts[j]
    return None


def shell_launches(path: str, text: str, kind: str = "shell") -> list[Launch]:
    commands, _ = split_commands(text)
    out: list[Launch] = []
    exported: dict[str, Word] = {}
    for cmd in commands:
        ws = cmd.words
        if ws and ws[0].text == "export":
            for w in ws[1:]:
                if "=" in w.text:
                    var = w.text.split("=", 1)[0]
                    exported[var] = Word(w.chars[len(var) + 1:], w.pos[len(var) + 1:], w.quoted)
            continue
        start = _engine_start(ws)
        if start is None:
            continue
        k, image = start
        line, col = ws[k].pos[0]
        prefix_env, _ = leading_assignments(ws)
        env = {name: to_arg(w, path) for name, w in {**exported, **prefix_env}.items() if name.startswith("LLAMA_ARG")}
        if image:
            # docker run ... -e K=V ... IMAGE args: collect -e/--env values
            texts = [w.text for w in ws]
            for j in range(k):
                if texts[j] in ("-e", "--env") and j + 1 < k and "=" in texts[j + 1]:
                    w = ws[j + 1]
                    name = w.text.split("=", 1)[0]
                    env[name] = to_arg(Word(w.chars[len(name) + 1:], w.pos[len(name) + 1:]), path)
            args = [to_arg(w, path) for w in ws[k + 1:]]
            out.append(Launch(path, kind, line, col, args=args, env=env, image=image, has_binary=False))
        else:
            args = [to_arg(w, path) for w in ws[k:]]
            out.append(Launch(path, kind, line, col, args=args, env=env))
    return out


# --- YAML (compose, llama-swap) ----------------------------------------------------------------

def _scalar_args(node: Any, path: str, lines: list[str], variables: dict[str, str],
                 compose: bool) -> list[Arg]:
    """A YAML scalar holding a command line: split like a shell, positions in the file.

    Block scalars (`|`, `>`) are read from the file's own lines, one line at a time, so every
    word keeps its line and column; folding only joins lines with spaces, which a shell split
    does not distinguish from newlines."""
    style = node.style
    sl, sc = node.start_mark.line, node.start_mark.column
    words: list[Word] = []
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
            if compose:
                body = body.replace("$$", "$")
                cmds, _ = split_commands(body, variables, position=_fixed(fl + 1, indent), assign=False)
            else:
                text, cols = _substitute(body, variables)
                cmds, _ = split_commands(text, {}, position=_mapped(fl + 1, indent, cols), assign=False)
            for cmd in cmds:
                words.extend(cmd.words)
        return [to_arg(w, path) for w in words]
    value = str(node.value)
    offset = 1 if style in ("'", '"') else 0
    if compose:
        value = value.replace("$$", "$")
        cmds, _ = split_commands(value, variables, position=_fixed(sl + 1, sc + offset), assign=False)
    else:
        text, cols = _substitute(value, variables)
        cmds, _ = split_commands(text, {}, position=_mapped(sl + 1, sc + offset, cols), assign=False)
    return [to_arg(w, path) for c in cmds for w in c.words]


def _compose_interpolate(value: str, variables: dict[str, str]) -> str:
    out = []
    i = 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        m = re.match(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", value[i:])
        if m:
            name = m.group(1) or m.group(3)
            if name in variables:
                out.append(variables[name])
            elif m.group(2) is not None:
                out.append(m.group(2))
            else:
                out.append(m.group(0))
            i += m.end()
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


def _expanded(macros: dict[str, str]) -> dict[str, str]:
    """Macros whose values use other macros, expanded (llama-swap allows that)."""
    return {k: _swap_macros(v, macros) for k, v in macros.items()}


def _swap_macros(value: str, macros: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        return macros.get(m.group(1), m.group(0))

    for _ in range(5):  # macros may use macros
        new = re.sub(r"\$\{([A-Za-z0-9_.-]+)\}", sub, value)
        if new == value:
            break
        value = new
    return value


def _seq_args(node: Any, path: str, variables: dict[str, str]) -> list[Arg]:
    out: list[Arg] = []
    for item in node.value:
        v = _compose_interpolate(str(item.value), variables)
        offset = 1 if item.style in ("'", '"') else 0
        out.append(PosArg(v, path, item.start_mark.line + 1, item.start_mark.column + 1 + offset))
    return out


def _env_node(node: Any, path: str, variables: dict[str, str]) -> dict[str, Arg]:
    import yaml

    env: dict[str, Arg] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            offset = 1 if v.style in ("'", '"') else 0
            env[str(k.value)] = PosArg(_compose_interpolate(str(v.value), variables), path,
                                       v.start_mark.line + 1, v.start_mark.column + 1 + offset)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            text = _compose_interpolate(str(item.value), variables)
            if "=" in text:
                k, _, v = text.partition("=")
                offset = (1 if item.style in ("'", '"') else 0) + len(k) + 1
                env[k] = PosArg(v, path, item.start_mark.line + 1, item.start_mark.column + 1 + offset)
    return env


def _mapping_get(node: Any, key: str) -> Any:
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return None
    for k, v in node.value:
        if getattr(k, "value", None) == key:
            return v
    return None


def _dotenv_vars(folder: str) -> dict[str, str]:
    p = os.path.join(folder, ".env")
    out: dict[str, str] = {}
    if os.path.isfile(p):
        for k, a in dotenv_entries(p, _read(p)).items():
            out[k] = a.text
    return out


def yaml_launches(path: str, text: str) -> list[Launch]:
    import yaml

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return []
    lines = text.split("\n")
    out: list[Launch] = []
    services = _mapping_get(root, "services")
    if services is not None and isinstance(services, yaml.MappingNode):
        variables = _dotenv_vars(os.path.dirname(os.path.abspath(path)))
        for name_node, svc in services.value:
            image_node = _mapping_get(svc, "image")
            image = str(image_node.value) if image_node is not None else None
            args: list[Arg] = []
            has_binary = False
            entry = _mapping_get(svc, "entrypoint")
            if entry is not None:
                args += _seq_args(entry, path, variables) if isinstance(entry, yaml.SequenceNode) else \
                    _scalar_args(entry, path, lines, variables, compose=True)
                has_binary = bool(args)
            cmd = _mapping_get(svc, "command")
            if cmd is not None:
                args += _seq_args(cmd, path, variables) if isinstance(cmd, yaml.SequenceNode) else \
                    _scalar_args(cmd, path, lines, variables, compose=True)
            env_node = _mapping_get(svc, "environment")
            env = _env_node(env_node, path, variables) if env_node is not None else {}
            engine_like = (image and _IMAGE.search(image)) or any(a.text in _ENGINE_ARGS for a in args) or any(
                k.startswith("LLAMA_ARG") for k in env)
            if not engine_like:
                continue
            out.append(Launch(path, "compose", name_node.start_mark.line + 1, name_node.start_mark.column + 1,
                              args=args, env={k: v for k, v in env.items() if k.startswith("LLAMA_ARG")},
                              image=image, name=str(name_node.value), has_binary=has_binary))
        return out
    models = _mapping_get(root, "models")
    if models is not None and isinstance(models, yaml.MappingNode):
        macros: dict[str, str] = {}
        mnode = _mapping_get(root, "macros")
        if isinstance(mnode, yaml.MappingNode):
            for k, v in mnode.value:
                macros[str(k.value)] = str(v.value)
        for name_node, model in models.value:
            cmd = _mapping_get(model, "cmd")
            if cmd is None:
                continue
            local = dict(macros)
            local.setdefault("PORT", "8080")
            lm = _mapping_get(model, "macros")
            if isinstance(lm, yaml.MappingNode):
                for k, v in lm.value:
                    local[str(k.value)] = str(v.value)
            args = _scalar_args(cmd, path, lines, _expanded(local), compose=False)
            env_node = _mapping_get(model, "env")
            env = _env_node(env_node, path, {}) if env_node is not None else {}
            out.append(Launch(path, "llama-swap", name_node.start_mark.line + 1, name_node.start_mark.column + 1,
                              args=args, env={k: v for k, v in env.items() if k.startswith("LLAMA_ARG")},
                              name=str(name_node.value)))
    return out


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


def systemd_launches(path: str, text: str) -> list[Launch]:
    lines = text.split("\n")
    env: dict[str, Arg] = {}
    out: list[Launch] = []
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
            cmds, _ = split_commands(line[value_col:], position=_fixed(start + 1, value_col), assign=False)
            for c in cmds:
                for w in c.words:
                    if "=" in w.text:
                        k = w.text.split("=", 1)[0]
                        if k.startswith("LLAMA_ARG"):
                            env[k] = to_arg(Word(w.chars[len(k) + 1:], w.pos[len(k) + 1:]), path)
        elif key == "ExecStart":
            text_parts = []
            offsets = []
            for idx, (ln, content) in enumerate(chunk):
                piece = content[content.index("=") + 1:] if idx == 0 else content
                col0 = content.index("=") + 1 if idx == 0 else 0
                piece = piece.rstrip()
                if piece.endswith("\\"):
                    piece = piece[:-1]
                offsets.append((ln, col0))
                text_parts.append(piece)

            def position(ln: int, col: int, offsets: list[tuple[int, int]] = offsets) -> tuple[int, int]:
                fl, c0 = offsets[ln - 1]
                return fl + 1, c0 + col

            words: list[Word] = []
            for ln_no, piece in enumerate(text_parts, start=1):
                cs, _ = split_commands(piece, position=_on_line(position, ln_no), assign=False)
                for c in cs:
                    words.extend(c.words)
            if words:
                first = words[0]
                first.chars = list(first.text.lstrip("-@:+!"))
                first.pos = first.pos[len(first.pos) - len(first.chars):]
                first_line, first_col = words[0].pos[0]
                out.append(Launch(path, "systemd", first_line, first_col, args=[to_arg(w, path) for w in words]))
    for la in out:
        la.env = dict(env)
    return out


# --- dispatch --------------------------------------------------------------------------------

def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


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
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(200)
    except OSError:
        return ""


def read_source(path: str) -> SourceFile | None:
    """Launches in one file, or None if it is not a kind moeconf reads (plans are handled apart)."""
    text = _read(path)
    kind = kind_of(path, text)
    if kind is None or kind == "plan":
        return None
    lines = text.split("\n")
    if kind == "shell":
        launches = shell_launches(path, text)
    elif kind == "yaml":
        launches = yaml_launches(path, text)
    elif kind == "env":
        launches = dotenv_launches(path, text)
    else:
        launches = systemd_launches(path, text)
    return SourceFile(path, text, lines, parse_directives(lines), launches)


def walk(paths: list[str]) -> Iterator[str]:
    """Files to lint under `paths` (directories searched, hidden folders skipped)."""
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__"))
                for f in sorted(files):
                    fp = os.path.join(root, f)
                    if kind_of(fp) is not None:
                        yield fp
        else:
            yield p
