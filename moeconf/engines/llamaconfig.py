"""llama.cpp's config files (config.ini): options every program of the common argument parser
reads before its environment and its command line.

Facts, from llama.cpp (pinned llama-cpp-python 0.3.36; PR #26118, commit 8e7f22b67,
2026-08-13, build 10398):
- common/arg.cpp `common_params_apply_system_config`, called first in `common_params_parse_ex`:
  the files, in order, each applied if it exists (`std::filesystem::exists`): POSIX (macOS too)
  `/etc/llama.cpp/config.ini`, then `fs_get_config_directory()/config.ini`; Windows
  `%PROGRAMDATA%\\llama.cpp\\config.ini`, then `%APPDATA%\\llama.cpp\\config.ini`.
- common/common.cpp `fs_get_config_directory`: `$XDG_CONFIG_HOME/llama.cpp` when the variable is
  set and not empty, else `$HOME/.config/llama.cpp` (the passwd entry's home when HOME is unset or
  empty); Windows `%APPDATA%\\llama.cpp` (no user file when APPDATA is unset).
- Per file: the `[*]` section is applied, then the default section (`[default]`, and the keys
  before any header); named sections are ignored (they are llama-server's model presets).
  A file read later applies later: a value option it sets replaces the earlier one, a list option
  (-ot, --cpu-moe, --n-cpu-moe, --rpc: their handlers append) adds to it.
- Then the environment (`LLAMA_ARG_*`, every option in its table order), then the command line,
  left to right: the same handlers, so a value option given there wins and a list option adds
  after the config's: the config's -ot items are tested FIRST (the loader takes the first
  matching item), so they win over the command line's for the tensors both match.
- common/preset.cpp `parse_ini_from_file`: a PEG grammar, one of per line: `[name]` (the name is
  every character up to `]` after the blanks that follow `[`, trailing blanks kept: `[ * ]` is a
  section named "* "), `key = value`
  (key `[a-zA-Z_][a-zA-Z0-9_.-]*` at the very start of the line; the value runs to the end of the
  line or to the first `;` or `#`, trailing blanks dropped; nothing unquoted), a comment (`;` or
  `#` after optional blanks) or a blank line; newlines \\n, \\r\\n or \\r. Any other line (an
  indented key, a line without `=`) fails the whole file: every program stops ("failed to parse
  server config file"). A section header starts the section afresh (a second `[*]` drops what the
  first set); a key given twice keeps its last value.
- common/preset.cpp `get_map_key_opt` / `load_from_ini`: a key is an option's name without its
  leading dashes (`ctx-size`, `c`, `override-tensor`, `ot`, `no-kv-offload`) or its environment
  variable (`LLAMA_ARG_CTX_SIZE`, and `LLAMA_ARG_NO_*` for a switch with a negative form); case and
  underscores matter (`ctx_size` is no key). A key the program does not know is ignored with a
  warning (`ignore_unknown_keys`: one file serves every program). `version` is skipped. The
  options of one section are applied in the order of their first spelling (common_arg::operator<,
  strcmp), not the file's: `-cmoe` before `-ncmoe` before `-ot`; two keys naming one option keep
  the one that sorts last (`ot` loses to `override-tensor`, `LLAMA_ARG_*` to the names).
- common/preset.cpp `common_preset::apply_to_params`: string options take the value as written;
  number options `std::stoi` (leading blanks, a sign, digits; what follows the digits dropped:
  `4096abc` is 4096; no digit stops the program); switches with a negative form take true for
  on/enabled/true/1 and false for anything else, reversed when the key is a negative NAME
  (`no-kv-offload = true` is kv-offload off; the variable-name key `LLAMA_ARG_NO_KV_OFFLOAD = 1` is
  NOT reversed: kv-offload on); switches without one (`cpu-moe`, `swa-full`) are applied whatever
  the value says (`cpu-moe = false` keeps the experts on the CPU).
- Which programs: every program that parses with `common_params_parse` (llama-server, llama-cli,
  llama-completion, llama-mtmd-cli, llama-fit-params, llama-perplexity, ...), each reading the keys
  of the options it knows; llama-bench and the RPC server have their own parsers and read none.
- ik_llama.cpp (0.1.5 and the newest code read, 8337e4cd3) has no config file: common/common.cpp
  `gpt_params_parse_ex` reads only its fixed `LLAMA_ARG_*` list and the command line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from moeconf.engines import Engine
from moeconf.errors import MoeconfError

if TYPE_CHECKING:
    from moeconf.engines.argvread import ArgvReading

CONFIG_SINCE_BUILD: Final = 10398  # llama.cpp PR #26118 (commit 8e7f22b67): the first build that reads them
ENV_VAR: Final = "MOECONF_LLAMA_CONFIG"  # os.pathsep-separated files in place of the discovery ("": none)
SYSTEM_FILE: Final = "/etc/llama.cpp/config.ini"
MAX_BYTES: Final = 1 << 20

# the llama_example each program parses its arguments as (tools/*/*.cpp: common_params_parse)
EXAMPLE_OF: Final[dict[str, str]] = {
    "llama-server": "SERVER", "llama-cli": "CLI", "llama-completion": "COMPLETION", "llama-mtmd-cli": "MTMD",
    "llama-fit-params": "FIT_PARAMS", "llama-perplexity": "PERPLEXITY", "llama-batched-bench": "BENCH",
    "llama-imatrix": "IMATRIX", "llama-embedding": "EMBEDDING", "llama-speculative": "SPECULATIVE",
    "llama-speculative-simple": "SPECULATIVE", "llama-parallel": "PARALLEL", "llama-batched": "BATCHED",
    "llama-tts": "TTS", "llama-retrieval": "RETRIEVAL", "llama-passkey": "PASSKEY", "llama-lookup": "LOOKUP",
    "llama-diffusion-cli": "DIFFUSION", "llama-finetune": "FINETUNE", "llama-tokenize": "TOKENIZE",
    "llama-export-lora": "EXPORT_LORA", "llama-cvector-generator": "CVECTOR_GENERATOR",
}
# handlers that append (common/arg.cpp): -ot and --cpu-moe/--n-cpu-moe push onto
# params.tensor_buft_overrides, --rpc adds devices; every other modelled option sets one value
APPENDS: Final = frozenset({"-ot", "-cmoe", "-ncmoe", "--rpc"})
# options moeconf reads for placement (engines/cmdline.py) and memory (engines/settings.py)
PLACEMENT: Final = frozenset({"-ot", "-cmoe", "-ncmoe", "-ngl", "-fit", "-ts", "-sm", "-mg", "--rpc", "-dev",
                              "-m", "-hf", "-hff", "--offline"})
MEMORY: Final = frozenset({"-c", "-b", "-ub", "-ctk", "-ctv", "-fa", "-np", "-kvu", "-cram", "-ctxcp", "-kvo",
                           "--swa-full"})
# the KV cache types -ctk/-ctv accept (common/arg.cpp kv_cache_types)
CACHE_TYPES: Final = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# the words common/arg.cpp reads as true and as false (common_arg_utils::is_truthy, is_falsey)
TRUE_WORDS: Final = ("on", "enabled", "true", "1")
FALSE_WORDS: Final = ("off", "disabled", "false", "0")
# and as "auto" where an option takes one (common_arg_utils::is_autoy: -fa)
AUTO_WORDS: Final = ("auto", "-1")
# ik_llama.cpp 0.1.5's -fa handler (common/common.cpp) lowercases the word and takes these only; its "auto" is on
_IK_FA_WORDS: Final = {"on": "on", "1": "on", "auto": "on", "off": "off", "0": "off"}


def flash_attn_word(text: str, engine: Engine) -> str | None:
    """-fa's word as the engine's handler reads it: on, off or auto (None: the engine stops on it).
    llama.cpp compares it as written (common_arg_utils::is_truthy, is_falsey, is_autoy)."""
    if engine.name == "ik_llama.cpp":
        return _IK_FA_WORDS.get(text.lower())
    return "on" if text in TRUE_WORDS else "off" if text in FALSE_WORDS else "auto" if text in AUTO_WORDS else None


def flash_attn_refusal(flag: str, text: str, engine: Engine) -> str:
    """What the engine does with a -fa word it does not take (`flash_attn_word` None); `flag` as written, or
    the variable that gave it."""
    where = "there" if flag.startswith("LLAMA_ARG_") else "after it"
    return f"unknown value for {flag}: {text!r} ({engine.label} takes on, off or auto {where}, and stops otherwise)"


# values common/arg.cpp's handlers accept (anything else stops the program)
_CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "-fa": (*TRUE_WORDS, *FALSE_WORDS, *AUTO_WORDS), "-fit": (*TRUE_WORDS, *FALSE_WORDS),
    "-sm": ("none", "layer", "row", "tensor"),
    "-ctk": CACHE_TYPES,
}
_CHOICES["-ctv"] = _CHOICES["-ctk"]


@dataclass(frozen=True)
class Option:
    """One option of llama.cpp's parser (engines/configtable.py)."""

    names: tuple[str, ...]
    negs: tuple[str, ...]
    env: str
    kind: str  # void, bool, int, string, str_str
    examples: tuple[str, ...]
    excludes: tuple[str, ...]

    @property
    def first(self) -> str:
        return self.names[0]

    def known_to(self, example: str) -> bool:
        # add_opt: the program's own example, or COMMON for all but llama-download
        return ((example in self.examples or (example != "DOWNLOAD" and "COMMON" in self.examples))
                and example not in self.excludes)


