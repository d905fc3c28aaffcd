"""The phase model: each device's compute buffer as the largest set of activations alive at once in
any phase of its layers (attention, the routed experts and their copies across devices, the shared
expert, a dense FFN, the logits), plus the graph inputs alive throughout. It is within tens of MiB of
the engine's graph (memory/graph), which `estimate` gives every figure a user sees; a search ranks its
candidates on this model (`estimate(..., replay=False)`: about a hundredth of the graph's cost) and
the placement it chooses is then measured through the graph. What only this model reads lives here
(the routed experts', delta-net and KDA layers' live sets, the -ngl 1 output GPU's copy)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from functools import cache

import moeconf.memory.recurrent as rec
from moeconf.engines import HOST
from moeconf.memory.classic import input_width, output_device
from moeconf.memory.geometry import Geometry
from moeconf.memory.graph.archs import traits
from moeconf.memory.graph.sched import PIPELINE_COPIES
from moeconf.memory.recurrent import KdaShape
from moeconf.memory.rshape import RecurrentShape
from moeconf.memory.settings import MemorySettings, cache_row_bytes
from moeconf.model.inventory import Inventory
from moeconf.placement import Placement

ATTN_BASES = ("attn_q", "attn_qkv", "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_output")
EXPERT_BASES = ("ffn_down_exps", "ffn_up_exps", "ffn_gate_up_exps")
ROUTER_BASES = ("ffn_gate_inp",)
DENSE_BASES = ("ffn_down", "ffn_up")


def where(placement: Placement, il: int, bases: tuple[str, ...]) -> str | None:
    """The device holding the first of `bases` in block il (where its op runs)."""
    devices = placement.devices
    for name in _block_names(il, bases):
        d = devices.get(name)
        if d is not None:
            return d
    return None


@cache
def _block_names(il: int, bases: tuple[str, ...]) -> tuple[str, ...]:
    """`bases`' weight names in block il (a fit asks `where` ~40k times)."""
    return tuple(f"blk.{il}.{b}.weight" for b in bases)


def _width(placement: Placement, il: int, base: str) -> int:
    t = placement.inventory.by_name.get(f"blk.{il}.{base}.weight")
    return t.shape[1] if t is not None and len(t.shape) > 1 else 0


