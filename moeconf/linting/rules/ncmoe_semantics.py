r"""ncmoe-semantics: what `--n-cpu-moe N` really takes, on this engine, version and device count.

Why: the same N means different blocks. Mainline, and ik_llama.cpp before 2026-08-07 (package
0.1.5) on one GPU, take the FIRST N block indices, dense leading blocks included (DeepSeek's 0-2
have no experts: `--n-cpu-moe 3` moves nothing); ik_llama.cpp 0.1.5 names the weights only, so
expert biases stay on the GPU. Newer ik_llama.cpp (PR #2262) takes the LAST N blocks that have
experts, skipping nextn blocks. ik_llama.cpp with two or more GPUs (`-sm layer`, any version)
shares N over the GPUs by their layer counts, and each GPU gives up its own last blocks, experts
or not. The rule says what the engine will do, and stays silent when the comments by the command
line already say it (for example "first N layers" on a build that takes the first N) and no
block is wasted.

FAIL (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

FAIL (engine=ik_llama.cpp, version=0.1.5, model=qwen3-30b-a3b):
    # --n-cpu-moe counts from the highest layers
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

FAIL (engine=ik_llama.cpp, version=2026-08-15, model=qwen3-30b-a3b):
    # keep the MoE weights of the first 10 layers in RAM
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

FAIL (engine=ik_llama.cpp, version=0.1.5, model=qwen3-30b-a3b):
    # moeconf: gpus=CUDA0+CUDA1
    # keep the MoE weights of the first 10 layers in RAM
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

PASS (engine=ik_llama.cpp, version=0.1.5, model=qwen3-30b-a3b):
    # keep the MoE weights of the first 10 layers in RAM
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

PASS (engine=ik_llama.cpp, version=0.1.5, model=qwen3-30b-a3b):
    # moeconf: gpus=CUDA0+CUDA1
    # --n-cpu-moe is shared per GPU: each GPU keeps its last layers' experts in RAM
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

PASS (engine=ik_llama.cpp, version=2026-08-15, model=qwen3-30b-a3b):
    # --n-cpu-moe counts from the highest layers
    llama-server -m m.gguf -ngl 999 --n-cpu-moe 10

PASS (engine=llama.cpp, model=deepseek-v3):
    llama-server -m m.gguf -ngl 999 -ot "blk\\.([3-9]|1[0-2])\\.ffn_.*_exps=CPU"
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from moeconf.engines import IK_NEWEST_DATE, Engine, ik, mainline
from moeconf.engines.cmdline import NcmoeTake, invocation_ncmoe, ncmoe_take
from moeconf.linting.model import Context
from moeconf.linting.rules._base import Hit
from moeconf.model.inventory import Inventory, format_ranges

CODE = "MOE017"
NAME = "ncmoe-semantics"
SEVERITY = "warning"
NEEDS_MODEL = True

_ABOUT = re.compile(r"n-?cpu-?moe|ncmoe|\bmoe\b|expert", re.I)
_FIRST = re.compile(r"\bfirst\s+(\d+|n)\b|\blowest\b|\bfrom\s+(the\s+)?(start|beginning|bottom|layer\s+0)\b"
                    r"|\bstarting\s+(at|from)\s+(layer\s+)?0\b", re.I)
_LAST = re.compile(r"\blast\s+(\d+|n)\b|\bhighest\b|\bfrom\s+the\s+(top|end)\b|\btop\s+(\d+|n)\b", re.I)
_PER_DEVICE = re.compile(r"\bper\s+(gpu|device)\b|\beach\s+(gpu|device)\b|\bproportion", re.I)


def words(ctx: Context) -> str:
    """The comments by the launch that talk about MoE offload: the comment block right above the
    launch, and comments on the launch's own lines (none for a command line given to explain)."""
    if ctx.kind == "explain":
        return ""
    try:
        with open(ctx.path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    args = [a for a in ctx.invocation.args if a.line]
    first = min([ctx.line, *(a.line for a in args)]) if ctx.line else 0
    last = max([first, *(a.line for a in args)])
    if first <= 0:
        return ""
    out = []
    i = first - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        out.append(lines[i])
        i -= 1
    for ln in lines[first - 1:last]:
        if "#" in ln:
            out.append(ln[ln.index("#"):])
    return "\n".join(c for c in out if _ABOUT.search(c))


def said(text: str) -> str | None:
    """Which way the user's words say --n-cpu-moe counts: first, last, per-device, or None."""
    if _PER_DEVICE.search(text):
        return "per-device"
    first, last = bool(_FIRST.search(text)), bool(_LAST.search(text))
    if first != last:
        return "first" if first else "last"
    return None


def _direction(take: NcmoeTake) -> str:
    return take.path if take.path in ("first", "last", "per-device") else "none"


def _summary(eng: Engine, take: NcmoeTake, n_dev: int, gpus: list[str]) -> str:
    devs = f"{n_dev} GPUs" if n_dev > 1 else "one GPU"
    blocks = format_ranges(sorted(take.blocks)) if take.blocks else "no block"
    if take.path == "per-device":
        per = ", ".join(f"{gpus[d] if d < len(gpus) else d}: {k} of {c} layers"
                        for d, (c, k) in enumerate(take.shares))
        est = " (assuming ik splits the layers evenly; it splits by free memory)" if take.estimated_split else ""
        return (f"--n-cpu-moe {take.n} on {eng.label} with {devs} (-sm layer) is shared by layer count ({per}) "
                f"and each GPU gives up its own last blocks: {blocks}{est}")
    how = {"first": "the first", "last": "the last"}.get(take.path, "")
    extra = " with experts" if take.path == "last" else ""
    return f"--n-cpu-moe {take.n} on {eng.label} ({devs}) takes {how} {take.n} blocks{extra}: {blocks}"


def _biases(inv: Inventory, take: NcmoeTake) -> list[str]:
    """Expert tensors of the taken blocks that the weights-only pattern leaves on the GPU."""
    if not any(p.endswith(r"\.weight") for p in take.patterns):
        return []
    taken = set(take.blocks)
    return sorted({t.base + "." + t.name.rsplit(".", 1)[-1] for t in inv.tensors
                   if t.layer in taken and t.group == "experts" and not t.name.endswith(".weight")})


def check(ctx: Context) -> Iterator[Hit]:
    inv = ctx.inventory
    assert inv is not None and ctx.explanation is not None
    moe = inv.layers_of_kind("moe")
    dense = set(inv.layers_of_kind("dense"))
    nextn = set(inv.layers_of_kind("nextn"))
    from moeconf.explanation import available_devices

    gpus = available_devices(ctx.invocation, ctx.gpus)[1:]
    dropped = ctx.engine.ot_needs_gpu and (not gpus or ctx.invocation.n_gpu_layers() == 0)
    text = words(ctx)
    way = said(text)
    for take, origin, _order in invocation_ncmoe(ctx.invocation, inv, len(gpus)):
        if not origin.startswith("--n-cpu-moe"):
            continue
        flag = next((f for f, n, _o, _s in ctx.invocation.n_cpu_moe if n == take.n), None)
        where = ctx.at_arg(flag)
        if dropped:
            yield Hit(*where, f"--n-cpu-moe {take.n} does nothing: {ctx.engine.label} drops it with -ngl 0 or no GPU")
            continue
        problems = []
        taken = set(take.blocks)
        if dense & taken:
            d = sorted(dense & taken)
            problems.append(f"dense block{'s' if len(d) > 1 else ''} {format_ranges(d)} "
                            f"{'have' if len(d) > 1 else 'has'} no experts, so only "
                            f"{len(taken - dense - nextn)} MoE layers move")
        if nextn & taken:
            problems.append(f"it counts the nextn block {format_ranges(sorted(nextn & taken))}")
        if take.n > len(moe) and take.path != "per-device":
            staying = sorted(set(moe) - taken)
            blocks = f"block{'s' if len(staying) > 1 else ''} {format_ranges(staying)}"
            problems.append(f"{take.n} exceeds the model's {len(moe)} MoE layers: every expert moves" if not staying
                            else f"{take.n} is more than the model's {len(moe)} MoE layers, but it counts blocks: "
                                 f"the experts of {blocks} stay on the GPU")
        mismatch = way is not None and way != _direction(take)
        if mismatch:
            problems.insert(0, f"the comment by this line says it counts the {way} layers"
                            if way != "per-device" else "the comment by this line says it is shared per GPU")
        if take.path == "per-device" and way != "per-device" and not mismatch:
            problems.append("the blocks are not a first-N or last-N range")
        if ctx.engine_source == "default" and way is None:
            others = {e.label: sorted(ncmoe_take(e, inv, take.n, n_devices=len(gpus)).blocks)
                      for e in (mainline(), ik("0.1.5"), ik(IK_NEWEST_DATE))}
            if len({tuple(b) for b in others.values()}) > 1:
                problems.append("the engine is not declared: " + "; ".join(
                    f"{label} takes {format_ranges(b)}" for label, b in others.items())
                    + " (add '# moeconf: engine=... version=...')")
        if not problems:
            continue
        msg = _summary(ctx.engine, take, len(gpus), gpus) + "; " + "; ".join(problems)
        left = _biases(inv, take)
        if left:
            msg += f"; the pattern names weights only, so {', '.join(left)} stay on the GPU"
        yield Hit(*where, msg + "; say which layers with -ot instead (moeconf compile)")