@cache
def _options() -> tuple[Option, ...]:
    from moeconf.engines.configtable import OPTIONS

    return tuple(Option(*row) for row in OPTIONS)


def option_for_key(key: str, example: str) -> Option | None:
    """The option a config key names for a program (common/preset.cpp get_map_key_opt)."""
    for opt in _options():
        if not opt.known_to(example):
            continue
        envs = [opt.env] if opt.env else []
        if opt.env and opt.negs:
            envs.append(opt.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_"))
        if key in envs or key in (n.lstrip("-") for n in (*opt.names, *opt.negs)):
            return opt
    return None


def option_for_env(var: str) -> Option | None:
    """The option an environment variable sets (its `set_env` name), None for any other."""
    return next((o for o in _options() if o.env and o.env == var), None)


def any_option_for_key(key: str) -> Option | None:
    """The option a key names for some program (None: no program knows the key)."""
    examples = {e for o in _options() for e in o.examples}
    for ex in ("COMMON", *sorted(examples)):
        found = option_for_key(key, ex)
        if found is not None:
            return found
    return None


# --- the files -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """`key = value` in a config file: where the key and the value start (1-based)."""

    path: str
    section: str
    key: str
    value: str
    line: int
    column: int  # of the key
    value_column: int


@dataclass(frozen=True)
class ConfigFile:
    path: str
    # section -> key -> entry, as the engine keeps them (a header starts its section afresh,
    # the last of a key wins); "default" holds the keys before any header
    sections: dict[str, dict[str, Entry]]
    headers: tuple[tuple[str, int], ...] = ()  # every header (name, line), in file order


def _fail(path: str, line: int, column: int, message: str) -> MoeconfError:
    return MoeconfError(f"llama.cpp config file: {message}; llama.cpp refuses the whole file "
                        "(\"failed to parse server config file\") and every program stops",
                        path=path, line=line, column=column)


def parse_ini(text: str, path: str) -> ConfigFile:
    """Read `text` as common/preset.cpp's parse_ini_from_file does (module docstring); a line it
    would refuse is a MoeconfError at its line and column."""
    n = len(text)
    pos, line, line_start = 0, 1, 0
    sections: dict[str, dict[str, Entry]] = {}
    headers: list[tuple[str, int]] = []
    current = "default"

    def col(p: int) -> int:
        return p - line_start + 1

    def skip_ws(p: int) -> int:
        while p < n and text[p] in " \t":
            p += 1
        return p

    def newline_at(p: int) -> int:
        """Length of the newline at p (0: none)."""
        if text.startswith("\r\n", p):
            return 2
        return 1 if p < n and text[p] in "\r\n" else 0

    def end_line(p: int, what: str) -> int:
        """eol ::= ws comment? (newline / EOF): the position after it."""
        nonlocal line, line_start
        p = skip_ws(p)
        if p < n and text[p] in ";#":
            while p < n and not newline_at(p):
                p += 1
        if p >= n:
            return p
        k = newline_at(p)
        if not k:
            raise _fail(path, line, col(p), f"unexpected {text[p]!r} after {what}")
        line += 1
        line_start = p + k
        return p + k

    while pos < n:
        start = pos
        c = text[pos]
        if c == "[":
            p = skip_ws(pos + 1)
            name_start = p
            name_line, name_col = line, col(p)
            while p < n and text[p] != "]":
                k = newline_at(p)
                if k:  # the name runs on over newlines, up to the next ']'
                    line += 1
                    line_start = p + k
                    p += k
                else:
                    p += 1
            if p >= n:
                raise _fail(path, name_line, name_col - 1, "a section header without its ']'")
            if p == name_start:
                raise _fail(path, line, col(p), "an empty section name")
            name = text[name_start:p]
            sections[name] = {}  # parse_ini_from_file: `parsed[current_section] = {}`
            headers.append((name, name_line))
            current = name
            pos = end_line(p + 1, f"the section header [{name}]")
            continue
        if c.isascii() and (c.isalpha() or c == "_"):
            p = pos + 1
            while p < n and text[p].isascii() and (text[p].isalnum() or text[p] in "_.-"):
                p += 1
            key = text[pos:p]
            key_line, key_col = line, col(pos)
            p = skip_ws(p)
            if p >= n or text[p] != "=":
                raise _fail(path, line, col(p), f"expected '=' after the key {key!r}")
            p = skip_ws(p + 1)
            v0 = p
            while p < n:
                q = skip_ws(p)
                if q >= n or text[q] in ";#" or newline_at(q):
                    break
                p += 1
            value = text[v0:p]
            sections.setdefault(current, {})[key] = Entry(path, current, key, value, key_line, key_col, col(v0))
            pos = end_line(p, f"the value of {key!r}")
            continue
        p = skip_ws(pos)
        if p >= n or text[p] in ";#" or newline_at(p):
            pos = end_line(p, "a comment")
            continue
        if p > start and text[p].isascii() and (text[p].isalpha() or text[p] in "_["):
            raise _fail(path, line, col(start), "an indented line (a key or a section header must start the line)")
        raise _fail(path, line, col(p), f"{text[p]!r} cannot start a line (write `key = value`, `[section]`, "
                                        "or a comment after ; or #)")
    return ConfigFile(path, sections, tuple(headers))


def read_file(path: str) -> ConfigFile:
    """A config file read and parsed; a file that exists but cannot be read or parsed is a
    MoeconfError naming it (and the line and column)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise MoeconfError(f"llama.cpp config file: cannot read it: {e.strerror or e}", path=path) from None
    if not stat.S_ISREG(st.st_mode):
        raise MoeconfError("llama.cpp config file: not a regular file (moeconf reads only regular files)", path=path)
    if st.st_size > MAX_BYTES:
        raise MoeconfError(f"llama.cpp config file: {st.st_size} bytes, over moeconf's limit of {MAX_BYTES}",
                           path=path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise MoeconfError(f"llama.cpp config file: cannot read it: {e.strerror or e}", path=path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise MoeconfError("llama.cpp config file: not UTF-8 text", path=path, line=line, column=column) from None
    return parse_ini(text, path)


def discover(environ: Mapping[str, str], *, windows: bool | None = None, system: str = SYSTEM_FILE,
             home: str | None = None) -> list[str]:
    """The files llama.cpp would look for, in its order (whether they exist or not)."""
    if windows is None:
        windows = os.name == "nt"
    out: list[str] = []
    if windows:
        if environ.get("PROGRAMDATA"):
            out.append(os.path.join(environ["PROGRAMDATA"], "llama.cpp", "config.ini"))
        if environ.get("APPDATA"):
            out.append(os.path.join(environ["APPDATA"], "llama.cpp", "config.ini"))
        return out
    out.append(system)
    base = environ.get("XDG_CONFIG_HOME") or ""
    if not base:
        h = environ.get("HOME") or home
        if not h:
            try:
                import pwd

                h = pwd.getpwuid(os.getuid()).pw_dir
            except (ImportError, KeyError, AttributeError):
                h = ""
        if not h:
            return out  # fs_get_config_directory throws: no user file
        base = os.path.join(h, ".config")
    out.append(os.path.join(base, "llama.cpp", "config.ini"))
    return out


@dataclass
class LlamaConfig:
    """The config files a launch on this machine would read (possibly none), or `known` False
    where they are not this machine's (a container's)."""

    files: list[ConfigFile] = field(default_factory=list)
    looked: list[str] = field(default_factory=list)  # where moeconf looked (for the report)
    how: str = "discovered"  # discovered, given (--llama-config), env (MOECONF_LLAMA_CONFIG), off
    known: bool = True


def load(paths: Sequence[str] | None = None, *, off: bool = False,
         environ: Mapping[str, str] | None = None) -> LlamaConfig:
    """The config files for commands run on this machine: `paths` (--llama-config, each must
    exist), none with `off` (--no-llama-config), else the files named by MOECONF_LLAMA_CONFIG,
    else llama.cpp's own discovery (the files that exist)."""
    env = os.environ if environ is None else environ
    if off:
        return LlamaConfig(how="off")
    if paths:
        return LlamaConfig([read_file(p) for p in paths], list(paths), "given")
    if ENV_VAR in env:
        named = [p for p in env[ENV_VAR].split(os.pathsep) if p]
        return LlamaConfig([read_file(p) for p in named], named, "env")
    looked = discover(env)
    found = [p for p in looked if os.path.exists(p)]
    return LlamaConfig([read_file(p) for p in found], looked, "discovered")


