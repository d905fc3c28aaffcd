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
reserves). Checked node by node against an instrumented ggml-alloc of the pinned build
(`AT_PRINTF`) and `GGML_SCHED_DEBUG=2` on Kimi-Linear-48B-A3B."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from moeconf.memory.replay import CPU, GPU, Graph, device_runs

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
    # per layer: which of its routed experts' matmuls run on another device (GATE_AWAY | UP_AWAY |
    # DOWN_AWAY; ALL_AWAY: the whole layer's, on the CPU or another GPU; a part: on the CPU)
    experts_away: tuple[int, ...]
    n_tokens: int
    n_kv: int  # mask cells (per stream)
    n_seqs: int = 1
    first: int = 0
    last: int = -1  # -1: every layer from `first` on, and the output
    after_cpu: bool = False  # the layer before `first` ran wholly on the CPU (else on another GPU)
    # layers outside [first, last) whose three routed expert matmuls run on this GPU
    foreign: tuple[int, ...] = ()


GATE_AWAY, UP_AWAY, DOWN_AWAY = 1, 2, 4
ALL_AWAY = GATE_AWAY | UP_AWAY | DOWN_AWAY


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

    def foreign(il: int) -> None:
        """Another device's layer whose routed experts run here: a split of their own, copies of
        the FFN input and the chosen ids in, the experts' output copied back out."""
        g.split(GPU)
        x = g.input(("fx", il), e * f)
        t = g.input(("ft", il), tk)
        down = g.op(e * used * f, g.op(ffe, g.op(ffe, x, t), g.op(ffe, x, t)), t)
        g.split(CPU)
        g.input(("fdown", il), e * used * f, down)
        g.split(GPU)

    def split_experts(il: int, away: int, xr: int, topk: int) -> int:
        """A layer whose routed experts are partly on the CPU: each matmul runs where its weights
        are, the SwiGLU on the CPU only when up and down are, each crossing a copy at the start of
        the next split (as `replay_hybrid.hybrid_graph`)."""
        here = GPU

        def on(buf: int) -> None:
            nonlocal here
            if here != buf:
                g.split(buf)
                here = buf

        def ids() -> int:
            return topk if here == GPU else g.input(("topk", il), tk, topk)

        def xin() -> int:
            return xr if here == GPU else g.input(("x", il), e * f, xr)

        gate_buf = CPU if away & GATE_AWAY else GPU
        up_buf = CPU if away & UP_AWAY else GPU
        down_buf = CPU if away & DOWN_AWAY else GPU
        act_buf = CPU if up_buf == CPU and down_buf == CPU else GPU
        on(gate_buf)
        gate = g.op(ffe, xin(), ids())
        on(up_buf)
        up = g.op(ffe, xin(), ids())
        on(act_buf)
        ga = gate if gate_buf == act_buf else g.input(("gate", il), ffe, gate)
        ua = up if up_buf == act_buf else g.input(("up", il), ffe, up)
        act = g.op(ffe, ga, ua)
        on(down_buf)
        da = act if act_buf == down_buf else g.input(("act", il), ffe, act)
        down = g.op(e * used * f, da, ids())
        on(GPU)
        return down if down_buf == GPU else g.input(("down", il), e * used * f, down)

    for il in s.foreign:
        if il < s.first:
            foreign(il)
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
            out_ids = graph_input("out_ids", f)
            o = g.op(e * f, o, out_ids)
            res_in = g.op(e * f, res_in, out_ids)
        ffn_inp = g.op(e * f, o, res_in, inplace=True)
        x = g.op(e * f, g.op(e * f, ffn_inp), inplace=True)  # ffn norm
        if s.n_ff[il]:
            ff = s.n_ff[il] * f
            out = g.op(e * f, g.op(ff, g.op(ff, x), g.op(ff, x)))
        else:
            ne = s.n_expert * f
            probs = g.op(ne, g.op(ne, x), inplace=True)  # logits, sigmoid in place
            biased = g.op(ne, probs)  # + the selection bias
            topk = g.view(g.op(ne, biased))  # ARGSORT, its top-k view
            weights = g.op(used * f, g.view(probs), topk)  # GET_ROWS
            wsum = g.op(f, g.op(f, g.view(weights)), inplace=True)  # SUM_ROWS, CLAMP in place
            wnorm = g.op(used * f, g.view(weights), wsum)  # DIV
            wscaled = g.op(used * f, g.view(wnorm))  # SCALE (expert_weights_scale)
            xr = g.view(x)
            away = s.experts_away[il]
            if away == ALL_AWAY:
                g.split(CPU)
                xc = g.input(("x", il), e * f, xr)
                tc = g.input(("topk", il), tk, topk)
                down = g.op(e * used * f, g.op(ffe, g.op(ffe, xc, tc), g.op(ffe, xc, tc)), tc)
                g.split(GPU)
                down = g.input(("down", il), e * used * f, down)
            elif away:
                down = split_experts(il, away, xr, topk)
            else:
                down = g.op(e * used * f, g.op(ffe, g.op(ffe, xr, topk), g.op(ffe, xr, topk)), topk)
            weighted = g.op(e * used * f, down, g.view(wscaled), inplace=True)
            moe = g.op(e * f, g.view(weighted), g.view(weighted))
            for _ in range(used - 2):
                moe = g.op(e * f, moe, g.view(weighted), inplace=True)
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
    for il in s.foreign:
        if il >= last:
            foreign(il)
    g.finish()
    return g


