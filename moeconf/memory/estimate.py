"""Memory per device for a placement: weights (exact, aligned and padded as the buffer type
allocates them), KV cache (on each layer's home device, memory/kvcache.py), compute buffers, and a
reserve per GPU for what no engine reports.

Compute on llama.cpp is the engine's own graph, scheduled and allocated as ggml does (memory/graph).
On ik_llama.cpp it is llama.cpp's graph of the same placement plus what ik was measured to add
(`_ik_compute`). The figures were checked against llama.cpp's own projection (`llama-fit-params -fitp
on`, see docs/memory.md's accuracy table); CUDA-only terms cannot be checked there and are labelled estimated."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import moeconf.memory.compressed as compressed
import moeconf.memory.families as setting_families
import moeconf.memory.ikarchs as ikarchs
import moeconf.memory.ikmla as ikmla
import moeconf.memory.recurrent as rec
from moeconf.engines import AUTO_GPU, HOST, Engine, mainline
from moeconf.engines.llamaconfig import CACHE_TYPES
from moeconf.engines.settings import MemorySettings, slot_notes
from moeconf.memory.amx import amx_bytes
from moeconf.memory.archgraph import input_width, standard_moe_layers
from moeconf.memory.cachetypes import cache_block, is_quantized
from moeconf.memory.geometry import Geometry, GeometryUnknown, geometry
from moeconf.memory.graph.archs import traits
from moeconf.memory.graph.model import checked_compute, graph_computed, layer_devices
from moeconf.memory.graph.model import unmodelled_settings as graph_unmodelled
from moeconf.memory.graph.sched import backend_for, row_padding
from moeconf.memory.ikmla import computed_weights, effective_mla
from moeconf.memory.kvcache import context_cells, kv_bytes
from moeconf.memory.servercache import ServerCaches, server_caches
from moeconf.memory.support import unmodelled
from moeconf.model import ggml
from moeconf.model.inventory import Inventory, Tensor
from moeconf.model.percache import per_inventory
from moeconf.placement import Placement
from moeconf.units import MIB as MiB


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes on one buffer type. `estimated` names the terms that are modelled, not measured."""

    device: str
    weights: int = 0
    kv: int = 0
    compute: int = 0
    reserve: int = 0
    estimated: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.reserve

    def json(self) -> dict[str, int]:
        return {"weights": self.weights, "kv": self.kv, "compute": self.compute, "reserve": self.reserve,
                "total": self.total}


@dataclass(frozen=True)
class MemoryEstimate:
    devices: dict[str, DeviceMemory]  # buffer type -> memory; host memory under "CPU"
    settings: MemorySettings
    n_ctx: int  # the context the engine allocates (padded)
    kv_cells: int  # cells per stream, full-attention layers
    swa_cells: int  # cells per stream, sliding-window layers (0: none)
    flash_attn: bool
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # settings the engine refuses for this model
    complete: bool = True  # False: KV and compute could not be computed (see notes)
    kv_known: bool = False  # with complete False: the KV cache was computed, compute was not (memory/ikarchs.py)
    # llama-server's prompt cache and context checkpoints: host memory beyond the table, as caps
    # (memory/servercache.py); None for other binaries
    server: ServerCaches | None = None

    def json(self) -> dict[str, dict[str, int]]:
        return {d: m.json() for d, m in self.devices.items()}


def alloc_size(t: Tensor, device: str) -> int:
    """A tensor's size in `device`'s model buffer: rounded up to the buffer's alignment, with
    CUDA's padding of quantized rows whose width is not a multiple of 512 (the scheduler's backend
    of the device, graph/sched.py `backend_for`). RPC servers are taken as CPU backends (no padding)."""
    b = backend_for(device)
    return ggml.pad(t.nbytes + (row_padding(t.type, t.shape[0]) if b.pads_rows else 0), b.alignment)


def weight_bytes(placement: Placement) -> dict[str, int]:
    """Exactly what each buffer type's model buffer holds."""
    out: dict[str, int] = defaultdict(int)
    for t in placement.inventory.tensors:
        if (dev := placement.devices[t.name]) is not None:
            out[dev] += alloc_size(t, dev)
    if (tied := placement.tied_output()) is not None:  # a tied output's second copy of token_embd (engines/tied.py)
        out[tied] += alloc_size(placement.inventory.by_name["token_embd.weight"], tied)
    return dict(out)