# --- what a program applies ------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One option a config file sets for a program, as the program applies it."""

    option: Option
    entry: Entry
    value: str  # what the handler gets: stoi's number, the switch's true/false, or the text

    @property
    def where(self) -> str:
        return f"{self.entry.path}:{self.entry.line}"

    def words(self) -> list[str]:
        """The command-line words that do the same (the option's first spelling)."""
        o = self.option
        if o.kind == "void":
            return [o.first]
        if o.kind == "bool":
            return [o.first if self.value == "true" else o.negs[0]]
        return [o.first, self.value]


@dataclass
class Applied:
    """What the config files set for one program: the settings in the order applied, and what
    they leave out (keys the program ignores, named sections), as notes."""

    settings: list[Setting] = field(default_factory=list)
    ignored: list[tuple[Entry, str]] = field(default_factory=list)
    sections: list[tuple[str, str, int]] = field(default_factory=list)  # (path, name, line) ignored


def stoi(text: str) -> int | None:
    """std::stoi: blanks, a sign, decimal digits; what follows is dropped; None when no digit."""
    t = text.lstrip(" \t\n\v\f\r")
    sign = ""
    if t[:1] in "+-" and t[:1]:
        sign, t = t[0], t[1:]
    digits = ""
    for ch in t:
        if not ch.isascii() or not ch.isdigit():
            break
        digits += ch
    if not digits:
        return None
    v = int(sign + digits)
    return v if -(2**31) <= v < 2**31 else None


