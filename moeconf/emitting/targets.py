"""Every output form of a compiled plan. Each one round-trips: a shell split, a YAML load or a
dotenv parse of the output gives back the exact `-ot` value (tested for every form).

- `llama.cpp` / `ik_llama.cpp`: one shell-quoted command line for that engine's server
- `argv`: the same as a JSON array
- `env`: dotenv lines (`LLAMA_ARG_*`), mainline only (ik_llama.cpp reads no `-ot` from env)
- `docker`: a `docker run` line with the engine's official image for the backend
- `compose`: a docker compose service (command as a list; `$` doubled; regexes single-quoted)
- `llama-swap`: a `models` entry whose `cmd` survives llama-swap's own processing (`${...}` in a
  value is left for llama-swap to expand: that is its macro syntax)
- `json`: `ot`, `argv`, `placement` and more, for other tools
- `ot`: only the `-ot` value

No value can change the structure of what is written: shell words are quoted with `shlex`, YAML
scalars are single-quoted, the compose service name is restricted to compose's own charset (by the
plan schema), and a value with a control character or line break (which no text form can carry
safely) is refused with the plan key's file:line. `argv` and `json` carry any value (JSON escapes).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from typing import Final

from moeconf.compiled import Compiled
from moeconf.emitting.argv import load_mode, tensor_split_text
from moeconf.emitting.commands import (
    _DOCKER_DEVICES,
    _model_override,
    docker_argv,
    docker_image,
    extra_value,
    llama_swap_argv,
    published_port,
    server_args,
)
from moeconf.engines import Engine
from moeconf.errors import MoeconfError
from moeconf.textsafe import first_unsafe

TARGETS: Final = ("llama.cpp", "ik_llama.cpp", "argv", "env", "docker", "compose", "llama-swap", "json", "ot")


_TEXT_TARGETS: Final = ("llama.cpp", "ik_llama.cpp", "env", "docker", "compose", "llama-swap", "ot")
_YAML_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_YAML_SPECIAL = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}


def _plan_strings(c: Compiled) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every free-form string of the plan that ends up in an output, with its key."""
    cfg = c.plan.config
    if cfg.model.serve_path:
        yield ("model", "serve_path"), cfg.model.serve_path
    elif c.plan.resolve_path(cfg.model.path) == _model_override(c):
        yield ("model", "path"), cfg.model.path  # it is the -m value
    t, f = cfg.targets, cfg.flags
    for key in ("binary", "host", "docker_image", "compose_service", "llama_swap_model"):
        v = getattr(t, key)
        if v:
            yield ("targets", key), v
    for i, v in enumerate(t.docker_volumes):
        yield ("targets", "docker_volumes", i), v
    for key in ("cache_type_k", "cache_type_v"):
        v = getattr(f, key)
        if v:
            yield ("flags", key), v
    for i, v in enumerate(f.rpc):
        yield ("flags", "rpc", i), v
    for i, v in enumerate(f.extra):
        yield ("flags", "extra", i), v


def check_printable(c: Compiled, target: str) -> None:
    """Refuse what a text target cannot carry: a control character or line break in any value
    (a newline in a YAML or llama-swap value would change the document, an escape sequence would
    act on the terminal the output is printed to). Plan values are reported at their key."""
    if target not in _TEXT_TARGETS:
        return
    for key, v in _plan_strings(c):
        bad = first_unsafe(v)
        if bad is not None:
            name = ".".join(str(k) for k in key[:2]) + (f"[{key[2]}]" if len(key) > 2 else "")
            raise c.plan.error_at_key(key, f"{name} has a control character ({bad}): it cannot be written "
                                      f"safely into the {target} output", hint="remove it from the value")
    if target == "llama-swap":
        # llama-swap expands ${...} macros anywhere in cmd, inside quotes too, and has no escape
        for key, v in _plan_strings(c):
            if "${" in v and any(v in a for a in c.argv):
                name = ".".join(str(k) for k in key[:2]) + (f"[{key[2]}]" if len(key) > 2 else "")
                raise c.plan.error_at_key(key, f"{name} contains '${{': llama-swap expands ${{...}} macros anywhere "
                                          "in cmd, quoted or not, so the value cannot be written as it is",
                                          hint="remove the '${' (or give the value through a macro of your own)")
        for v in c.argv:
            if "${" in v:
                raise MoeconfError(f"the value {v!r} contains '${{': llama-swap would expand it as a macro",
                                   path=c.plan.path)
    for v in (*c.argv, *([_plan_stem(c)] if target == "llama-swap" else [])):
        bad = first_unsafe(v)
        if bad is not None:
            raise MoeconfError(f"the value {v!r} has a control character ({bad}): it cannot be written safely "
                               f"into the {target} output", path=c.plan.path,
                               hint="a tensor name or a path given on the command line carries it")


