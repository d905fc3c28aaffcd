"""A replay of ggml-alloc (see `replay`) over a GPU's share of the Kimi-Linear (`kimi-linear`)
graph: KDA layers (Kimi delta attention, the fused gated delta-net op) and absorbed-MLA attention
layers, each followed by a dense FFN (the leading layers) or routed experts with a selection bias
and an ungated shared expert.

The node order is the graph's, read from the pinned llama.cpp (0.3.36): src/models/kimi-linear.cpp
(`graph`, `causal_conv1d`), src/models/delta-net-base.cpp (`build_delta_net_fused`),
src/llama-graph.cpp (`build_rs`, `build_attn` with the K-only MLA cache, `build_moe_ffn` with
sigmoid gating, a selection bias, normalised and scaled weights, `build_ffn`). A KDA layer reads
its conv state rows once, then for Q, K and V in turn projects, concatenates the state rows and
the tokens and writes the last columns back (expanded there), so the three concatenations are
alive before the first SSM_CONV runs; each SiLU, RMS_NORM and the MUL/DIV/SCALE/SIGMOID on a
reshaped tensor take new memory (ggml-alloc never runs an op in place on a view while the scheduler
reserves). The node order and the splits were read off `GGML_SCHED_DEBUG=2` and the allocations
of an instrumented ggml-alloc of the pinned build (`AT_PRINTF`) on Kimi-Linear-48B-A3B; the
buffer sizes match llama-fit-params to 0.05 MiB on every GPU row replayed
(tests/data/kda_memory_oracle.json)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from moeconf.memory.replay import CPU, GPU, Graph, device_runs, sigmoid_router

if TYPE_CHECKING:
    from moeconf.memory.geometry import Geometry
    from moeconf.placement import Placement


@dataclass(frozen=True)
class KdaGraphShape:
    n_embd: int
    n_vocab: int
    n_head: int
    head_dim: int  # kda.head_dim
    d_conv: int
    kv_lora_rank: int
    n_rot: int  # the MLA's rope part
    head_k_mla: int  # per-head query width (nope + rope)
    head_v_mla: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    n_ff: tuple[int, ...]  # per layer: the dense FFN's width, 0 for a MoE layer
    recurrent: tuple[bool, ...]  # per layer: a KDA layer (else MLA)
    # per layer: the device (0: this GPU, 1: the CPU, 2 on: other GPUs) of its own tensors and of its
    # routed experts' gate, up and down matmuls (() for a dense layer)
    homes: tuple[int, ...]
    experts: tuple[tuple[int, ...], ...]
    n_tokens: int
    n_kv: int  # mask cells (per stream)
    n_seqs: int = 1
    first: int = 0
    last: int = -1  # -1: every layer from `first` on, and the output
    after_cpu: bool = False  # the layer before `first` ran wholly on the CPU (else on another GPU)
    n_outputs: int = 0  # the output rows after the last layer's out_ids (0: the ubatch; settings.n_outputs)


HERE, HOST = 0, 1  # device ids in `KdaGraphShape` (other GPUs: 2 on)


def expert_devices(home: int, gate: int, up: int, down: int) -> tuple[int, int]:
    """Where the scheduler runs a layer's SwiGLU and the weighting and sum of its routed experts'
    outputs (ggml-backend.cpp `ggml_backend_sched_split_graph`, pass 2: GPU backends expand down,
    then up, over nodes without weights; the CPU only where no GPU reaches): the SwiGLU where up
    runs if that is a GPU, else where down runs if that is a GPU, else the CPU; the weighting and
    the sum where down runs if that is a GPU, else on the layer's device (the shared expert after
    them expands up)."""
    act = up if up != HOST else (down if down != HOST else HOST)
    return act, (down if down != HOST else home)


def kda_graph(s: KdaGraphShape) -> Graph:
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    used = s.n_expert_used
    n_layer = len(s.recurrent)
    last = n_layer if s.last < 0 else s.last
    whole = s.first == 0 and last == n_layer
    leaves: dict[str, int] = {}
    ns = max(1, s.n_seqs)
    d_inner = s.n_head * s.head_dim
    n_embd_r = 3 * (s.d_conv - 1) * d_inner
    n_embd_s = s.head_dim * s.head_dim * s.n_head
    r = s.kv_lora_rank

    def graph_input(name: str, size: int) -> int:
        if whole and name not in leaves:
            leaves[name] = g.leaf(size, CPU)
        return g.input(name, size, leaves.get(name, -1))

    if whole:
        tokens = g.leaf(f, CPU)
        g.leaf(e * f, CPU)  # the embeddings input, unused with token ids
        g.split(CPU)
        embd = g.op(e * f, tokens)
        g.split(GPU)
        inp = g.input("embd", e * f, embd)
    elif s.first == 0:
        inp = g.input("embd", e * f)
    elif not s.after_cpu:
        inp = -1  # the GPU before ran this layer's first RMS_NORM ("expand GPU down")
    else:
        # the CPU layer's weightless tail runs here ("expand GPU up"): the sum of the routed and
        # shared experts (a dense layer: its output) and the residual add, on copies
        if s.n_ff[s.first - 1]:
            out = g.input("ffn_out", e * f)
        else:
            out = g.op(e * f, g.input("moe_out", e * f), g.input("shexp", e * f), inplace=True)
        inp = g.op(e * f, out, g.input("ffn_inp", e * f), inplace=True)
    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4  # the copy of the chosen ids (a strided view)
    ffe = s.n_ff_exp * used * f

    def routed(il: int, xr: int, topk: int, weights: int) -> int:
        """Layer il's routed experts, each node on its device (this GPU: buffer GPU; any other: buffer
        CPU, a split per device), each crossing a copy made at the start of the consumer's split;
        the experts' sum, on the layer's device (a copy if it was made elsewhere). For another
        device's layer `xr`, `topk` and `weights` are -1: copied in where this GPU needs them."""
        home = s.homes[il]
        gate_d, up_d, down_d = s.experts[il]
        act_d, sum_d = expert_devices(home, gate_d, up_d, down_d)
        here = home
        if home != HERE:
            g.split(CPU)  # another device's layer: its nodes there, a split of their own
        made: dict[int, int] = {}  # tensor -> the device it was made on

        def on(dev: int) -> None:
            nonlocal here
            if here != dev:
                g.split(GPU if dev == HERE else CPU)
                here = dev

        def use(key: str, t: int, size: int) -> int:
            """Tensor t (-1: the layer's input `key`, made on its device, outside this graph) as a
            source on the current device: itself, or the current split's copy of it."""
            src = made.get(t, home) if t >= 0 else home
            if t >= 0 and src == here:
                return t
            return g.input((key, il, here), size, t)

        def op(dev: int, size: int, *srcs: tuple[str, int, int], inplace: bool = False) -> int:
            on(dev)
            t = g.op(size, *(use(k, x, n) for k, x, n in srcs), inplace=inplace)
            made[t] = dev
            return t

        xs, ts = ("x", xr, e * f), ("topk", topk, tk)
        gate = op(gate_d, ffe, xs, ts)
        up = op(up_d, ffe, xs, ts)
        act = op(act_d, ffe, ("gate", gate, ffe), ("up", up, ffe))
        down = op(down_d, e * used * f, ("act", act, ffe), ts)
        on(sum_d)
        dn = use("down", down, e * used * f)
        weighted = g.op(e * used * f, dn, g.view(use("weights", weights, used * f)), inplace=True)
        moe = g.op(e * f, g.view(weighted), g.view(weighted))
        for _ in range(used - 2):
            moe = g.op(e * f, moe, g.view(weighted), inplace=True)
        made[moe] = sum_d
        on(home)
        return use("moe_out", moe, e * f)

    foreign = [il for il in range(n_layer) if not s.first <= il < last and s.homes[il] != HERE
               and HERE in s.experts[il]]
    for il in foreign:
        if il < s.first:
            here0 = g.buf
            routed(il, -1, -1, -1)
            g.split(here0)
    for il in range(s.first, last):
        norm = g.input("norm", e * f) if inp < 0 else g.op(e * f, inp, inplace=True)
        cur = g.op(e * f, norm, inplace=True)  # attn_norm
        if s.recurrent[il]:
            s_copy = graph_input("s_copy_main", 4 * ns)
            extra = g.zero_input("s_copy_extra")  # the other sequences' rows: none in the reserve
            conv_rows = g.op(n_embd_r * 4 * ns, s_copy)  # GET_ROWS of the conv states
            g.op(0, g.zero(extra))  # GET_ROWS of no extra rows, copied into the state
            cat = []
            for _ in range(3):  # Q, K, V: projection, concat with the state rows, last columns saved
                proj = g.op(d_inner * f, cur)
                c = g.op((T + (s.d_conv - 1) * ns) * d_inner * 4, g.view(conv_rows), g.view(proj))
                g.op(0, g.view(c))
                cat.append(c)
            state = g.op(n_embd_s * 4 * ns, s_copy)  # GET_ROWS of the delta state
            g.op(0, g.zero(extra))
            qkv = []
            for i, c in enumerate(cat):
                x = g.op(d_inner * f, c)  # SSM_CONV
                x = g.op(d_inner * f, g.view(x))  # SiLU of the reshaped output
                if i < 2:  # Q and K: L2 norm (RMS_NORM of a view, SCALE in place)
                    x = g.op(d_inner * f, g.view(x))
                    x = g.op(d_inner * f, x, inplace=True)
                qkv.append(x)
            fa = g.op(s.head_dim * f, cur)  # f_a
            g1 = g.op(d_inner * f, fa)  # f_b
            g1 = g.op(d_inner * f, g1, inplace=True)  # + dt bias
            g1 = g.op(d_inner * f, g1, inplace=True)  # softplus
            g1 = g.op(d_inner * f, g.view(g1))  # * A (on the reshaped tensor)
            beta = g.op(s.n_head * f, cur)
            beta = g.op(s.n_head * f, g.view(beta))  # sigmoid
            res = g.op((d_inner * T + n_embd_s * ns) * 4, qkv[0], qkv[1], g.view(qkv[2]), g.view(g1), beta,
                       g.view(state))
            g.op(0, g.view(res))  # the new state copied into the cache
            out = g.op(d_inner * f, g.view(res))  # CONT of the output
            nrm = g.op(d_inner * f, g.view(out))  # o_norm: RMS_NORM of the reshaped output
            nrm = g.op(d_inner * f, nrm, inplace=True)
            ga = g.op(s.head_dim * f, g.view(cur))  # g_a
            g2 = g.op(d_inner * f, ga)  # g_b
            g2 = g.op(d_inner * f, g.view(g2))  # sigmoid of the reshaped gate
            nrm = g.op(d_inner * f, nrm, g2, inplace=True)
            gated = g.op(d_inner * f, g.view(nrm))  # CONT
            o = g.op(e * f, gated)  # wo
        else:
            q = g.op(s.n_head * s.head_k_mla * f, cur)
            qa = g.op(s.n_head * r * f, g.view(q))  # q_nope absorbed by wk_b
            qc = g.op(s.n_head * (r + s.n_rot) * f, g.view(qa), g.view(q))  # CONCAT with q_pe
            kv = g.op((r + s.n_rot) * f, cur)  # wkv_a_mqa
            kn = g.op(r * f, g.view(kv))  # RMS_NORM of the latent
            kn = g.op(r * f, kn, inplace=True)
            kc = g.op((r + s.n_rot) * f, g.view(kn), g.view(kv))  # CONCAT with k_pe
            g.op(0, g.view(kc), graph_input("k_idxs", 8 * T))  # SET_ROWS into the cache
            att = g.op(s.n_head * r * f, g.view(qc), graph_input("mask", 2 * T * s.n_kv))  # FLASH_ATTN_EXT
            vb = g.op(s.n_head * s.head_v_mla * f, g.view(att))  # wv_b
            vb = g.op(s.n_head * s.head_v_mla * f, g.view(vb))  # CONT of the permuted
            o = g.op(e * f, g.view(vb))  # wo
        res_in = g.input("l_out", e * f) if inp < 0 else inp
        if il == n_layer - 1:
            T = s.n_outputs or T  # from here on, only the output rows
            f = 4 * T
            tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4
            ffe = s.n_ff_exp * used * f
            out_ids = graph_input("out_ids", f)
            o = g.op(e * f, o, out_ids)
            res_in = g.op(e * f, res_in, out_ids)
        ffn_inp = g.op(e * f, o, res_in, inplace=True)
        x = g.op(e * f, g.op(e * f, ffn_inp), inplace=True)  # ffn norm
        if s.n_ff[il]:
            ff = s.n_ff[il] * f
            out = g.op(e * f, g.op(ff, g.op(ff, x), g.op(ff, x)))
        else:
            topk, wscaled = sigmoid_router(g, x, s.n_expert * f, used * f, f)
            xr = g.view(x)
            moe = routed(il, xr, topk, wscaled)
            ffs = s.n_ff_shexp * f
            sh = g.op(e * f, g.op(ffs, g.op(ffs, x), g.op(ffs, x)))
            out = g.op(e * f, moe, sh, inplace=True)
        inp = g.op(e * f, out, ffn_inp, inplace=True)  # l_out
    if last == n_layer:
        x = g.op(e * f, g.op(e * f, inp, inplace=True), inplace=True)  # output norm
        g.op(s.n_vocab * f, x, output=True)
    else:
        g.op(0, g.op(e * f, inp))  # the next GPU's first RMS_NORM runs here
        g.op(0, inp)
    for il in foreign:
        if il >= last:
            routed(il, -1, -1, -1)
    g.finish()
    return g