def reads_config(engine: Engine, binary: str | None) -> bool:
    """Whether `binary` of `engine` reads config files (mainline b10398+, a common-parser program;
    no binary: taken as one)."""
    if engine.name != "llama.cpp" or (engine.build or 0) < CONFIG_SINCE_BUILD:
        return False
    return binary is None or binary in EXAMPLE_OF


def apply(cfg: LlamaConfig, engine: Engine, binary: str | None) -> Applied:
    """The settings `binary` (None: any common-parser program, the options every one knows)
    takes from the config files, in the order it applies them. A value the program would stop
    on is a MoeconfError at the value's line and column."""
    out = Applied()
    if not cfg.known or not reads_config(engine, binary):
        return out
    example = EXAMPLE_OF.get(binary or "", "COMMON")
    for f in cfg.files:
        for name, _line in f.headers:
            if name not in ("*", "default"):
                out.sections.append((f.path, name, _line))
        for section in ("*", "default"):
            chosen: dict[str, tuple[Option, Entry]] = {}
            for key in sorted(f.sections.get(section, {})):  # std::map: keys in byte order
                e = f.sections[section][key]
                if key == "version":
                    continue
                opt = option_for_key(key, example)
                if opt is None:
                    out.ignored.append((e, _why_ignored(key, binary)))
                    continue
                if opt.first in chosen:
                    out.ignored.append((chosen[opt.first][1], f"{e.key} (line {e.line}) names the same option and "
                                                              "is applied instead (of two keys, llama.cpp keeps "
                                                              "the one that sorts last)"))
                chosen[opt.first] = (opt, e)
            for first in sorted(chosen, key=lambda s: s.encode()):  # common_arg::operator<: strcmp
                opt, e = chosen[first]
                out.settings.append(Setting(opt, e, _handler_value(opt, e, binary)))
    return out