def _skipped_block_home(placement: Placement, layer_dev: dict[int, str], il: int) -> str | None:
    """The home of a block whose tensors the engine skips (an MTP block without -mtp): its neighbours' where they
    agree, else None (docs/memory.md, "What the estimate follows of the engines")."""
    before = layer_dev.get(il - 1, HOST)
    n_block = placement.inventory.metadata.block_count
    after = layer_dev.get(il + 1) if il + 1 < n_block else placement.defaults.get("output_norm.weight")
    return before if after == before else None


def refused_settings(inv: Inventory, eng: Engine, settings: MemorySettings,
                     geo: Geometry | None = None) -> list[str]:
    """What the engine refuses to start with, of these settings on this model: the settings' own
    problems, different K and V cache types on an MLA model (llama.cpp), a quantized V cache with
    flash attention off. Cheap: no memory is computed."""
    problems = list(settings.problems)
    if geo is None:
        try:
            geo = geometry(inv)
        except GeometryUnknown:
            return problems
    ik = eng.name == "ik_llama.cpp"
    if not ik and geo.mla and settings.cache_type_k != settings.cache_type_v:
        problems.append(f"{eng.label} refuses different K and V cache types on an MLA model "
                        f"(-ctk {settings.cache_type_k} -ctv {settings.cache_type_v}): give both")
    if is_quantized(settings.cache_type_v) and settings.flash_attn == "off" and not (ik and geo.mla_arch):
        problems.append(f"{eng.label} refuses a quantized V cache ({settings.cache_type_v}) with flash attention off")
    elif is_quantized(settings.cache_type_v) and not traits(inv.arch).flash_attn:
        problems.append(f"{eng.label} forces flash attention off for {inv.arch} and then refuses a quantized V cache "
                        f"({settings.cache_type_v}): give -ctv f16 (a quantized -ctk alone is accepted)")
    # a cache block not dividing a head width (docs/memory.md, "What the estimate follows of the engines")
    if not ik and settings.flash_attn != "off":
        for which, ctype, width in (("K", settings.cache_type_k, "head_k"), ("V", settings.cache_type_v, "head_v")):
            block = cache_block(ctype)[0] if ctype in CACHE_TYPES else 1
            bad = sorted({getattr(la, width) for la in geo.layers if getattr(la, width) % block})
            if is_quantized(ctype) and bad:
                problems.append(f"{eng.label} refuses a {ctype} {which} cache on this model: its block of {block} "
                                f"does not divide the head width {bad[0]} (-ct{which.lower()})")
    return problems


def families_refused(placement: Placement, settings: MemorySettings, gpus: list[str] | None = None) -> list[str]:
    """What `estimate`'s families step refuses (memory/families.py): on ik_llama.cpp the families of every engine
    and device (speculation, extra files, --override-kv; llama.cpp's graph of the placement checks the rest).
    `gpus`: the GPUs holding weights or layers (computed when not given). A search that measured a placement
    with `families=False` and finds this empty has what `families=True` gives (on ik, but for its twin's)."""
    ik = placement.engine.name == "ik_llama.cpp"
    if gpus is None and not ik:
        gpus = sorted(d for d in {*weight_bytes(placement), *layer_devices(placement).values()} if d != HOST)
    return setting_families.unmodelled_settings(placement, settings, [] if ik or gpus is None else gpus,
                                                not ik and output_family_checked(placement, settings))


def _refused(placement: Placement, settings: MemorySettings, weights: dict[str, int], gpus: list[str],
             notes: list[str]) -> MemoryEstimate:
    """The weights as placed, KV cache and compute left out: a number moeconf did not model is never
    printed as one (the table shows "?" and `notes` say why; fit and fill rules refuse)."""
    inv = placement.inventory
    problems = refused_settings(inv, placement.engine, settings)  # the engine's refusals hold unmodelled too
    n_ctx = settings.n_ctx or (inv.metadata.context_length or 0)
    return MemoryEstimate(_rows(gpus, settings, weights, {}, {}, {}), settings, n_ctx, 0, 0,
                          settings.flash_attn != "off", tuple(notes), tuple(problems), complete=False)


