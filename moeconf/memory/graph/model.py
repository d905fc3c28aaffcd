"""A placement's compute buffers through the engine's graph: the model's weights as leafs on the
devices the placement gives them, the KV cache on each layer's home device, the architecture's
composition (`archs.ARCHS`), then the scheduler and the allocator (`sched`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from moeconf.engines import HOST
from moeconf.engines.settings import MemorySettings
from moeconf.engines.simulate import output_layer_tensors
from moeconf.memory.archgraph import input_width, output_device
from moeconf.memory.geometry import LayerAttention, geometry
from moeconf.memory.graph.archs import ARCHS, COMPOSITIONS, Facts, traits
from moeconf.memory.graph.archs.common import unchecked_ffn_biases, unchecked_fused_qkv_bias, unchecked_scales
from moeconf.memory.graph.blocks import Cparams, GraphContext, Hparams, MissingTensor, Mla, Weights, rotation_width
from moeconf.memory.graph.ggml import CGraph, Ctx, Tensor
from moeconf.memory.graph.sched import Backend, Scheduler, backend_for
from moeconf.memory.indexer import indexer_row_layers, indexer_width
from moeconf.memory.keys import int_key
from moeconf.memory.kvcache import context_cells
from moeconf.memory.recurrent import kda_dims, shortconv_shape
from moeconf.memory.recurrent import shape as recurrent_shape
from moeconf.model.inventory import Inventory
from moeconf.model.percache import per_inventory
from moeconf.model.required import group_stops, load_refusals
from moeconf.placement import Placement

Setup = Cparams  # the context's settings the graph depends on


def build(placement: Placement, setup: Setup) -> tuple[GraphContext, list[Backend]]:
    """The graph of this placement under these settings, flash attention resolved as the engine
    resolves `-fa auto` (`fa_auto_off`)."""
    g, backends = _build(placement, setup)
    if setup.flash_attn and setup.fa_auto and fa_auto_off(placement, setup, g):
        setup = replace(setup, flash_attn=False, v_flat=True)
        g, backends = _build(placement, setup)
    return _unfused(placement, setup, g, backends)


# the fused ops llama_context::resolve_fused_ops probes after flash attention, in its order (docs/memory.md,
# "The engine's probes")
FUSED_PROBES = ("DSV4_HC_PRE", "DSV4_HC_COMB", "DSV4_HC_POST")


def fused_off(placement: Placement, setup: Setup, g: GraphContext, backends: list[Backend]) -> frozenset[str]:
    """The fused ops of `g` (`GraphContext.fused`) llama_context::resolve_fused_ops turns off for this placement
    (docs/memory.md, "The engine's probes")."""
    out = g.w.get("output.weight")
    homes = {backends[i].name for i in g.layer_backend.values()} | {out.buffer or HOST if out is not None else HOST}
    # a fused op reading a weight kept elsewhere (-ot blk.N.hc_attn_scale=CPU) runs where the weight is
    homes |= {s.buffer or HOST for _, t, _ in g.fused for s in t.src if s is not None and s.weights}
    if not g.fused or HOST not in homes or len(homes) < 2:
        return frozenset()
    off: set[str] = set()
    probe: tuple[GraphContext, Scheduler] | None = None
    for op in FUSED_PROBES:
        if not any(f[0] == op for f in g.fused):
            continue
        p, s = probe = probe or _probe(placement, replace(setup, unfused=frozenset(off)))
        if any(s.ids.get(t) != p.layer_backend.get(il) for o, t, il in p.fused if o == op):
            off.add(op)
            probe = None  # the next probe's graph has this op unfused
    return frozenset(off)


def fa_auto_off(placement: Placement, setup: Setup, g: GraphContext) -> bool:
    """Whether llama_context::resolve_fused_ops turns flash attention off under `-fa auto` (docs/memory.md,
    "The engine's probes")."""
    kv_devices = {t.buffer for kc, vc in g.kv.values() for t in (kc, vc)}
    if len(set(g.layer_backend.values())) < 2 and len(kv_devices) < 2:
        return False
    comp = COMPOSITIONS.get(placement.inventory.arch)
    if comp is not None and comp.memory is not None and comp.memory.refuses is not None \
            and comp.memory.refuses(setup.n_seq, setup.n_stream):  # the one-token form not composed (MiniMax-M3)
        return False
    p, s = _probe(placement, setup)
    layer_of = {kc: il for il, (kc, _) in p.kv.items()}
    fa = [(t, layer_of.get(k.view_src or k)) for t in p.gf.nodes
          if t.op == "FLASH_ATTN_EXT" and (k := t.src[1]) is not None]
    return any(il is not None and s.ids.get(t) != p.layer_backend.get(il) for t, il in fa)


def _probe(placement: Placement, setup: Setup) -> tuple[GraphContext, Scheduler]:
    """The probes' graph of one token per sequence (resolve_fused_ops), every tensor's backend assigned."""
    p, backends = _reused(placement, replace(setup, n_tokens=setup.n_seq, n_outputs=setup.n_seq, fa_auto=False))
    s = Scheduler(backends, pipeline=setup.pipeline, op_offload=setup.op_offload)
    s.assign(p.gf, p.pinned)
    return p, s


def _build(placement: Placement, setup: Setup) -> tuple[GraphContext, list[Backend]]:
    g, backends, f = _prologue(placement, setup)
    _compose(g, f, placement.inventory.arch)
    return g, backends


def _compose(g: GraphContext, f: Facts, arch: str) -> None:
    """The architecture's composition on `g`; a weight it reads and the file lacks named (`MissingTensor`)."""
    g.groups = f.groups  # llama-model.cpp reads the expert groups for every architecture, build_moe_ffn uses them
    try:
        ARCHS[arch](g, f)
    except MissingTensor as e:
        raise MissingTensor(e.name or g.w.missed) from None