def _why_ignored(key: str, binary: str | None) -> str:
    other = any_option_for_key(key)
    if other is not None and binary is None:
        return (f"{other.first} is an option of some programs only ({', '.join(other.examples)}): give the "
                "binary first on the command line to know whether it applies")
    if other is not None:
        return f"{binary} has no option {other.first}: llama.cpp ignores the key (with a warning)"
    near = key.replace("_", "-").lower()
    hint = f" (did you mean {near}?)" if any_option_for_key(near) is not None else ""
    return f"no option is named {key!r}{hint}: llama.cpp ignores the key (with a warning)"


def _handler_value(opt: Option, e: Entry, binary: str | None) -> str:
    """The value the option's handler gets, checked as the handler checks it (a MoeconfError
    where the program would stop)."""
    def stop(why: str) -> MoeconfError:
        return MoeconfError(f"llama.cpp config file: {e.key} = {e.value!r}: {why}; every program that reads "
                            "the file stops", path=e.path, line=e.line, column=e.value_column)

    if opt.kind == "bool":
        truthy = e.value in TRUE_WORDS
        if e.key in (n.lstrip("-") for n in opt.negs):
            truthy = not truthy  # preset.cpp parse_bool_arg: a negative name reverses
        return "true" if truthy else "false"
    if opt.kind == "void":
        return e.value
    if opt.kind == "str_str":
        raise stop("an option of two values, which config files cannot set (common_preset::apply_to_params)")
    if opt.kind == "int":
        v = stoi(e.value)
        if v is None:
            raise stop("not a number (std::stoi)")
        if opt.first == "-ncmoe" and v < 0:
            raise stop("--n-cpu-moe takes a number >= 0")
        if opt.first == "-np" and v == 0 and binary == "llama-server":
            raise stop("llama-server refuses 0 slots")
        return str(v)
    if opt.first == "-ngl" and e.value not in ("auto", "all"):
        v = stoi(e.value)
        if v is None:
            raise stop("-ngl takes a number, auto or all")
        return str(v)
    if opt.first in _CHOICES and e.value not in _CHOICES[opt.first]:
        raise stop(f"{opt.names[-1]} takes {', '.join(_CHOICES[opt.first])}")
    if opt.first == "-ot":
        for item in e.value.split(","):
            if item and "=" not in item:
                raise stop(f"the -ot item {item!r} has no '=' (write PATTERN=DEVICE)")
    return e.value