def _rows(devices: Iterable[str], settings: MemorySettings, weights: Mapping[str, int], kv: Mapping[str, int],
          compute: Mapping[str, int], estimated: Mapping[str, Sequence[str]]) -> dict[str, DeviceMemory]:
    """The table's rows, the host's first, then the other devices sorted: each one's weights, KV cache and
    compute as given (0 where absent), a GPU's reserve, the terms that are estimated."""
    return {d: DeviceMemory(d, weights=weights.get(d, 0), kv=kv.get(d, 0), compute=compute.get(d, 0),
                            reserve=settings.reserve if d != HOST else 0, estimated=tuple(estimated.get(d, ())))
            for d in [HOST, *sorted(set(devices) - {HOST})]}


def estimate(placement: Placement, settings: MemorySettings, *, pipeline: bool = False,
             families: bool = True, loader: str | None = None) -> MemoryEstimate:
    """`pipeline`: llama.cpp's pipeline parallelism is on (see `pipeline_parallel`): the scheduler
    keeps 4 copies of every graph input and of every split's inputs, never freed. `families=False` skips the
    refusal of setting families moeconf does not model (memory/families.py): for a search that
    checks them on the placement it chooses. `loader`: the engine whose loader reads the file, where it is not
    the placement's (ik_llama.cpp's compute sized on llama.cpp's graph: llama.cpp's load refusals not asked)."""
    inv = placement.inventory
    eng = placement.engine
    weights = Counter(weight_bytes(placement))
    layer_dev = layer_devices(placement)
    devices = {HOST, *weights, *layer_dev.values()}
    gpus = sorted(d for d in devices if d != HOST)
    why = (unmodelled(inv, eng.name, [k for k, _ in settings.kv_overrides])
           + rec.unmodelled_settings(inv, settings.offload_kqv)
           + compressed.unmodelled_settings(inv, settings.n_parallel))
    # ik_llama.cpp: compute from llama.cpp's graph of the same placement (`_ik_compute`), which checks
    # llama.cpp's settings and families itself
    ik = eng.name == "ik_llama.cpp"
    if why and ik:
        why.append(ikarchs.next_step(inv, not unmodelled(inv, "llama.cpp")))
    try:
        geo = geometry(inv)
    except GeometryUnknown as err:
        why.insert(0, f"KV cache and compute not computed: {err}")
    if not why and not ik:  # a branch of the engine's graph the composition does not build (memory/graph/archs)
        why.extend(graph_unmodelled(inv, settings, (loader or eng.name) == "llama.cpp"))
    if not why and families:  # setting families whose compute is not modelled (`families_refused`)
        why.extend(families_refused(placement, settings, gpus))
    # the nextn blocks whose KV cache the engine keeps though it skips their tensors (Traits.nextn_kv)
    nextn_dev: dict[int, str] = {}
    for la in () if why else geo.nextn_kv:
        home = _skipped_block_home(placement, layer_dev, la.index)
        if home is None:
            why.append(f"KV cache not computed: block {la.index} (the MTP block, not loaded) keeps a KV cache on "
                       "its layer's device, which falls between two devices here: move the -ngl/-ts split by a layer")
        else:
            nextn_dev[la.index] = home
    if why:
        return _refused(placement, settings, weights, gpus, why)

    notes: list[str] = []
    # host weights in llama.cpp's AMX buffer (memory/amx.py), where it comes first (`amx_possible`)
    amx = not ik and amx_possible(settings, gpus)
    amx_extra = sum(x for name, x in _amx_tensors(inv) if placement.devices.get(name) == HOST) if amx else 0
    if amx_extra and settings.host_cpu == "amx":
        weights[HOST] += amx_extra
        notes.append(f"host CPU with AMX: llama.cpp packs the CPU layers' matrices in its AMX buffer "
                     f"(+{amx_extra / MiB:.0f} MiB of host weights)")
    elif amx_extra >= MiB:
        notes.append(f"on a host CPU with AMX, llama.cpp packs the CPU layers' matrices in its AMX buffer: "
                     f"up to {amx_extra / MiB:.0f} MiB more host weights (--host-cpu amx counts them)")
    # --- tensors ik_llama.cpp computes at load for MLA (memory/ikmla.py), added to the weights (a Counter)
    ik_computed = computed_weights(placement, geo, effective_mla(inv, geo, settings)) if ik else {}
    weights.update(ik_computed)
    # flash attention: auto resolves to on for CPU, RPC and CUDA devices
    fa = settings.flash_attn != "off" and traits(inv.arch).flash_attn  # grok
    problems = refused_settings(inv, eng, settings, geo)
    n_ctx, cells, swa_cells, n_stream, T = context_cells(inv, geo, settings, ik=ik, fa=fa)
    if swa_cells and not (ik or settings.swa_full):  # sequences as the binary defaults them (settings.server_slots)
        notes.extend(slot_notes(settings, eng))

    # --- KV cache (memory/kvcache.py) -------------------------------------------------------------
    kv = kv_bytes(inv, geo, settings, {**nextn_dev, **layer_dev}, cells=cells, swa_cells=swa_cells, n_stream=n_stream,
                  flash_attn=fa, ik=ik)

    if ik:  # --- compute: llama.cpp's graph of the same placement plus ik's measured margin (memory/ikarchs.py)
        compute, terms = _ik_compute(placement, settings, ik_computed, devices, n_ctx, cells, swa_cells, fa, notes,
                                     geo, families)
        if compute is None:  # weights and KV cache only, `notes` say why
            return MemoryEstimate(_rows(devices, settings, weights, kv, {}, terms), settings, n_ctx, cells, swa_cells,
                                  fa, tuple(notes), tuple(problems), complete=False, kv_known=True)
    else:
        # --- compute: the engine's graph, scheduled and allocated (memory/graph: every architecture modelled on
        # llama.cpp has a composition, tests/test_memory_support.py), CUDA's op-offload copies included
        sizes, why = checked_compute(placement, settings, pipeline)
        if why:  # a weight the file lacks, a norm without its weight, a fused op turned off unchecked unfused
            return _refused(placement, settings, weights, gpus, notes + why)
        compute = defaultdict(int, sizes)
        if not fa and not settings.offload_kqv:
            notes.append("-nkvo with flash attention off: the figures are llama.cpp's sizing reserve's "
                         "(llama-fit-params, --fit), which runs the attention on the layer's device; a running "
                         "llama.cpp keeps the attention between the KV store and its output on the CPU "
                         "(build_attn_mha pins it), so its host compute can be larger and the GPUs' smaller")
        terms = defaultdict(list)
        for d in gpus:
            if not d.startswith("CUDA") or d == AUTO_GPU:
                continue
            # CUDA only, modelled but not measured on a CUDA device: op offload's copies of host weights (the graph
            # has them: ggml_backend_sched's op offload); FA with a quantized cache converts K and V to f16
            offloads = settings.op_offload and 0 < backend_for(d).offload_batch <= T  # (CUDA's batch of 32)
            if offloads and any(v == HOST for v in placement.devices.values()):
                terms[d].append("compute: op-offload copies of host weights (CUDA's op offload)")
            if fa and (is_quantized(settings.cache_type_k) or is_quantized(settings.cache_type_v)):
                per_layer = max((la.n_head_kv * (la.head_k + la.head_v) for la in geo.layers), default=0)
                compute[d] += cells * per_layer * 2
                terms[d].append("compute: f16 copy of K and V for flash attention")
    mem = _rows(devices, settings, weights, kv, compute, terms)
    if AUTO_GPU in mem:
        notes.append(f"{AUTO_GPU}: the engine splits these layers over the GPUs by free memory; give -ts to see each "
                     "GPU's share")
    return MemoryEstimate(mem, settings, n_ctx, cells, swa_cells, fa, tuple(notes), tuple(problems),
                          server=server_caches(inv, geo, settings, eng))