def yaml_key(s: str) -> str:
    """A mapping key: plain when YAML reads it back as the same string, else single-quoted."""
    if _YAML_PLAIN_KEY.fullmatch(s) and s.lower() not in _YAML_SPECIAL:
        return s
    return yaml_str(s)


def shell_line(argv: list[str] | tuple[str, ...]) -> str:
    return shlex.join(argv)


def emit_env(c: Compiled) -> str:
    eng = c.engine
    if not eng.env_override_tensor:
        why = ("ik_llama.cpp reads no -ot, --n-cpu-moe, --fit or split mode from the environment"
               if eng.name == "ik_llama.cpp" else f"{eng.label} has no LLAMA_ARG_OVERRIDE_TENSOR (b7536+)")
        raise MoeconfError(f"no env form for {eng.label}: {why}", path=c.plan.path,
                           hint="use --target " + eng.name + ", docker, compose or llama-swap")
    f = c.plan.config.flags
    t = c.plan.config.targets
    extra: list[tuple[str, str]] = []
    if f.extra:
        from moeconf.engines.llamaconfig import env_form

        extra, problem = env_form(list(f.extra), eng)
        if problem is not None:
            raise MoeconfError(f"no environment form for the engine flag {problem}", path=c.plan.path,
                               hint="drop it, or use --target llama.cpp, docker, compose or llama-swap")
    from moeconf.engines.options import env_var, options

    lines: list[tuple[str, str]] = [(env_var("-m"), _model_override(c) or "")]
    if f.rpc:
        lines.append((env_var("--rpc"), ",".join(f.rpc)))
    ngl = f.n_gpu_layers
    lines.append((env_var("-ngl"), "999" if ngl == "all" else str(ngl)))
    if eng.has_fit:
        lines.append((env_var("-fit"), "on" if f.fit else "off"))
    # the plan's fields that have a variable, their values as written (engines/options.py)
    simple = [(o.env, getattr(f if o.section == "flags" else t, o.field)) for o in options()
              if o.field is not None and o.env and o.field not in ("serve_path", "rpc", "n_gpu_layers", "fit",
                                                                   "tensor_split")]
    lines += [(k, str(v)) for k, v in simple if v is not None]
    if f.tensor_split:
        lines.append((env_var("-ts"), tensor_split_text(f.tensor_split)))
    if f.no_mmap or f.mlock:
        if eng.has_load_mode:
            lines.append((env_var("-lm"), load_mode(f.no_mmap, f.mlock)))
        else:
            if f.no_mmap:
                lines.append(("LLAMA_ARG_NO_MMAP", "1"))
            if f.mlock:
                lines.append(("LLAMA_ARG_MLOCK", "1"))
    if c.ot:
        lines.append((env_var("-ot"), c.ot))
    clash = next((k for k, _ in extra if any(k == have for have, _ in lines)), None)
    if clash is not None:
        raise MoeconfError(f"[flags] extra arguments set {clash}, which the plan sets already", path=c.plan.path,
                           hint="give it once, as the plan's own setting")
    lines += extra
    for k, v in lines:
        # compose and python-dotenv strip a value's whitespace, Unicode spaces (U+00A0, ...) included,
        # where docker --env-file keeps it: such a value would not read back the same everywhere
        if any(ch in v for ch in " \t\n#'\"$") or any(ch.isspace() for ch in v):
            raise MoeconfError(f"{k} value {v!r} cannot be written unquoted in a .env file", path=c.plan.path)
    # Unquoted: docker --env-file takes values verbatim (quotes would become part of the value)
    return "".join(f"{k}={v}\n" for k, v in lines)


def emit_docker(c: Compiled) -> str:
    return shell_line(docker_argv(c)) + "\n"


def yaml_str(s: str, compose: bool = False) -> str:
    """A YAML single-quoted scalar: backslashes stay literal; compose needs `$` doubled. Only for
    values without control characters or line breaks (`check_printable`): single quotes would
    fold a line break into a space."""
    if compose:
        s = s.replace("$", "$$")
    return "'" + s.replace("'", "''") + "'"


