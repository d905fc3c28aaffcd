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
    experts_cpu: tuple[bool, ...]  # per layer: its routed experts run on the CPU
    n_tokens: int
    n_kv: int  # mask cells (per stream)
    n_seqs: int = 1
    first: int = 0
    last: int = -1  # -1: every layer from `first` on, and the output
    after_cpu: bool = False  # the layer before `first` ran wholly on the CPU (else on another GPU)


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
            ffe = s.n_ff_exp * used * f
            if s.experts_cpu[il]:
                g.split(CPU)
                xc = g.input(("x", il), e * f, xr)
                tc = g.input(("topk", il), tk, topk)
                down = g.op(e * used * f, g.op(ffe, g.op(ffe, xc, tc), g.op(ffe, xc, tc)), tc)
                g.split(GPU)
                down = g.input(("down", il), e * used * f, down)
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
    g.finish()
    return g


@lru_cache(maxsize=512)
def kda_peak(s: KdaGraphShape, alignment: int) -> int:
    """The GPU's compute buffer size."""
    return kda_graph(s).peaks((alignment, 32))[0]


_ROUTED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def replayed_kda(placement: Placement, geo: Geometry, out_dev: str, n_tokens: int, cells: int,
                 n_seqs: int = 1) -> dict[str, int]:
    """Each GPU's compute buffer by the replay above, for a GPU running one contiguous range of
    whole layers (its routed experts there or all on the CPU), first, after the CPU's layers or
    another GPU's, and the output if it runs the last layer; other GPUs are left to the phase
    model (empty: none replayed)."""
    from collections import defaultdict

    from moeconf.engines import AUTO_GPU
    from moeconf.memory import recurrent as rec

    inv = placement.inventory
    ks = rec.kda_shape(inv)
    n_layer = len(geo.layers)
    if (ks is None or not geo.mla or geo.n_expert_used < 2 or not geo.n_ff_exp or not geo.n_ff_shexp
            or not n_layer or [la.index for la in geo.layers] != list(range(n_layer))):
        return {}
    home: dict[int, set[str | None]] = defaultdict(set)
    routed: dict[int, set[str | None]] = defaultdict(set)
    dense: dict[int, int] = {}
    for t in inv.tensors:
        il = t.layer
        if il is None or il >= n_layer:
            continue
        (routed if t.base in _ROUTED else home)[il].add(placement.devices[t.name])
        if t.base == "ffn_up" and len(t.shape) > 1:
            dense[il] = t.shape[1]
    heads = {la.n_head for la in geo.layers}
    if len(heads) != 1:
        return {}
    n_head = heads.pop()
    dev_of: list[str] = []
    experts: list[bool] = []
    for il in range(n_layer):
        if len(home[il]) != 1:
            return {}
        d = next(iter(home[il]))
        if d is None or d == AUTO_GPU:
            return {}
        if il not in dense and routed[il] not in ({d}, {"CPU"}):
            return {}
        experts.append(il not in dense and routed[il] == {"CPU"} and d != "CPU")
        dev_of.append(d)
    runs = device_runs(dev_of)
    out: dict[str, int] = {}
    for i, (d, first, last) in enumerate(runs):
        if d == "CPU" or sum(run[0] == d for run in runs) != 1:
            continue
        if last == n_layer:
            if out_dev != d or any(placement.devices.get(n) != d for n in ("output_norm.weight", "output.weight")
                                   if n in inv.by_name):
                continue
        elif runs[i + 1][0] == "CPU" or out_dev == d:
            continue
        shape = KdaGraphShape(
            n_embd=geo.n_embd, n_vocab=geo.n_vocab, n_head=n_head,
            head_dim=ks.head_dim, d_conv=ks.d_conv, kv_lora_rank=geo.kv_lora_rank, n_rot=geo.n_rot,
            head_k_mla=geo.head_k_mla, head_v_mla=geo.head_v_mla, n_expert=geo.n_expert,
            n_expert_used=geo.n_expert_used, n_ff_exp=geo.n_ff_exp, n_ff_shexp=geo.n_ff_shexp,
            n_ff=tuple(dense.get(il, 0) for il in range(n_layer)), recurrent=tuple(la.recurrent for la in geo.layers),
            experts_cpu=tuple(experts), n_tokens=n_tokens, n_kv=cells, n_seqs=max(1, n_seqs), first=first,
            last=-1 if last == n_layer else last, after_cpu=first > 0 and dev_of[first - 1] == "CPU",
        )
        out[d] = kda_peak(shape, 128 if d.startswith(("CUDA", "ROCm", "MUSA")) else 32)
    return out


def unmodelled_placement(placement: Placement) -> list[str]:
    """Kimi-Linear placements whose compute neither the replay above nor the phase model was checked
    on (measured off by 17-41 MiB where tried): a layer's own tensors over several devices, a
    layer's routed experts split between devices, a GPU running two separate ranges of layers, the
    host running the last layer and the output (empty: modelled)."""
    from collections import defaultdict

    inv = placement.inventory
    n_layer = inv.metadata.block_count
    home: dict[int, set[str | None]] = defaultdict(set)
    routed: dict[int, dict[str, str | None]] = defaultdict(dict)
    for t in inv.tensors:
        if t.layer is None or t.layer >= n_layer:
            continue
        if t.base in _ROUTED:
            routed[t.layer][t.base] = placement.devices[t.name]
        else:
            home[t.layer].add(placement.devices[t.name])
    why: list[str] = []
    split = sorted(il for il in range(n_layer) if len(home[il]) > 1)
    if split:
        why.append(f"layer {split[0]}'s tensors on several devices (-ot on its attention, KDA or norm tensors)")
    dev_of = [next(iter(home[il])) if len(home[il]) == 1 else None for il in range(n_layer)]
    parts = sorted(il for il in range(n_layer) if routed[il] and dev_of[il] is not None and (
        len(set(routed[il].values())) > 1 or next(iter(routed[il].values())) not in (dev_of[il], "CPU")))
    if parts:
        why.append(f"layer {parts[0]}'s routed experts split between devices (gate, up and down not together on "
                   "its device or on the CPU)")
    runs = device_runs([d or "?" for d in dev_of])
    twice = sorted({d for d, _, _ in runs if d not in ("CPU", "?") and sum(r[0] == d for r in runs) > 1})
    if twice:
        why.append(f"{twice[0]} running two separate ranges of layers")
    if dev_of and dev_of[-1] == "CPU" and placement.devices.get("output.weight") == "CPU":
        why.append("the host running the last layer and the output (-ngl 0; measured 41 MiB over the phase model)")
    return [f"compute is not modelled for kimi-linear with {w}: KV cache and compute are not computed" for w in why]
