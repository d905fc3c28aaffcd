"""The engine's own argv for a compiled plan, in each engine's spelling (binary first).

Order matters: `--rpc` comes before `-ot` (the RPC device must exist when `-ot` names it).
For manual placement on mainline, `-fit off` is emitted unless the plan asks for fit: fit would
give up on user-set `-ngl`/`-ot` anyway, after possibly cutting the context.
"""

from __future__ import annotations

from moeconf.engines import Engine
from moeconf.engines.options import for_field, options, plain_fields, row
from moeconf.errors import PlanError
from moeconf.model.inventory import Inventory, first_shard
from moeconf.plan import Plan
from moeconf.synth.rules import Synthesis

DEFAULT_BINARY = "llama-server"


def serve_path(plan: Plan, inv: Inventory, override: str | None = None) -> str:
    """The `-m` path: `[model] serve_path` when set, else the GGUF that was read (`override`, the
    `--model` path, or the plan's `path`). Always the first shard of a split model: the engines
    refuse any other. A manifest has no GGUF path, so without `serve_path` it is an error."""
    cfg = plan.config.model
    if cfg.serve_path:
        return first_shard(str(cfg.serve_path))
    if not inv.from_manifest:
        return first_shard(override or plan.resolve_path(cfg.path))
    if override:
        raise PlanError(
            f"--model {override} is a manifest, so moeconf does not know the GGUF path the engine should load",
            path=plan.path,
            hint="set [model] serve_path = \"/models/NAME-00001-of-0000N.gguf\" (the path as the server sees it) "
            "or give --model the GGUF",
        )
    raise plan.error_at_key(
        ("model", "path"),
        "the model is a manifest, so moeconf does not know the GGUF path the engine should load",
        hint="set [model] serve_path = \"/models/NAME-00001-of-0000N.gguf\" (the path as the server sees it)",
    )


def remote_model_args(plan: Plan, eng: Engine, inv: Inventory, override: str | None = None) -> list[str] | None:
    """How the engine fetches a remote model (moeconf.hub) itself, when the plan's model is one and
    no `serve_path` is set: llama.cpp `-hf REPO[:TAG]` (`--hf-file PATH` for hf://) or `-mu URL`;
    ik_llama.cpp 0.1.5 has no tag resolution, so `-hfr REPO -hff PATH` with the file moeconf
    resolved. None for a local model."""
    import os

    from moeconf.hub import is_remote, parse_ref

    spec = override or plan.config.model.path
    if plan.config.model.serve_path or not inv.from_manifest or not is_remote(spec) or os.path.exists(
            plan.resolve_path(spec)):
        return None
    ref = parse_ref(spec)
    if eng.name == "ik_llama.cpp" and ref.url is None:
        from moeconf.hub.remote import resolve

        return ["-hfr", str(ref.repo), "-hff", resolve(ref).files[0]]
    return ref.engine_args()


def load_mode(no_mmap: bool, mlock: bool) -> str:
    """mainline `-lm` value for the old --no-mmap / --mlock switches (b10108+)."""
    return {(True, False): "none", (True, True): "mlock", (False, True): "mmap+mlock"}[(no_mmap, mlock)]


def _load_mode(plan: Plan, eng: Engine) -> list[str]:
    f = plan.config.flags
    if not (f.no_mmap or f.mlock):
        return []
    if eng.has_load_mode:
        return [row("-lm").flag, load_mode(f.no_mmap, f.mlock)]
    return [for_field(k).flag for k in ("no_mmap", "mlock") if getattr(f, k)]


def build_argv(plan: Plan, eng: Engine, inv: Inventory, syn: Synthesis, model_path: str | None = None,
               *, with_binary: bool = True, need_model: bool = True) -> list[str]:
    """The engine's argv. `need_model=False` (for outputs without a command line, like the bare
    `-ot` value) leaves `-m` out when the model is a manifest without `serve_path`."""
    f = plan.config.flags
    t = plan.config.targets
    plain = set(plain_fields())
    argv: list[str] = [t.binary or DEFAULT_BINARY] if with_binary else []
    remote = remote_model_args(plan, eng, inv, model_path)
    if remote is not None:
        argv += remote
    elif need_model or plan.config.model.serve_path or not inv.from_manifest:
        argv += ["-m", serve_path(plan, inv, model_path)]
    if f.rpc:
        argv += ["--rpc", ",".join(f.rpc)]
    ngl = f.n_gpu_layers
    argv += ["-ngl", "999" if ngl == "all" else str(ngl)]
    if eng.has_fit:
        if eng.fit_flag == "-fit":
            argv += ["-fit", "on" if f.fit else "off"]
        elif f.fit:
            argv += ["--fit"]
    # the plan's own fields, each as the option table (engines/options.py) spells it, in its order
    for o in options():
        if o.field == "flash_attn" and f.flash_attn is not None:
            if eng.fa_takes_value:
                argv += [o.flag, f.flash_attn]
            elif f.flash_attn == "on":
                argv += [o.flag]
            elif f.flash_attn == "auto":
                raise plan.error_at_key(("flags", "flash_attn"), f"{eng.label} has no {o.flag} auto (b6325+)")
        elif o.field == "no_mmap":
            argv += _load_mode(plan, eng)
        elif o.field == "tensor_split" and f.tensor_split:
            argv += [o.flag, tensor_split_text(f.tensor_split)]
        elif o in plain:
            v = getattr(f if o.section == "flags" else t, o.field or "")
            if o.value == "switch":
                argv += [o.flag] if v else []
            elif v is not None and v != "":
                argv += [o.flag, str(v)]
    if syn.items:
        if eng.max_overrides is not None and len(syn.items) > eng.max_overrides:
            raise PlanError(f"{len(syn.items)} -ot items exceed {eng.name}'s limit of {eng.max_overrides}",
                            path=plan.path)
        argv += ["-ot", syn.value]
    argv += list(f.extra)
    return argv


def tensor_split_text(ts: list[float]) -> str:
    """`-ts` as written on a command line or in LLAMA_ARG_TENSOR_SPLIT: whole numbers without `.0`."""
    return ",".join(_num(x) for x in ts)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)