def config_env(applied: Applied) -> dict[str, str]:
    """The settings as the `LLAMA_ARG_*` variables that say the same (what engines/settings.py's
    read_settings takes): a later setting replaces an earlier one."""
    out: dict[str, str] = {}
    for s in applied.settings:
        o = s.option
        if not o.env or o.first in APPENDS:
            continue
        if o.kind == "bool":
            out[o.env] = "1" if s.value == "true" else "0"
        elif o.kind == "void":
            out[o.env] = "1"  # applied whatever the value said
        else:
            out[o.env] = s.value
    return out


def merged_env(applied: Applied, env: Mapping[str, str]) -> dict[str, str]:
    """The config's settings as variables, then the real environment, which comes after them
    (and so replaces them): what read_settings should see."""
    base = config_env(applied)
    return {**{k: v for k, v in base.items() if k not in env and _neg(k) not in env}, **env}


def _neg(env_name: str) -> str:
    return env_name.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")


def overridden_by(s: Setting, cli: Sequence[str] | ArgvReading, env: Mapping[str, str], engine: Engine) -> str | None:
    """What replaces a value setting of the config: the command line's option (`cli`: its words
    without the binary, or the line as read: engines/argvread.py read_argv), or its variable
    (None: nothing, or a list option, which the command line adds to)."""
    from moeconf.engines.argvread import ArgvReading as Reading
    from moeconf.engines.argvread import read_argv

    o = s.option
    if o.first in APPENDS:
        return None
    names = {*o.names, *o.negs}
    reading = cli if isinstance(cli, Reading) else read_argv(cli, engine, binary=False)
    for given in reading.options:
        if given.name in names:
            return f"{given.word.text} on the command line"
    if o.env and (o.env in env or (o.negs and _neg(o.env) in env)):
        return f"the environment's {o.env if o.env in env else _neg(o.env)}"
    return None