def phase_compute(placement: Placement, geo: Geometry, settings: MemorySettings, layer_dev: Mapping[int, str],
                  devices: set[str], out_dev: str, *, T: int, cells: int, swa_cells: int, fa: bool,
                  pipeline: bool, output_rows: int) -> dict[str, int]:
    """Each device's compute buffer by the phase model, for `T` tokens a ubatch and `output_rows`
    rows of logits."""
    inv = placement.inventory
    ctk, ctv = settings.cache_type_k, settings.cache_type_v
    n_seq = settings.n_parallel
    rshape = rec.shape(inv)  # recurrent layers' state (memory/recurrent.py)
    kshape = kda_shape(inv)  # Kimi-Linear's KDA layers
    f4 = 4 * T
    mask_el = 2 if fa else 4
    n_kv_full = cells if any(not la.swa for la in geo.layers) else 0
    n_kv_swa = swa_cells if any(la.swa for la in geo.layers) else 0
    masks = T * mask_el * (n_kv_full + n_kv_swa)
    if not fa and not geo.mla:
        # with flash attention off V is stored transposed and its graph input indexes every
        # element: 8 bytes per token and V row element (llama-kv-cache.cpp, build_input_v_idxs),
        # alive beside the masks on every device running attention (measured on Grok-1: 4 MiB at -ub 512)
        masks += 8 * T * max((la.n_head_kv * la.head_v for la in geo.layers), default=0) * (2 if n_kv_swa else 1)
    e = geo.n_embd
    e_inp = input_width(inv, e)
    moe_tensors = traits(inv.arch).expert_ffn_tensors  # gate, up, their product (gpt-oss: fused, two)
    phases: dict[str, list[int]] = defaultdict(list)
    attn_devs: set[str] = set()
    last = geo.layers[-1].index if geo.layers else -1
    # a layer run entirely on the CPU hands its routed experts' output to the next layer's GPU: the
    # weighting, the experts' sum and the residual add carry no weights, and the scheduler's
    # "expand GPU up" pass (ggml-backend.cpp, ggml_backend_sched_split_graph) gives them the backend
    # of the next node that has one. That GPU's first split then starts with the copies of the
    # experts' output and the residual, then the graph inputs (positions, KV indices, masks), which
    # stay allocated until its last attention layer, above those copies
    first_on: dict[str, int] = {}
    for la in geo.layers:
        d = where(placement, la.index, ATTN_BASES) or layer_dev.get(la.index, HOST)
        first_on.setdefault(d, la.index)
    tail_base: dict[str, int] = {}
    for d, il0 in first_on.items():
        prev = il0 - 1
        if (d != HOST and prev >= 0 and geo.n_ff_exp
                and (where(placement, prev, ATTN_BASES) or layer_dev.get(prev, HOST)) == HOST
                and where(placement, prev, EXPERT_BASES) == HOST
                and (where(placement, prev, ROUTER_BASES) or HOST) == HOST):
            tail_base[d] = f4 * (geo.n_expert_used * e + e)
    # where the residual stream sits (bytes from the buffer's start) on a device after a layer whose
    # routed experts' output came back from another device; None: low in the buffer (not modelled)
    residual_at: dict[str, int | None] = {}
    for la in geo.layers:
        il = la.index
        a_dev = where(placement, il, ATTN_BASES) or layer_dev.get(il, HOST)
        if not la.recurrent:
            attn_devs.add(a_dev)
        n_kv = swa_cells if la.swa else cells
        after_copy = residual_at.get(a_dev)
        residual_at[a_dev] = None
        if geo.mla:
            # absorbed MLA: queries in the latent space (kv_lora + rope per head), the latent
            # output, the per-head queries and values
            r = geo.kv_lora_rank
            act = la.n_head * ((r + geo.n_rot) + r + geo.head_k_mla + geo.head_v_mla) + 2 * e
        else:
            act = la.n_head * la.head_k + la.n_head_kv * (la.head_k + la.head_v) + 2 * la.n_head * la.head_v
        attn = f4 * act
        if not fa:
            attn += n_kv * T * la.n_head * 4
            if not settings.offload_kqv and a_dev != HOST and not geo.mla:
                # -nkvo: the layer's K and V, read from host memory, are copied in whole
                # (measured: Grok-1 -c 16384 -nkvo 1,680 MiB, 64 MiB over the KQ phase)
                attn += (cache_row_bytes(ctk, la.head_k * la.n_head_kv)
                         + cache_row_bytes(ctv, la.head_v * la.n_head_kv)) * n_kv
        if la.recurrent and rshape is not None:
            attn = _delta_net_activations(rshape, e, T)
        if la.recurrent and kshape is not None:
            attn = _kda_activations(kshape, e, T, n_seq)
        phases[a_dev].append(attn)
        if after_copy is not None:
            # the previous layer's residual sits above its experts' returned copy (see below); this
            # layer's attention tensors that do not fit in the hole the copy left (the copy and the
            # FFN input, freed) are stacked above it (ggml-alloc.c: best fit among the free blocks,
            # else the end of the buffer). Absorbed MLA: the absorbed queries and the concatenated
            # latent queries are alive together at the peak; otherwise Q (and KQ with FA off)
            hole = f4 * (geo.n_expert_used * e + e)
            if geo.mla:
                big = [la.n_head * geo.kv_lora_rank * f4, la.n_head * (geo.kv_lora_rank + geo.n_rot) * f4]
            else:
                big = [la.n_head * la.head_k * f4] + ([] if fa else [n_kv * T * la.n_head * 4])
            phases[a_dev].append(after_copy + f4 * e + sum(b for b in big if b > hole) - masks)
        x_dev = where(placement, il, EXPERT_BASES)
        r_dev = where(placement, il, ROUTER_BASES)
        d_dev = where(placement, il, DENSE_BASES)
        if x_dev is not None and geo.n_ff_exp:
            moe = ffn_floats(moe_tensors, geo.n_expert_used, geo.n_ff_exp, e)
            if x_dev == (r_dev or a_dev):
                phases[x_dev].append(f4 * (moe + 2 * e + 2 * geo.n_expert))
            s_dev = where(placement, il, ("ffn_down_shexp", "ffn_up_shexp"))
            if x_dev != (r_dev or a_dev):
                back = r_dev or a_dev
                phases[x_dev].append(f4 * (moe + e))
                phases[back].append(f4 * (2 * e + 2 * geo.n_expert))
                # the experts' output crosses back as a split input: the scheduler copies it into
                # the router device's compute buffer at the start of that split (ggml-backend.cpp,
                # ggml_backend_sched_split_graph pass 5 and graph_copy); the weighting runs in place
                # on the copy while the running sum, the residual and (for a shared expert) the
                # FFN input stay alive
                kept = 2 + (1 if s_dev == back and geo.n_ff_shexp else 0)
                copy = geo.n_expert_used * e
                phases[back].append(f4 * (copy + kept * e))
                # where the copy lands: the residual (ffn_inp) was allocated by the attention
                # output projection while the attention result (n_head * head_v) was alive, so it
                # sits above it; the copy goes above the residual unless it fits in the hole the
                # attention result left (less the router's scratch allocated there meanwhile)
                router = f4 * (geo.n_expert + 2 * geo.n_expert_used + 1)
                attn_out = la.n_head * (geo.head_v_mla if geo.mla else la.head_v)
                if a_dev == back and f4 * copy > f4 * attn_out - router:
                    phases[back].append(f4 * (2 * e + attn_out + copy))
                if back in tail_base:
                    # the copies of this device's layers land above the first split's inputs
                    phases[back].append(tail_base[back] + f4 * copy)
                if s_dev == back and geo.n_ff_shexp and rshape is None:  # see recurrent.py
                    # the shared expert still needs the FFN input, so no hole of n_embd is free
                    # below the copy: the experts' sum (its first ADD is allocated while the copy is
                    # alive; the later ADDs, the residual add and the output norm run in place on
                    # it) lands above the copy and carries the residual stream from there on
                    residual_at[back] = f4 * (2 * e + copy) + router + (masks if il != last else 0)
            if s_dev is not None and geo.n_ff_shexp:
                phases[s_dev].append(f4 * (3 * geo.n_ff_shexp + 3 * e))
        if d_dev is not None:
            n_ff = _width(placement, il, "ffn_up") or geo.n_ff_dense
            phases[d_dev].append(f4 * (3 * n_ff + 2 * e))
    o_rows = output_rows
    o4 = 4 * o_rows
    output_phase = o4 * (geo.n_vocab + 2 * e)
    output_phase += output_gpu_experts_copy(placement, geo.n_expert_used, e, o_rows)  # -ngl 1 (h20ngl)
    if residual_at.get(out_dev) is not None:
        # the output norm runs in place on the residual; the logits go above it
        output_phase = (residual_at[out_dev] or 0) + o4 * (geo.n_vocab + e)
    compute: dict[str, int] = defaultdict(int)
    copies = PIPELINE_COPIES if pipeline else 1
    for d in devices | set(phases) | {out_dev}:
        live = masks if (d in attn_devs or d == HOST) else 0
        if d == HOST and d in attn_devs:
            # layers run on the CPU while the unused token-embeddings input stays allocated,
            # plus one hidden state more (measured on glm4moe and llama4)
            # with a wider input (Qwen3-VL's deepstack) the padded input runs here too
            # and stays alive while the first layers add its views back
            live += f4 * e_inp + f4 * (e_inp if first_on.get(HOST) == 0 else e)
        if copies > 1 and d != HOST:
            # each split's inputs (the hidden state arriving, the masks) in 4 persistent copies;
            # the last stage (the output device) holds two more hidden states (measured)
            live = copies * (live + f4 * e) + (4 if d == out_dev else 2) * f4 * e
        peak = max((p + live for p in phases.get(d, [])), default=0)
        if d == out_dev:
            peak = max(peak, output_phase + (live if copies > 1 else 0))
        if d == HOST:
            # the graph inputs (token embeddings input, masks) and the input layer's output; the
            # input is n_embd_inp wide (Qwen3-VL's deepstack), the rows looked up
            # n_embd (the padding to n_embd_inp runs where the first layer does)
            peak = max(peak, copies * (masks + f4 * e_inp) + f4 * e)
        compute[d] = peak
    return dict(compute)