def _ik_compute(placement: Placement, settings: MemorySettings, ik_computed: Mapping[str, int], devices: set[str],
                n_ctx: int, cells: int, swa_cells: int, fa: bool, notes: list[str], geo: Geometry,
                families: bool) -> tuple[dict[str, int] | None, dict[str, list[str]]]:
    """ik_llama.cpp's compute per device and the estimated terms (its weights and KV cache are `estimate`'s):
    llama.cpp's graph of the same placement plus the margin measured on ik (memory/ikarchs.py); for the MLA
    architectures (ikarchs.MLA_MODELLED) each device running attention takes the larger of that graph and ik's
    MLA attention peak (memory/ikmla.py), plus its measured margin. None where neither is modelled for the
    model or settings: `notes` then say why, with the next step."""
    inv = placement.inventory
    terms = {d: ["weights: the MLA tensors ik_llama.cpp computes at load (wkv_b or wk_b/wv_b)"] for d in ik_computed}
    n_tokens = min(settings.n_batch, settings.n_ubatch, n_ctx)
    mla_model = inv.arch in ikarchs.MLA_MODELLED
    label = ikarchs.mla_compute_label(n_tokens) if mla_model else ikarchs.compute_label(inv.arch, n_tokens)
    why = (_ik_graph_refused(settings, geo, placement, n_tokens, fa) if label is not None
           else [ikarchs.compute_not_measured(inv.arch)])
    if not why and not fa and not mla_model and inv.arch not in ikarchs.FA_OFF_MEASURED:
        why = [f"compute on ik_llama.cpp with flash attention off is not modelled for {inv.arch!r} (ik keeps a second "
               "copy of the KQ matrix, measured on grok only): drop -fa off (ik's default is on) to size it"]
    twin = None
    if not why:
        # an MLA architecture's attention is ik's own (memory/ikmla.py): llama.cpp's graph, with flash attention
        # on whatever ik runs (its KQ is not ik's), stands for the rest of the graph
        twin_settings = ik_twin_settings(settings)
        if mla_model:
            twin_settings = replace(twin_settings, flash_attn="on")
        twin = estimate(replace(placement, engine=mainline()), twin_settings, families=families,
                        loader=placement.engine.name)
        if not twin.complete:
            why = [f"llama.cpp's graph, which sizes ik_llama.cpp's compute: {n}" for n in twin.notes]
    if twin is None or label is None or why:
        notes.extend(why)
        notes.append(ikarchs.compute_next_step(inv.arch) or ikarchs.next_step(inv, True))
        return None, terms
    # the devices running attention layers: ik's second f32 KQ matrix with flash attention off (memory/
    # ikarchs.py), or the MLA attention's peak (memory/ikmla.py)
    layer_dev = layer_devices(placement)
    attn_dev = {la.index: _attention_device(placement, la.index, layer_dev) for la in geo.layers if not la.recurrent}
    kq: dict[str, int] = defaultdict(int)
    margin = {d: ikarchs.margin_mib(inv.arch, n_tokens) * MiB for d in devices} if not mla_model else {}
    if mla_model:
        peak = ikmla.attention_peak(geo, cells, n_tokens, effective_mla(inv, geo, settings), fa,
                                    ikmla.default_amb(settings, placement.engine)) or 0
        for d in set(attn_dev.values()):
            kq[d] = max(0, peak - twin.devices[d].compute) if d in twin.devices else peak
            margin[d] = ikmla.margin_mib(n_tokens) * MiB
    elif not fa:
        for la in geo.layers:
            if not la.recurrent:
                d = attn_dev[la.index]
                kq[d] = max(kq[d], 4 * la.n_head * (swa_cells if la.swa else cells) * n_tokens)
    compute: dict[str, int] = {}
    for d in devices:
        t = twin.devices.get(d)
        base = t.compute if t is not None else 0
        compute[d] = base + kq[d] + margin.get(d, 0) if base or kq[d] else 0
        if compute[d]:
            own = terms.setdefault(d, [])
            own.append(label if not mla_model or d in attn_dev.values() else ikarchs.MLA_HOST_LABEL)
            # llama.cpp's CUDA-only terms (see `estimate`): estimated there too
            own.extend(x for x in (t.estimated if t is not None else ()) if x.startswith("compute:"))
    return compute, terms