def memory_env(applied: Applied | None, env: Mapping[str, str]) -> dict[str, str]:
    """What read_settings should see as the environment: `env`, after the config's settings."""
    return merged_env(applied, env) if applied is not None else dict(env)


def report(inv: Any) -> dict[str, object]:
    """What the config files did to an invocation (an engines/cmdline.Invocation: this module
    sits below it), as data for explain's text and JSON: the files, each setting (file, line,
    key, value, the option, the words it is read as, what replaces it), the keys and sections
    the program ignores."""
    src: LlamaConfig | None = inv.config_source
    out: dict[str, object] = {"read": src is not None and src.known, "known": inv.config_known}
    if src is None:
        out["why"] = "not read (--no-llama-config, or not asked for)"
        return out
    out["how"] = src.how
    out["looked"] = list(src.looked)
    out["files"] = [f.path for f in src.files]
    binary = inv.binary.text.rsplit("/", 1)[-1].removesuffix(".exe") if inv.binary else None
    if not src.known:
        out["why"] = "the launch runs in a container or under a proxy: its config files are not this machine's"
        return out
    if not reads_config(inv.engine, binary):
        out["why"] = (f"{inv.engine.label} reads no config file" if inv.engine.name != "llama.cpp" or
                      (inv.engine.build or 0) < CONFIG_SINCE_BUILD else f"{binary} reads no config file")
        out["applies"] = False
        return out
    out["applies"] = True
    applied = inv.config or Applied()
    env = {k: v.text for k, v in inv.env.items()}
    settings = []
    for s in applied.settings:
        by = overridden_by(s, inv.reading, env, inv.engine)
        settings.append({
            "file": s.entry.path, "line": s.entry.line, "section": s.entry.section, "key": s.entry.key,
            "value": s.entry.value, "option": s.option.names[-1], "as": s.words(),
            "placement": s.option.first in PLACEMENT, "memory": s.option.first in MEMORY,
            "overridden_by": by,
            "adds_first": s.option.first in APPENDS,
        })
    out["settings"] = settings
    out["ignored"] = [{"file": e.path, "line": e.line, "key": e.key, "why": why} for e, why in applied.ignored]
    out["ignored_sections"] = [{"file": p, "line": line, "section": name} for p, name, line in applied.sections]
    return out


def report_lines(data: Mapping[str, object]) -> list[str]:
    """explain's text for `report(...)`: nothing when no file was read and none applies."""
    files = data.get("files") or []
    assert isinstance(files, list)
    if not data.get("known", True):
        return ["llama.cpp config files: not known (the launch's own machine or container reads its own "
                "/etc/llama.cpp/config.ini and ~/.config/llama.cpp/config.ini)"]
    if not files or not data.get("applies"):
        return []
    lines = [f"llama.cpp config files (read before the environment and the command line): {', '.join(files)}"]
    for s in data.get("settings") or []:  # type: ignore[attr-defined]
        assert isinstance(s, dict)
        what = " ".join(s["as"])
        if s["overridden_by"]:
            fate = f"replaced by {s['overridden_by']}"
        elif s["adds_first"]:
            fate = "applied first: its rules come before the command line's and win where both match"
        else:
            fate = "applied"
        lines.append(f"  {s['file']}:{s['line']}: {s['key']} = {s['value']}  -> {what}  ({fate})")
    for g in data.get("ignored") or []:  # type: ignore[attr-defined]
        assert isinstance(g, dict)
        lines.append(f"  {g['file']}:{g['line']}: {g['key']}: ignored: {g['why']}")
    for g in data.get("ignored_sections") or []:  # type: ignore[attr-defined]
        assert isinstance(g, dict)
        lines.append(f"  {g['file']}:{g['line']}: section [{g['section']}] ignored: config files apply only [*] "
                     "and the default section")
    return lines