def missing_refusal(inv: Inventory, e: MissingTensor, what: str) -> list[str]:
    """Why `what` (compute, traffic) is not modelled for a file lacking a weight the graph reads."""
    return [f"{what} not modelled for this {inv.arch} file: it lacks {e.name or 'a weight'}, which llama.cpp's "
            f"{inv.arch} graph reads in the form the file has: the pinned llama.cpp does not load it (its loader "
            "stops: \"tensor ... not found\", or building the graph fails); check the file's conversion"]


@dataclass
class _Built:
    """A graph built for one inventory and shape of placement (`_reuse_key`)."""

    inv: Inventory
    key: tuple[object, ...]
    g: GraphContext


_BUILT: list[_Built] = []  # the last graphs built (a search measures many placements of one model)
_BUILT_KEPT = 3  # a search's graph, its probes' of one token per sequence (`_probe`), one more


def _reuse_key(placement: Placement, setup: Setup, g: GraphContext, n_backends: int) -> tuple[object, ...]:
    """What of the placement the composition's nodes depend on beyond the devices of the weights and caches
    it reads: the tensors left out, the number of backends (the CPU's index, which the callback pins to),
    each layer's home where the callback pins a layer's norms to it (`GraphContext.cb`) or a duplicated weight
    has one tensor per device (rope_freqs), and the prologue's tensors in a device's buffer (`Ctx.bound`) as it
    named and shaped them (glm5-next's composition renames its indexer cache)."""
    homes = tuple(g.layer_backend[il] for il in sorted(g.layer_backend))
    pins = setup.n_tokens < 32 or g.cp.full_offload or "rope_freqs.weight" in g.w.by_name
    absent = frozenset(n for n, d in placement.devices.items() if d is None)
    bound = tuple((t.name, t.ne) for t in g.ctx.bound)
    return (setup, g.cp.full_offload, n_backends, absent, homes if pins else None, bound)


def _reused(placement: Placement, setup: Setup) -> tuple[GraphContext, list[Backend]]:
    """`_build`, reusing the last graph built for the same inventory and shape of placement
    (`_reuse_key`): the composition's nodes do not depend on where the weights and caches are, so only
    those tensors' devices are set again (from the prologue run for this placement). Scheduling it
    leaves it as it was (`Scheduler.assign`, `restore`)."""
    inv = placement.inventory
    g, backends, f = _prologue(placement, setup)
    key = _reuse_key(placement, setup, g, len(backends))
    n_bound = len(g.ctx.bound)
    for b in _BUILT:
        if b.inv is inv and b.key == key:
            for o, n in zip(b.g.ctx.bound[:n_bound], g.ctx.bound, strict=True):
                o.buffer = n.buffer
            b.g.layer_backend = g.layer_backend
            return b.g, backends
    _compose(g, f, inv.arch)
    if len(g.ctx.bound) == n_bound:  # the composition made no weight or cache of its own on a device
        _BUILT.insert(0, _Built(inv, key, g))
        del _BUILT[_BUILT_KEPT:]
    return g, backends