@lru_cache(maxsize=512)
def kda_peak(s: KdaGraphShape, alignment: int) -> int:
    """The GPU's compute buffer size."""
    return kda_graph(s).peaks((alignment, 32))[0]


_ROUTED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_BITS = (1, 2, 4)  # gate, up, down on the CPU (replay_hybrid's GATE_CPU, UP_CPU, DOWN_CPU)


@dataclass(frozen=True)
class _Layout:
    home: tuple[str, ...]  # per layer: the device of its own tensors
    parts: tuple[tuple[str, ...], ...]  # per layer: where its gate, up and down experts run (() if dense)
    dense: tuple[int, ...]  # per layer: the dense FFN's width, 0 for a MoE layer


def _layout(placement: Placement) -> _Layout | str | None:
    """The placement as the replay needs it; a string: why compute is not modelled for it; None: an
    automatic split (the phase model's, as for every architecture)."""
    from collections import defaultdict

    from moeconf.engines import AUTO_GPU

    inv = placement.inventory
    n_layer = inv.metadata.block_count
    home: dict[int, set[str | None]] = defaultdict(set)
    routed: dict[int, dict[str, str | None]] = defaultdict(dict)
    dense: dict[int, int] = {}
    for t in inv.tensors:
        il = t.layer
        if il is None or il >= n_layer:
            continue
        if t.base in _ROUTED:
            routed[il][t.base] = placement.devices[t.name]
        else:
            home[il].add(placement.devices[t.name])
            if t.base == "ffn_up" and len(t.shape) > 1:
                dense[il] = t.shape[1]
    homes: list[str] = []
    parts: list[tuple[str, ...]] = []
    for il in range(n_layer):
        if len(home[il]) != 1:
            return f"layer {il}'s tensors on several devices (-ot on its attention, KDA or norm tensors)"
        d = next(iter(home[il]))
        where = tuple(routed[il].get(b) for b in _ROUTED) if routed[il] else ()
        if d is None or any(w is None for w in where):
            return f"layer {il} not placed"
        if d == AUTO_GPU or AUTO_GPU in where:
            return None
        homes.append(d)
        parts.append(tuple(w for w in where if w is not None))
    runs = device_runs(homes)
    twice = sorted({d for d, _, _ in runs if d != "CPU" and sum(r[0] == d for r in runs) > 1})
    if twice:
        return f"{twice[0]} running two separate ranges of layers"
    for i, (d, first, _) in enumerate(runs):
        if i and d != "CPU" and runs[i - 1][0] == "CPU" and set(parts[first - 1]) - {"CPU"}:
            return f"layer {first - 1} on the CPU with its routed experts on a GPU before {d}'s layers"
    out = placement.devices.get("output.weight")
    if homes and out is not None and out != homes[-1]:
        return f"the output on {out} and the last layer on {homes[-1]}"
    if homes and homes[-1] == "CPU":
        return "the host running the last layer and the output (-ngl 0; measured 41 MiB over the phase model)"
    return _Layout(tuple(homes), tuple(parts), tuple(dense.get(il, 0) for il in range(n_layer)))