# what `moeconf fit` does with a config setting it does not see on the user's flags: its command
# line writes -ngl, -fit off and -m itself (they replace the config's); these it cannot leave to
# the file, so it refuses them (the config's rules would come before its own -ot and win)
FIT_REFUSED: Final[dict[str, str]] = {
    "-ot": "its -ot rules are tested before the command line's and win, so the placement fit prints would not "
           "be the engine's",
    "-cmoe": "its --cpu-moe rule is tested before the command line's -ot and wins, so the placement fit prints "
             "would not be the engine's",
    "-ncmoe": "its --n-cpu-moe rules are tested before the command line's -ot and win, so the placement fit "
              "prints would not be the engine's",
    "-ts": "fit splits the model itself and writes no -ts, so the file's would apply to its command",
    "-dev": "fit places on the devices of its --gpu budgets and writes no -dev, so the file's would apply",
    "--rpc": "the command fit prints would add its --rpc servers after the file's (a server twice)",
}
FIT_REPLACED: Final = frozenset({"-ngl", "-fit", "-fitt", "-fitc", "-m"})


def fit_flags(cfg: LlamaConfig, engine: Engine, user_argv: Sequence[str],
              binary: str = "llama-server") -> tuple[list[str], list[str]]:
    """The engine flags `moeconf fit` adds before the user's for what the config files set
    (memory, -sm, -mg: written into the command, so it means the same with or without the
    file), and a note for each. A setting fit cannot honour is a MoeconfError at its line."""
    applied = apply(cfg, engine, binary)
    words: list[str] = []
    notes: list[str] = []
    for s in applied.settings:
        first = s.option.first
        if overridden_by(s, user_argv, {}, engine) is not None or first in FIT_REPLACED:
            continue
        if first in FIT_REFUSED:
            raise MoeconfError(f"llama.cpp config file sets {s.entry.key} = {s.entry.value}: {FIT_REFUSED[first]}; "
                               "remove it from the file (or give --no-llama-config to size for a machine without "
                               "it)", path=s.entry.path, line=s.entry.line, column=s.entry.column)
        if first in MEMORY or first in ("-sm", "-mg"):
            words += s.words()
            notes.append(f"{s.where}: {s.entry.key} = {s.entry.value} (llama.cpp config file) written into the "
                         f"command as {' '.join(s.words())}")
    return words, notes


def env_form(words: Sequence[str], engine: Engine, example: str = "SERVER") -> tuple[list[tuple[str, str]], str | None]:
    """Command-line options (read as `engine` reads them: engines/argvread.py read_argv) as the
    `LLAMA_ARG_*` variables llama.cpp reads instead (common/arg.cpp: each option's env name; a
    flag as "1", its negated form as "0", a value as given): (the variables, None), or ([], the
    first option that has no variable for `example`, or is given twice, with why)."""
    from moeconf.engines.argvread import read_argv

    out: list[tuple[str, str]] = []
    for given in read_argv(words, engine, binary=False).options:
        w, name = given.word.text, given.name
        opt = None if given.inline else next(
            (o for o in _options() if o.known_to(example) and (name in o.names or name in o.negs)), None)
        if opt is None or not opt.env or opt.kind == "str_str":
            return [], f"{w}: no LLAMA_ARG_* variable reads it"
        if any(k == opt.env for k, _ in out):
            return [], f"{w}: given twice, and {opt.env} holds one value"
        if opt.kind in ("void", "bool"):
            out.append((opt.env, "0" if name in opt.negs else "1"))
        elif given.value is None:
            return [], f"{w}: needs a value"
        else:
            out.append((opt.env, given.value.text))
    return out, None
