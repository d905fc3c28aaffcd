"""The last step before anything is printed: read compile's output back the way the engine will
receive it (after the shell, docker compose, llama-swap or an env file have done their part) and
simulate it with `explain`'s own code. Every tensor must land where the plan says, and every word
must survive the round trip; otherwise it is a moeconf bug (`OutputMismatch`), never an output.

The readers are the linter's (`moeconf.linting.shell`, `moeconf.linting.sources`), so what
`compile` prints, what `lint` reads and what `explain` shows are one model of the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import moeconf.emitting.commands as tg
from moeconf.engines.argvread import Arg, read_argv, unknown_flag_message
from moeconf.engines.cmdline import parse_invocation
from moeconf.engines.options import env_var
from moeconf.explanation import Explanation, explain_invocation

if TYPE_CHECKING:
    from moeconf.compiled import Compiled
    from moeconf.engines import Engine


class OutputMismatch(AssertionError):
    """compile's output would not do what the plan says: a bug in moeconf, never user error."""


def verify_invocation(c: Compiled, args: Sequence[str], env: Mapping[str, str] | None, what: str) -> Explanation:
    """Simulate `args` (binary first or not) and `env` as the engine reads them; the placement
    must equal the plan's, tensor by tensor, and the engine must accept every item."""
    invocation = parse_invocation([Arg(a) for a in args], c.engine, {k: Arg(v) for k, v in (env or {}).items()})
    ex = explain_invocation(c.inventory, invocation, list(c.plan.config.engine.gpus))
    # options of `[flags] extra` the engine is not known to accept were already reported as
    # warnings by compile (they pass through unchecked); anything else refused is a bug
    extra = set(c.plan.config.flags.extra)
    passed = {unknown_flag_message(c.engine, a.text, closest)
              for a, closest in invocation.unknown_flags if a.text in extra}
    refusals = [r for r in ex.refusals if r not in passed]
    if refusals:
        raise OutputMismatch(f"{what}: {c.engine.label} would refuse it: {refusals[0]}")
    got, want = ex.placement.devices, c.placement.devices
    diff = [t.name for t in c.inventory.tensors if got[t.name] != want[t.name]]
    if diff:
        n = diff[0]
        raise OutputMismatch(f"{what} puts {len(diff)} tensor(s) elsewhere than the plan, e.g. {n}: "
                             f"{got[n]} (as {c.engine.label} reads it) vs {want[n]} (the plan)")
    return ex


def verify_argv(c: Compiled) -> Explanation:
    """The compiled argv, every flag included (`-ngl`, `-ts`, `extra`, ...), as `explain` reads it."""
    return verify_invocation(c, c.argv, None, "the compiled command line")


def _same(got: Sequence[str], want: Sequence[str], what: str) -> None:
    if list(got) != list(want):
        k = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        a = got[k] if k < len(got) else "(nothing)"
        b = want[k] if k < len(want) else "(nothing)"
        raise OutputMismatch(f"{what}: word {k + 1} reads back as {a!r}, not {b!r}")


def _one_command(text: str, what: str) -> list[str]:
    from moeconf.linting.shell import split_commands

    commands, _, problems = split_commands(text, assign=False)
    if problems:
        raise OutputMismatch(f"{what}: a shell would refuse it: {problems[0].message}")
    if len(commands) != 1:
        raise OutputMismatch(f"{what}: a shell reads {len(commands)} commands, not one")
    return [w.text for w in commands[0].words]


def _with_ot(argv: Sequence[str], value: str, engine: Engine) -> list[str]:
    """`argv` with its -ot value replaced by `value` (the `ot` target prints only the value)."""
    out = list(argv)
    first = next(iter(read_argv(out, engine).of("-ot")), None)
    if first is not None:
        del out[first.index:first.index + 2]
    if value:
        out += ["-ot", value]
    return out


def read_back(c: Compiled, target: str, text: str) -> tuple[list[str], dict[str, str], list[str] | None]:
    """(argv, env) as the engine receives them from `text`, and the argv moeconf meant to give it
    (None where only the placement can be compared)."""
    what = f"the {target} output"
    if target in ("llama.cpp", "ik_llama.cpp"):
        return _one_command(text, what), {}, list(c.argv)
    if target == "argv":
        return [str(a) for a in json.loads(text)], {}, list(c.argv)
    if target == "json":
        data = json.loads(text)
        if data["ot"] != c.ot or data["placement"] != c.placement.as_json():
            raise OutputMismatch(f"{what}: its ot or placement is not the compiled one")
        return [str(a) for a in data["argv"]], {}, list(c.argv)
    if target == "ot":  # the value itself, word for word (an escape lost can leave the placement the same)
        return _with_ot(c.argv, text.rstrip("\n"), c.engine), {}, list(c.argv)
    if target == "docker":
        words = _one_command(text, what)
        image = tg.docker_image(c)
        server = tg.server_args(c, for_container=True)
        # the words up to the image, by position: a volume may read the same as the image
        head = len(tg.docker_argv(c)) - len(server)
        if words[:2] != ["docker", "run"] or len(words) < head or words[head - 1] != image:
            raise OutputMismatch(f"{what}: no `docker run ... {image}` command")
        return words[head:], {}, server
    from moeconf.linting import sources

    if target == "env":
        launches = sources.dotenv_launches(what, text)
        env = {k: a.text for la in launches for k, a in la.env.items()}
        model = tg._model_override(c)
        var = env_var("-m")
        if env.get(var) != model:
            raise OutputMismatch(f"{what}: {var} reads back as {env.get(var)!r}, not {model!r}")
        return [], env, None
    if target in ("compose", "llama-swap"):
        launches, notes = sources.yaml_launches(what, text, variables={})
        if notes:
            raise OutputMismatch(f"{what}: {notes[0].message}")
        if len(launches) != 1:
            raise OutputMismatch(f"{what}: {len(launches)} engine launches read back, not one")
        la = launches[0]
        args = [a.text for a in la.args]
        env = {k: a.text for k, a in la.env.items()}
        if target == "compose":
            return args, env, tg.server_args(c, for_container=True)
        want = tg.llama_swap_argv(c)
        # llama-swap fills ${PORT} with the port it picks: any value reads back
        return args, env, [a if w == "${PORT}" else w for a, w in zip(args, want, strict=False)] + want[len(args):]
    raise OutputMismatch(f"no reader for target {target!r}")


def verify_output(c: Compiled, target: str, text: str) -> None:
    """`text` (one target's output) read back and simulated: same words, same placement."""
    what = f"the {target} output"
    try:
        argv, env, want = read_back(c, target, text)
    except (ValueError, KeyError, TypeError, IndexError) as e:  # JSON that does not parse, a missing key
        raise OutputMismatch(f"{what} does not read back: {e}") from None
    if want is not None:
        _same(argv, want, what)
    verify_invocation(c, argv, env, what)