def replayed_kda(placement: Placement, geo: Geometry, out_dev: str, n_tokens: int, cells: int,
                 n_seqs: int = 1, n_outputs: int = 0, dry: bool = False) -> dict[str, int]:
    """Each GPU's compute buffer by the replay above: a GPU runs one contiguous range of whole
    layers, first, after the CPU's layers or after another GPU's, and the output if it runs the last
    layer; each layer's routed experts run on its GPU, wholly elsewhere (the CPU, another GPU), or
    partly on the CPU; a GPU also runs the routed experts of other devices' layers (empty: none
    replayed, see `unmodelled_placement`)."""
    import moeconf.memory.recurrent as rec

    inv = placement.inventory
    ks = rec.kda_shape(inv)
    n_layer = len(geo.layers)
    if (ks is None or not geo.mla or geo.n_expert_used < 2 or not geo.n_ff_exp or not geo.n_ff_shexp
            or n_layer != inv.metadata.block_count or [la.index for la in geo.layers] != list(range(n_layer))):
        return {}
    lay = _layout(placement)
    heads = {la.n_head for la in geo.layers}
    if not isinstance(lay, _Layout) or len(heads) != 1:
        return {}
    n_head = heads.pop()
    out: dict[str, int] = {}
    for d, first, last in device_runs(list(lay.home)):
        if d == "CPU" or (last == n_layer and out_dev != d):
            continue
        ids = {d: HERE, "CPU": HOST}
        for other in lay.home + tuple(w for ws in lay.parts for w in ws):
            ids.setdefault(other, len(ids) + 1)
        shape = KdaGraphShape(
            n_embd=geo.n_embd, n_vocab=geo.n_vocab, n_head=n_head, head_dim=ks.head_dim, d_conv=ks.d_conv,
            kv_lora_rank=geo.kv_lora_rank, n_rot=geo.n_rot, head_k_mla=geo.head_k_mla, head_v_mla=geo.head_v_mla,
            n_expert=geo.n_expert, n_expert_used=geo.n_expert_used, n_ff_exp=geo.n_ff_exp, n_ff_shexp=geo.n_ff_shexp,
            n_ff=lay.dense, recurrent=tuple(la.recurrent for la in geo.layers),
            homes=tuple(ids[h] for h in lay.home), experts=tuple(tuple(ids[w] for w in ws) for ws in lay.parts),
            n_tokens=n_tokens, n_kv=cells, n_seqs=max(1, n_seqs), first=first,
            last=-1 if last == n_layer else last, after_cpu=first > 0 and lay.home[first - 1] == "CPU",
            n_outputs=n_outputs,
        )
        out[d] = 0 if dry else kda_peak(shape, 128 if d.startswith(("CUDA", "ROCm", "MUSA")) else 32)
    if dry:  # only which devices the replay covers
        return out
    host = _host(placement, geo, lay, n_tokens, cells, n_seqs)
    if host is not None:
        out["CPU"] = host
    return out