def _unfused(placement: Placement, setup: Setup, g: GraphContext,
             backends: list[Backend]) -> tuple[GraphContext, list[Backend]]:
    """`g` again with the fused ops the engine's probes turn off for this placement unfused (`fused_off`)."""
    off = fused_off(placement, setup, g, backends)
    return _build(placement, replace(setup, unfused=off)) if off else (g, backends)


def layer_devices(placement: Placement) -> dict[int, str]:
    """Each block's home device (from -ngl/-ts, never from -ot): where its KV cache lives."""
    defaults = placement.defaults
    out: dict[int, str] = {}
    for t in placement.inventory.tensors:  # each block's first tensor the engine creates, in the tensors' order
        if t.layer is not None and t.layer not in out and (d := defaults.get(t.name)) is not None:
            out[t.layer] = d
    return out


def _prologue(placement: Placement, setup: Setup) -> tuple[GraphContext, list[Backend], Facts]:
    """The graph's context before the composition: the weights on their devices, the KV caches on
    their layers', the hyperparameters and settings (docs/memory.md, "The graph's prologue")."""
    inv = placement.inventory
    geo = geometry(inv)
    layers = list(geo.layers)
    n_layer = len(layers)
    home = layer_devices(placement)
    # the GPUs in the engine's device order: the layers' homes in layer order, then any device only an override names
    gpus = dict.fromkeys(d for d in [*(home[il] for il in sorted(home)), *placement.devices.values()]
                         if d is not None and d != HOST)
    backends = [backend_for(d) for d in gpus] + [backend_for(HOST)]
    index = {b.name: i for i, b in enumerate(backends)}
    ctx = Ctx()
    by_name = {t.name: ctx.weight(t.name, t.type.upper(), t.shape, dev, -1 if t.layer is None else t.layer)
               for t in inv.tensors if (dev := placement.devices.get(t.name)) is not None
               and (t.layer is None or t.layer < n_layer)}
    if "rope_freqs.weight" not in by_name and "rope_factors_long.weight" in by_name:
        # LongRoPE (Phi-3): the long factors where a sequence's context exceeds the original training context
        orig = inv.metadata.hparam("rope.scaling.original_context_length") or inv.metadata.context_length or 0
        long = setup.n_kv > orig if isinstance(orig, int) else False
        by_name["rope_freqs.weight"] = by_name["rope_factors_long.weight" if long else "rope_factors_short.weight"]
    if "output.weight" not in by_name:  # a tied output: the engine's copy of token_embd
        emb = inv.by_name["token_embd.weight"]
        by_name["output.weight"] = ctx.weight(emb.name, emb.type.upper(), emb.shape, output_device(placement))
    ctk, ctv = setup.cache_k.upper(), setup.cache_v.upper()
    kv: dict[int, tuple[Tensor, Tensor]] = {}
    rs: dict[int, tuple[Tensor, Tensor]] = {}
    rec = recurrent_shape(inv) or shortconv_shape(inv)
    state = rec or kda_dims(inv)  # the KDA layers' state (kda.head_dim): its caches' rows only, not GraphContext.rec
    layer_backend = {la.index: index[home.get(la.index, HOST)] for la in layers}
    kv_home = {la.index: home.get(la.index, HOST) if setup.offload_kqv else HOST for la in layers}
    for la in layers:
        kdev = kv_home[la.index]
        if la.recurrent and state is not None:  # llama_memory_recurrent: one F32 row per sequence
            rs[la.index] = (ctx.cache(f"cache_r_l{la.index}", "F32", (state.n_embd_r, setup.n_rs), kdev),
                            ctx.cache(f"cache_s_l{la.index}", "F32", (state.n_embd_s, setup.n_rs), kdev))
            continue
        cells, ns = setup.n_kv_swa if la.swa else setup.n_kv, setup.n_stream
        v_row = geo.v_row(la, transposed=setup.v_trans)
        kv[la.index] = (ctx.cache(f"cache_k_l{la.index}", ctk, (la.n_head_kv * la.head_k, cells, ns), kdev),
                        ctx.cache(f"cache_v_l{la.index}", ctv, (v_row, cells, ns), kdev))
    lid_width = indexer_width(inv)  # the DSA lightning indexer's K cache
    lid = {il: ctx.cache(f"cache_k_l{il}", ctk, (lid_width, setup.n_kv, setup.n_stream), kv_home[il])
           for il in indexer_row_layers(inv, sorted(kv))}
    freqs = by_name.get("rope_freqs.weight")
    if freqs is not None:  # created in every layer under one name (TENSOR_DUPLICATED): each on its layer's device
        per_dev: dict[str, Tensor] = {}
        for la in layers:
            dev = home.get(la.index, HOST)
            if dev not in per_dev:
                per_dev[dev] = ctx.weight(freqs.name, freqs.type, freqs.ne[:1], dev, la.index)
            by_name[f"rope_freqs.weight#{la.index}"] = per_dev[dev]
    out_home = placement.defaults.get("output_norm.weight") or placement.defaults.get("output.weight")
    if out_home is None:  # an output layer without those names (LFM2's final norm is token_embd_norm)
        out_home = next((placement.defaults.get(n) for n in output_layer_tensors(inv, placement.engine)), None)
    # -ngl above the block count: the callback then pins each layer's norms to its device (`Setup.norm_pins`)
    full = setup.norm_pins and all(placement.defaults.get(t.name) != HOST for t in inv.tensors if t.layer is not None) \
        and out_home not in (None, HOST)
    f = facts(inv)
    hp = Hparams(n_embd=geo.n_embd, n_layer=n_layer, n_head=tuple(la.n_head for la in layers),
                 n_head_kv=tuple(la.n_head_kv for la in layers), head_k=layers[0].head_k, head_v=layers[0].head_v,
                 head_k_l=tuple(la.head_k for la in layers), head_v_l=tuple(la.head_v for la in layers),
                 n_expert=geo.n_expert, n_expert_used=geo.n_expert_used, n_embd_inp=input_width(inv, geo.n_embd),
                 embedding_scale=1.0 if "embedding_scale" in f.floats else 0.0)  # build_inp_embd scales (Granite)
    cp = replace(setup, rot_k=_rot(layers, False, setup.cache_k, True), rot_v=_rot(layers, False, setup.cache_v, False),
                 rot_k_swa=_rot(layers, True, setup.cache_k, True), rot_v_swa=_rot(layers, True, setup.cache_v, False),
                 full_offload=full)
    mla = Mla(head_k=geo.head_k_mla, head_v=geo.head_v_mla, rope=geo.n_rot, kv_lora_rank=geo.kv_lora_rank,
              absorbed=geo.mla)
    g = GraphContext(hp, cp, Weights(by_name), kv, layer_backend, len(backends) - 1, ctx=ctx, gf=CGraph(),
                     swa_layers={la.index: la.swa for la in layers}, mla=mla, rs=rs, rec=rec,
                     lid=lid, lid_rot=rotation_width(lid_width) if lid else 0)
    return g, backends, f