@lru_cache(maxsize=512)
def kda_peak(s: KdaGraphShape, alignment: int) -> int:
    """The GPU's compute buffer size."""
    return kda_graph(s).peaks((alignment, 32))[0]


_ROUTED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_BITS = (GATE_AWAY, UP_AWAY, DOWN_AWAY)


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
    for il, (d, w) in enumerate(zip(homes, parts, strict=True)):
        others = {x for x in w if x not in (d, "CPU")}
        if len(others) > 1 or (others and set(w) != others and d != "CPU" and d in w):
            return f"layer {il}'s routed experts split between {', '.join(sorted(set(w)))}"
        if others and len(set(w)) > 1:
            return f"layer {il}'s routed experts split between {', '.join(sorted(set(w)))}"
        if d != "CPU" and d in w and len(set(w)) > 1 and set(w) - {d} != {"CPU"}:
            return f"layer {il}'s routed experts split between {', '.join(sorted(set(w)))}"
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
                 n_seqs: int = 1) -> dict[str, int]:
    """Each GPU's compute buffer by the replay above: a GPU runs one contiguous range of whole
    layers, first, after the CPU's layers or after another GPU's, and the output if it runs the last
    layer; each layer's routed experts run on its GPU, wholly elsewhere (the CPU, another GPU), or
    partly on the CPU; a GPU also runs the routed experts of other devices' layers (empty: none
    replayed, see `unmodelled_placement`)."""
    from moeconf.memory import recurrent as rec

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
        away = tuple(sum(bit for bit, w in zip(_BITS, lay.parts[il], strict=True) if w != d) if lay.parts[il] else 0
                     for il in range(n_layer))
        foreign = tuple(il for il in range(n_layer) if not first <= il < last and lay.parts[il]
                        and set(lay.parts[il]) == {d})
        shape = KdaGraphShape(
            n_embd=geo.n_embd, n_vocab=geo.n_vocab, n_head=n_head, head_dim=ks.head_dim, d_conv=ks.d_conv,
            kv_lora_rank=geo.kv_lora_rank, n_rot=geo.n_rot, head_k_mla=geo.head_k_mla, head_v_mla=geo.head_v_mla,
            n_expert=geo.n_expert, n_expert_used=geo.n_expert_used, n_ff_exp=geo.n_ff_exp, n_ff_shexp=geo.n_ff_shexp,
            n_ff=lay.dense, recurrent=tuple(la.recurrent for la in geo.layers), experts_away=away,
            n_tokens=n_tokens, n_kv=cells, n_seqs=max(1, n_seqs), first=first,
            last=-1 if last == n_layer else last, after_cpu=first > 0 and lay.home[first - 1] == "CPU",
            foreign=foreign,
        )
        out[d] = kda_peak(shape, 128 if d.startswith(("CUDA", "ROCm", "MUSA")) else 32)
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
    on (measured off by 17-41 MiB where tried): a layer's own tensors over several devices, a
    layer's routed experts split between its GPU and another GPU, a GPU running two separate
    ranges of layers, the output away from the last layer, the host running the last layer and the
    output (empty: modelled)."""
    lay = _layout(placement)
    if isinstance(lay, str):
        return [f"compute is not modelled for kimi-linear with {lay}: KV cache and compute are not computed"]
    return []