def emit_compose(c: Compiled) -> str:
    t = c.plan.config.targets
    port = published_port(c)
    lines = ["services:", f"  {yaml_key(t.compose_service)}:", f"    image: {yaml_str(docker_image(c), compose=True)}",
             "    command:"]
    lines += [f"      - {yaml_str(a, compose=True)}" for a in server_args(c, for_container=True)]
    lines += ["    ports:", f"      - {yaml_str(f'{port}:{port}')}"]
    if t.docker_volumes:
        lines.append("    volumes:")
        lines += [f"      - {yaml_str(v, compose=True)}" for v in t.docker_volumes]
    if t.docker_backend in ("cuda", "cuda13"):
        lines += ["    deploy:", "      resources:", "        reservations:", "          devices:",
                  "            - driver: nvidia", "              count: all", "              capabilities: [gpu]"]
    elif t.docker_backend != "cpu":
        lines.append("    devices:")
        devs = _DOCKER_DEVICES[t.docker_backend][1::2]
        lines += [f"      - {yaml_str(d)}" for d in devs]
    return "\n".join(lines) + "\n"


def emit_llama_swap(c: Compiled) -> str:
    t = c.plan.config.targets
    name = t.llama_swap_model or _plan_stem(c)
    argv = llama_swap_argv(c)
    # llama-swap drops lines starting with '#', joins trailing backslashes, expands ${...}
    # macros, then splits like a POSIX shell: one argument pair a line, regexes single-quoted.
    body = _pairs(argv, c.engine)
    lines = ["models:", f"  {yaml_str(name)}:", "    cmd: |"]  # a line break in any value is refused
    lines += [f"      {line}" for line in body]
    port = t.port or extra_value(c, "--port")
    if port is not None:
        lines.append(f"    proxy: {yaml_str(f'http://127.0.0.1:{port}')}")
    return "\n".join(lines) + "\n"


def _pairs(argv: list[str], engine: Engine) -> list[str]:
    """The binary, then each option with its values (engines/argvread.py read_argv), a line each."""
    from moeconf.engines.argvread import read_argv

    out: list[str] = [_swap_quote(argv[0])]
    for given in read_argv(argv, engine, binary=True).options:
        words = (given.word,) if given.inline else (given.word, *given.values)
        out.append(" ".join(_swap_quote(w.text) for w in words))
    return out


def _swap_quote(a: str) -> str:
    return a if a == "${PORT}" else shlex.quote(a)  # the macro must stay unquoted for llama-swap


def _plan_stem(c: Compiled) -> str:
    import os

    base = os.path.basename(c.plan.path)
    return base.rsplit(".", 1)[0] if "." in base else base


def emit(c: Compiled, target: str) -> str:
    """One target's text, read back and simulated as the engine will receive it before it is
    returned (`moeconf.emitting.readback`): a mismatch is an internal error, never an output."""
    from moeconf.emitting.readback import verify_output

    check_printable(c, target)
    text = _render(c, target)
    verify_output(c, target, text)
    return text


def _render(c: Compiled, target: str) -> str:
    if target in ("llama.cpp", "ik_llama.cpp"):
        if target != c.engine.name:  # pragma: no cover - the CLI recompiles for the asked engine
            raise MoeconfError(f"compiled for {c.engine.name}, not {target}")
        return shell_line(c.argv) + "\n"
    if target == "argv":
        return json.dumps(list(c.argv)) + "\n"
    if target == "env":
        return emit_env(c)
    if target == "docker":
        return emit_docker(c)
    if target == "compose":
        return emit_compose(c)
    if target == "llama-swap":
        return emit_llama_swap(c)
    if target == "json":
        return json.dumps(c.json(), indent=1) + "\n"
    if target == "ot":
        return c.ot + "\n"
    raise MoeconfError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")


def container_warnings(c: Compiled, target: str) -> list[str]:
    """What a container output cannot do as printed: with no volume the container has no file at
    the `-m` path (docker and compose mount nothing by default)."""
    if target not in ("docker", "compose") or c.plan.config.targets.docker_volumes:
        return []
    model = _model_override(c) or "the model"
    return [f"the {target} output mounts no volume, so the container has no file at -m {model}: set [targets] "
            "docker_volumes = [\"/host/models:/models\"] (moeconf fit: --docker-volume HOST:CONTAINER), with -m "
            "the path inside the container"]