def _rot(layers: list[LayerAttention], swa: bool, cache_type: str, k: bool) -> int:
    """The Hadamard rotation side of the full-attention cache or the sliding-window one
    (docs/memory.md, "The graph's prologue")."""
    from moeconf.memory.cachetypes import rotation  # looked up per call (a test replaces it)

    own = [la for la in layers if not la.recurrent and la.swa == swa]
    widths = {la.head_k if k else la.head_v for la in own}
    full = next((la for la in layers if not la.recurrent and not la.swa), layers[0])
    if len(widths) != 1 or (full.head_k if k else full.head_v) % 64:
        return 0
    return rotation(cache_type, widths.pop(), k)


def facts(inv: Inventory) -> Facts:
    md = inv.metadata
    ints = {k for k, _ in md.hparams}
    floats = frozenset(k for k in md.arch_keys or ()
                       if k not in ints and k not in md.KEY_ATTRS and k not in md.unit_floats)
    groups, used = int_key(inv, "expert_group_count"), int_key(inv, "expert_group_used_count")
    return Facts(gating=int_key(inv, "expert_gating_func"), norm_w=int_key(inv, "expert_weights_norm"), floats=floats,
                 groups=(groups, used) if groups is not None and used is not None else (0, 0),
                 units=frozenset(md.unit_floats), values=md.float_values, hparams=md.hparams,
                 zeros=frozenset(md.zero_floats))


