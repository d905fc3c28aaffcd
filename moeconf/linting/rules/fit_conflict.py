"""fit-conflict: `--fit` fighting manual placement.

Why: mainline turns `--fit` on by default (b7416+). With `-ngl`, `-ot`, `--cpu-moe` or
`--n-cpu-moe` set by hand, fit gives up ("already set by user, abort") and loads your settings,
which may not fit, but only after it may have cut the context to `--fit-ctx` (4096) when `-c`
was not given. Write `-fit off`. ik_llama.cpp refuses `--fit` with `-ot` or `--n-cpu-moe`
outright ("Manual tensor overrides cannot be used with --fit").

What fit would do instead: when `.moeconf.toml` gives the size of every GPU the line uses
(`[gpu_memory]`) and the model is known, the finding also says what `moeconf fit` places for
those budgets at the line's own context, batch and cache types (which blocks' routed experts
stay on each GPU, the `-ot` and the predicted memory), and the command that writes it. That
answer keeps every always-active tensor on the GPU; llama.cpp's own fit would only move whole
layers, and does nothing once placement is manual. llama-bench has no `--fit`: its lines are not
checked by this rule.

FAIL (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -ot "exps=CPU"

FAIL (engine=llama.cpp, model=qwen3-30b-a3b, gpu_memory=CUDA0:16GiB):
    llama-server -m m.gguf -ngl 999 -c 32768 -ctk q8_0 -ctv q8_0 -ot "exps=CPU"

PASS (engine=llama.cpp, model=glm-4.5-air):
    llama-server -m m.gguf -ngl 999 -fit off -c 32768 -ot "exps=CPU"

PASS (engine=llama.cpp, model=qwen3-30b-a3b):
    llama-bench -m m.gguf -ngl 99 -ot exps=CPU --no-op-offload 1 -p 512 -n 128 -fa 1
"""

from __future__ import annotations

from collections.abc import Iterator

from moeconf.engines.options import env_var
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.linting.rules._memory import fit_instead, over_devices

CODE = "MOE020"
NAME = "fit-conflict"
SEVERITY = "warning"
NEEDS_MODEL = False
READS_SETTINGS = True  # skipped on a line the engine cannot read (flag-value-refused)


def _instead(ctx: Context) -> str:
    """What moeconf fit places instead, stated once per line: when memory-over-device reports the
    line (and the fit command with it), a pointer to that finding instead of a second analysis."""
    over = over_devices(ctx) if "memory-over-device" in ctx.enabled else []
    if over:
        return f" (memory-over-device at this line: {', '.join(over)} over its size, and what fits)"
    return fit_instead(ctx)


def check(ctx: Context) -> Iterator[Hit]:
    inv, eng = ctx.invocation, ctx.engine
    if not eng.has_fit:
        return
    manual = bool(inv.ot or inv.cpu_moe or inv.n_cpu_moe or inv.n_cpu_ffn)
    if eng.fit_with_overrides == "error":
        if inv.fit and inv.fit[1] and (inv.ot or inv.n_cpu_moe or inv.cpu_moe):
            yield Hit(*ctx.at_arg(inv.fit[0]), "ik_llama.cpp refuses --fit with -ot or --n-cpu-moe "
                      "(\"Manual tensor overrides cannot be used with --fit\"): remove --fit" + _instead(ctx),
                      "error")
        return
    fit_on = inv.fit[1] if inv.fit else eng.fit_default_on
    if not fit_on or not (manual or inv.ngl):
        return
    # an environment-only launch (a .env file, compose's environment:) is fixed in its own form
    by_env = ctx.kind == "env" or not inv.reading.flags
    placed_by = next((v.value for v in inv.ot), None)
    if inv.fit:
        where = ctx.at_arg(inv.fit[0])
    elif by_env and placed_by is not None:
        where = ctx.at_arg(placed_by)
    else:
        where = (ctx.line, ctx.column)
    how = "-fit on" if inv.fit else f"--fit is on by default ({eng.label})"
    ctx_cut = "" if inv.ctx_size else (", after possibly cutting the context to --fit-ctx (4096) since "
                                       + (env_var("-c") if by_env else "-c") + " is not given")
    fix = f"set {env_var('-fit')}=off" if by_env else "add -fit off"
    yield Hit(*where, f"{how} with manual placement: fit gives up (\"already set by user, abort\") and loads "
              f"your settings{ctx_cut}; {fix}" + _instead(ctx))