def _host(placement: Placement, geo: Geometry, lay: _Layout, n_tokens: int, cells: int, n_seqs: int) -> int | None:
    """The host's buffer where GPUs run every layer and the output and the CPU some routed experts
    (wholly or in part): `replay_hybrid.hybrid_host_graph` with Kimi-Linear's graph inputs (a KDA
    layer reads its state rows' indices, an MLA layer the K indices and the mask; no positions)."""
    from moeconf.memory.replay_hybrid import HybridHostShape, hybrid_host_peak

    if ("CPU" in lay.home or placement.devices.get("token_embd.weight") != "CPU"
            or not any("CPU" in w for w in lay.parts)):
        return None
    bufs: dict[str, int] = {}
    layers = []
    for la in geo.layers:
        il = la.index
        bufs.setdefault(lay.home[il], 0 if not bufs else len(bufs) + 1)  # buffer 1 is the host's
        reads: tuple[tuple[str, int], ...] = (
            (("s_copy", 4 * max(1, n_seqs)),) if la.recurrent
            else (("k_idxs", 8 * n_tokens), ("mask", 2 * n_tokens * cells)))
        cpu = sum(bit for bit, w in zip(_BITS, lay.parts[il], strict=True) if w == "CPU") if lay.parts[il] else 0
        layers.append((bufs[lay.home[il]], reads, cpu))
    shape = HybridHostShape(geo.n_embd, n_tokens, geo.n_expert, geo.n_expert_used, geo.n_ff_exp, tuple(layers))
    return hybrid_host_peak(shape)


def unmodelled_placement(placement: Placement) -> list[str]:
    """Kimi-Linear placements whose compute neither the replay above nor the phase model was checked
    on (measured off by 17-41 MiB where tried): a layer's own tensors over several devices, a GPU
    running two separate ranges of layers, the output away from the last layer, the host running
    the last layer and the output, a CPU layer with routed experts on the GPU that runs the next
    layers (empty: modelled)."""
    lay = _layout(placement)
    if isinstance(lay, str):
        return [f"compute is not modelled for kimi-linear with {lay}: KV cache and compute are not computed"]
    return []