def compute(placement: Placement, setup: Setup) -> dict[str, int]:
    """Each device's compute buffer (bytes) for this placement and these settings."""
    return _compute(placement, setup)[0]


def _compute(placement: Placement, setup: Setup) -> tuple[dict[str, int], frozenset[str], frozenset[int]]:
    """`compute`, the fused ops the engine's probes turned off for it (`fused_off`), and the layers whose
    norms ran without a weight (`GraphContext.unweighted`)."""
    # a search's graph reused (`_reused`), its fused ops probed for this placement; -fa auto's built afresh
    g, backends = build(placement, setup) if setup.fa_auto else _unfused(placement, setup, *_reused(placement, setup))
    sched = Scheduler(backends, pipeline=setup.pipeline, op_offload=setup.op_offload)
    try:  # the build's pins kept or dropped as the reserve modelled does (`Setup.norm_pins`)
        sizes = sched.reserve(g.gf, g.pinned if setup.norm_pins else None)
    finally:
        sched.restore()
    return {b.name: s for b, s in zip(backends, sizes, strict=True)}, g.cp.unfused, frozenset(g.unweighted)


def setup_for(inv: Inventory, settings: MemorySettings, *, pipeline: bool = False) -> Setup:
    """The graph's settings as llama.cpp derives them for its worst-case reserve
    (docs/memory.md, "The graph's prologue")."""
    geo = geometry(inv)
    _, cells, swa_cells, n_stream, T = context_cells(inv, geo, settings)
    n_seq = settings.n_parallel
    t_graph = -(-T // n_seq) * n_seq  # graph_reserve: a multiple of the sequences (llama-context.cpp)
    # the recurrent layers read the state rows of every sequence kept (llama_memory_recurrent's size)
    n_rs = n_seq if any(la.recurrent for la in geo.layers) else 1
    return Setup(n_tokens=t_graph, n_outputs=settings.output_rows(T), n_kv=cells, n_kv_swa=swa_cells,
                 n_stream=n_stream, n_seq=n_seq, n_rs=n_rs,
                 flash_attn=settings.flash_attn != "off" and traits(inv.arch).flash_attn,  # Grok's
                 fa_auto=settings.flash_attn == "auto", offload_kqv=settings.offload_kqv,
                 cache_k=settings.cache_type_k, cache_v=settings.cache_type_v, pipeline=pipeline,
                 op_offload=settings.op_offload)


def graph_computed(placement: Placement) -> bool:
    """Whether `estimate` takes every compute buffer from the engine's graph: llama.cpp's."""
    comp = COMPOSITIONS.get(placement.inventory.arch)
    return comp is not None and comp.memory is not None and placement.engine.name == "llama.cpp"


def graph_compute(placement: Placement, settings: MemorySettings, pipeline: bool) -> dict[str, int]:
    """Every device's compute buffer through the engine's graph; empty where it is not built (`checked_compute`)."""
    return checked_compute(placement, settings, pipeline)[0]


# the fused ops whose unfused form (built where the engine's probe turns the op off: `fused_off`) a recorded
# dump checked, by architecture: GLM-5.3-Flash's hyper-connection post (its -ngl 2 dumps)
UNFUSED_CHECKED: dict[str, frozenset[str]] = {"glm5-next": frozenset({"DSV4_HC_POST"})}


def checked_compute(placement: Placement, settings: MemorySettings, pipeline: bool) -> tuple[dict[str, int], list[str]]:
    """`graph_compute`, and the refusal of a placement on which the engine's probes turn off a fused op whose
    unfused form no recorded dump checked (empty where none is)."""
    try:
        sizes, off, unweighted = _compute(placement, setup_for(placement.inventory, settings, pipeline=pipeline))
    except MissingTensor as e:
        return {}, missing_refusal(placement.inventory, e, "compute")
    return sizes, graph_refusals(placement.inventory, unweighted, off, "compute")


def graph_refusals(inv: Inventory, unweighted: Collection[int], unfused: frozenset[str], what: str) -> list[str]:
    """Why `what` (compute, traffic) is not modelled on a built graph: a norm without its weight in the layers
    `unweighted`, or the fused ops `unfused` the engine turns off here, whose graph no dump checked."""
    return unweighted_refusal(inv, unweighted, what) + unfused_refusal(inv, unfused, what)


def unweighted_refusal(inv: Inventory, layers: Collection[int], what: str) -> list[str]:
    """Why `what` (compute, traffic) is not modelled where the graph built a norm without its weight (the layers
    `layers`, -1 outside the blocks; docs/memory.md, "A norm the file lacks"); empty where every norm had its weight."""
    if not layers:
        return []
    where = ", ".join("the output" if il < 0 else f"block {il}" for il in sorted(layers)[:4]) + (
        f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    return [f"{what} not modelled for this {inv.arch} file: it lacks a norm weight the graph reads ({where}): "
            "llama.cpp's loader refuses the file where it requires the tensor, and where the tensor is optional "
            "the norm without a weight is a graph no recorded dump checked; measure it with llama.cpp's "
            "llama-fit-params -fitp on"]


def unfused_refusal(inv: Inventory, off: frozenset[str], what: str) -> list[str]:
    """Why `what` (compute, traffic) is not modelled where the engine's probes turned off the fused ops `off`
    and no recorded dump checked their unfused form (empty: every one was checked)."""
    unchecked = sorted(off - UNFUSED_CHECKED.get(inv.arch, frozenset()))
    if not unchecked:
        return []
    return [f"{what} not modelled for this {inv.arch} placement: llama.cpp turns off its fused "
                   f"{', '.join(unchecked)} here (its probe finds a layer's op scheduled off the layer's device: "
                   "layers, or a weight the op reads, on the host and a GPU), and no recorded dump checked the "
                   "unfused graph; keep every layer and its hc_ weights on the GPUs (-ngl 999, -ot for the "
                   "experts only) or measure it with llama.cpp's llama-fit-params -fitp on"]


@per_inventory
def file_refusals(inv: Inventory, llama_loader: bool = True) -> tuple[str, ...]:
    """Why the composition does not build this file's graph, whatever the settings (the file's tensors alone:
    asked once per inventory, not on each of a search's estimates). `llama_loader`: llama.cpp loads the file
    (False: the graph sizes ik_llama.cpp's compute, whose loader reads the file by its own rules)."""
    comp = COMPOSITIONS[inv.arch]
    assert comp.memory is not None
    # without a tensor llama.cpp's loader requires there is no graph to size, whichever engine; a tensor it never
    # creates, or another file its loader refuses, stops llama.cpp alone
    why = list(load_refusals(inv, uncreated=llama_loader))
    if llama_loader and comp.memory.loader_refuses is not None:
        why += comp.memory.loader_refuses(inv)
    why += [*unchecked_fused_qkv_bias(inv), *unchecked_scales(inv), *unchecked_ffn_biases(inv)]
    return tuple(why + (comp.memory.unmodelled(inv) if comp.memory.unmodelled is not None else []))


def unmodelled_settings(inv: Inventory, settings: MemorySettings, llama_loader: bool = True) -> list[str]:
    """Why the architecture's composition does not build the graph of this file and these settings (empty:
    it does; `llama_loader`: as `file_refusals`)."""
    comp = COMPOSITIONS.get(inv.arch)
    if comp is None or comp.memory is None:
        return []
    why = list(file_refusals(inv, llama_loader))
    if any(k.startswith(f"{inv.arch}.expert_group") for k, _ in settings.kv_overrides):  # read instead of the file's
        why = [w for w in why if w not in group_stops(inv)]  # (memory under --override-kv: families.py)
    if why or comp.memory.refuses is None:
        return why
    s = setup_for(inv, settings)
    refused = comp.memory.refuses(s.n_tokens, s.n_stream)
    return [refused] if refused else []