_ATTN_BASES = ("attn_q", "attn_qkv", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_output")


def _attention_device(placement: Placement, il: int, layer_dev: Mapping[int, str]) -> str:
    """The device running block il's attention: the one holding its first attention weight, else the
    layer's."""
    found = (placement.devices.get(f"blk.{il}.{b}.weight") for b in _ATTN_BASES)
    return next((d for d in found if d is not None), layer_dev.get(il, HOST))


def _ik_graph_refused(settings: MemorySettings, geo: Geometry, placement: Placement, n_tokens: int,
                      fa: bool) -> list[str]:
    """Where neither llama.cpp's graph nor ik's MLA attention model (memory/ikmla.py) stands for ik's
    compute: each message names the setting and why."""
    out = []
    for flag, t in (("-ctk", settings.cache_type_k), ("-ctv", settings.cache_type_v)):
        if t not in CACHE_TYPES:
            out.append(f"compute on ik_llama.cpp is sized from llama.cpp's graph, which has no {t} cache ({flag} "
                       f"{t}): give a cache type both engines have (f16, q8_0, q4_0, ...) to size it")
    inv = placement.inventory
    if inv.arch in ikarchs.MLA_MODELLED:
        mla = effective_mla(inv, geo, settings)
        if ikmla.attention_form(mla, fa, n_tokens) is None:
            out.append(f"compute on ik_llama.cpp with -mla {mla} (standard attention over the decompressed heads) is "
                       "not modelled: drop -mla (ik's default -mla 3 is modelled; -mla 1 and 2 are too) to size it")
        if not settings.offload_kqv:
            out.append("compute on ik_llama.cpp with the KV cache on the host (-nkvo) is not modelled for MLA "
                       "attention (measured with the cache on the devices running the layers): drop -nkvo to size it")
    elif geo.mla_arch and settings.mla not in (None, 3):
        out.append(f"compute on ik_llama.cpp with -mla {settings.mla} is not modelled (its margin over llama.cpp's "
                   "graph was measured at the default -mla 3): drop -mla to size it")
    return out


def ik_twin_settings(settings: MemorySettings) -> MemorySettings:
    """The settings llama.cpp's graph is sized with for ik_llama.cpp
    (docs/memory.md, "What the estimate follows of the engines")."""
    return replace(settings, kv_unified=True, swa_full=True, n_outputs=0, mla=None, problems=(), host_cpu="plain",
                   repack=False)


_HOST_BUFFER_GPUS = ("CUDA", "ROCm", "MUSA", "SYCL", "Vulkan", "CANN")  # the GPUs with a pinned host buffer type


def amx_possible(settings: MemorySettings, gpus: list[str]) -> bool:
    """Whether llama.cpp can put host weights in the AMX buffer: no GPU whose pinned host buffer type comes first,
    or --no-host; and -nr not given (docs/memory.md, "What the estimate follows of the engines")."""
    return settings.repack and (settings.no_host or not any(g.startswith(_HOST_BUFFER_GPUS) for g in gpus))


@per_inventory
def _amx_tensors(inv: Inventory) -> tuple[tuple[str, int], ...]:
    """The tensors the AMX buffer would take, each with what it adds over the CPU buffer."""
    return tuple((t.name, b - alloc_size(t, HOST)) for t in inv.tensors if (b := amx_bytes(t)) is not None)


def output_family_checked(placement: Placement, settings: MemorySettings) -> bool:
    """Whether the engine's graph gives every compute buffer with routed experts and the output on the CPU over
    several GPUs on a model where that was checked against the engine (memory/families.py): llama.cpp's graph
    of standard attention + MoE layers (archgraph.standard_moe_layers, the input as wide as the hidden state),
    flash attention, the KV cache offloaded, one KV stream, the whole ubatch's outputs."""
    inv = placement.inventory
    if (not graph_computed(placement) or settings.flash_attn == "off" or not traits(inv.arch).flash_attn
            or not settings.offload_kqv or settings.n_outputs or not (settings.kv_unified or settings.n_parallel == 1)):
        return False
    try:
        geo = geometry(inv)
    except GeometryUnknown:
        return False
    return standard_moe_layers(inv, geo) and input_width(inv, geo.n_embd) == geo.n_embd


def pipeline_parallel(placement: Placement, n_devices: int, n_gpu_layers: int, split_mode: str | None,
                      settings: MemorySettings, has_overrides: bool) -> bool:
    """Whether llama.cpp runs a pipeline (docs/memory.md, "What the estimate follows of the engines")."""
    nb = placement.inventory.block_count
    return (placement.engine.name == "llama.cpp" and n_devices > 1 and (n_gpu_layers < 0 or n_gpu_layers > nb)
            and (split_mode or "layer") == "layer" and settings.offload_kqv and not has_overrides)