def ffn_floats(moe_tensors: int, used: int, n_ff_exp: int, n_embd: int) -> int:
    """Floats per token alive at the routed experts' peak: gate, up, their gated product and the
    down projection's output, the latter in the hole gate and up left when it fits there (ggml-alloc:
    best fit among the free blocks, a tensor freed after its last consumer; measured on MiniMax-M2 with
    routed experts on the CPU: 134 MiB where the four tensors side by side would be 158)."""
    ffe = used * n_ff_exp
    down = used * n_embd
    if moe_tensors == 3 and down <= 2 * ffe:
        return 3 * ffe
    return moe_tensors * ffe + down


def _delta_net_activations(rs: RecurrentShape, n_embd: int, n_tokens: int, n_seqs: int = 1) -> int:
    """Bytes alive at a gated delta-net layer's peak (the fused op's result being written): the
    layer input and its norm, the gate z, the conv output (SiLU in place), the L2-normed q and k,
    the state rows read for this ubatch and the op's result (per-token output + new state)."""
    f4 = 4 * n_tokens
    k_dim = rs.n_group * rs.d_state
    v_dim = rs.d_inner
    state = rs.n_embd_s * 4 * n_seqs
    return (f4 * (2 * n_embd + v_dim + rs.conv_channels + 2 * k_dim + v_dim)
            + 2 * state)


def kda_shape(inv: Inventory) -> KdaShape | None:
    """Kimi-Linear's KDA layers (`Traits.recurrent` "kda"), whose activations this model counts."""
    return rec.kda_dims(inv) if traits(inv.arch).recurrent == "kda" else None


def _kda_activations(ks: KdaShape, n_embd: int, n_tokens: int, n_seqs: int = 1) -> int:
    """Bytes alive at a KDA layer's peak (src/models/kimi-linear.cpp `graph` and `causal_conv1d`,
    src/models/delta-net-base.cpp `build_delta_net_fused`): Q, K and V are projected separately and
    each run through the concat of its conv state rows, SSM_CONV and SiLU, so the layer input and its
    norm, Q, K and V, the L2-normed Q and K, the gate g1 (heads x head_dim), the state rows read and
    the fused op's result (per-token output + the new state) are alive together. Measured with an
    instrumented ggml-alloc at -ub 512: 70.06 MiB on Kimi-Linear-48B-A3B; this gives 69.0."""
    f4 = 4 * n_tokens
    state = ks.n_embd_s * 4 * max(1, n_seqs)
    return f4 * (2 * n_embd + 7 * ks.d_inner) + 2 * state


# --- every block on the CPU (-ngl 0, -ngl 1; h20ngl) ---
# "host" is -ngl 0 (the output layer on the CPU too), "gpu_output" is -ngl 1 (only the output layer
# offloaded: that GPU runs the output norm and the logits, plus what `output_gpu_experts_copy` says).
# The engine's graph gives both exactly on every modelled architecture (tests/test_memory_cpu_layers.py,
# tests/data/cpu_layers_oracle.json: llama-fit-params -fitp on); the phase model, which only ranks a
# search's candidates, was off there by up to 30 MiB per 512 ubatch tokens.


def cpu_layers_case(placement: Placement) -> str | None:
    """"host" where -ngl puts every block and the output layer on the CPU, "gpu_output" where it
    puts every block on the CPU and the output layer on a GPU (-ngl 1), None otherwise."""
    inv = placement.inventory
    if not all(placement.defaults.get(t.name) in (HOST, None) for t in inv.tensors if t.layer is not None):
        return None
    return "host" if output_device(placement) == HOST else "gpu_output"


# weighted tensors a layer's graph uses after its routed experts' sum: a shared expert, a dense FFN
# beside the experts, a norm after the FFN (Grok's layer_output_norm)
_AFTER_EXPERTS = frozenset({"ffn_up", "ffn_gate", "ffn_down", "layer_output_norm", "ffn_post_norm", "post_ffw_norm"})


def output_gpu_experts_copy(placement: Placement, n_expert_used: int, n_embd: int, n_tokens: int) -> int:
    """Bytes the output GPU of -ngl 1 holds beside the logits when the last layer, run on the CPU, ends
    with its routed experts: the weighting and sum of the experts' outputs and the residual add carry
    no weights, so the scheduler's "expand GPU up" pass (ggml-backend.cpp,
    ggml_backend_sched_split_graph) gives them the output GPU, whose split then starts with a copy of
    the experts' outputs (n_embd x n_expert_used x ubatch floats), a split input kept allocated to the
    end (measured: Qwen3-30B-A3B 32 MiB, gpt-oss 22.5, MiniMax-M2 48 at -ub 512). A shared expert,
    a dense FFN or a norm after the experts has its weights on the CPU: the sum stays there (0)."""
    if cpu_layers_case(placement) != "gpu_output":
        return 0
    inv = placement.inventory
    last = max((t.layer for t in inv.tensors if t.layer is not None), default=None)
    bases = {t.base for t in inv.tensors if t.layer == last}
    if not any(b.endswith("_exps") for b in bases) or any("shexp" in b or b in _AFTER_EXPERTS for b in bases):
        return 0
    return 4 * n_tokens * n_expert_used * n_embd
