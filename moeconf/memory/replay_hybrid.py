"""A replay of ggml-alloc (see `replay`) over a GPU's share of the Qwen3.5-MoE / Qwen3-Next
graph: gated delta-net layers (fused op) and gated full-attention layers, each followed by
routed experts and a sigmoid-gated shared expert.

The node order is the graph's (a depth-first walk from each `ggml_build_forward_expand`), read
from the pinned llama.cpp: src/models/qwen35moe.cpp (`graph`, `build_layer_attn`,
`build_layer_attn_linear`, `build_layer_ffn`), src/models/delta-net-base.cpp
(`build_conv_state`, `build_recurrent_attn`, `build_delta_net_fused`), src/llama-graph.cpp
(`build_rs`, `build_qkv` without reshape, `build_attn` expanding Q, V, K in that order,
`build_moe_ffn`). While the scheduler reserves (no data yet) ggml-alloc never runs an op in place
on a view (`ggml_gallocr_allocate_node`: the view's data is not set, "external"), but tries the
op's other sources. The post-norm hidden state (`t_h_nextn`) is a graph output, never freed.
Checked node by node against an instrumented ggml-alloc of the pinned build."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from moeconf.memory.replay import CPU, GPU, Graph, device_runs, host_layers, split_experts

if TYPE_CHECKING:
    from moeconf.memory.geometry import Geometry
    from moeconf.placement import Placement


# a layer's routed experts on the CPU, as bits: gate, up, down (ALL_CPU: the whole layer's)
GATE_CPU, UP_CPU, DOWN_CPU = 1, 2, 4
ALL_CPU = GATE_CPU | UP_CPU | DOWN_CPU


@dataclass(frozen=True)
class HybridShape:
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    d_conv: int
    d_inner: int  # value heads x state width
    d_state: int
    n_group: int  # key heads
    n_v_heads: int
    recurrent: tuple[bool, ...]  # per layer
    experts_cpu: tuple[int, ...]  # per layer: which of its routed experts run on the CPU (GATE_CPU | UP_CPU | DOWN_CPU)
    n_tokens: int
    n_kv: int
    first: int = 0
    last: int = -1  # -1: every layer from `first` on, and the output
    after_cpu: bool = False  # the layer before `first` ran wholly on the CPU
    # Qwen3-Next (src/models/qwen3next.cpp): beta and alpha from one projection (`ssm_ba`, each
    # made contiguous), q and k repeated to the value heads before the fused op, plain RoPE (one
    # position per token); Qwen3.5-MoE: separate projections, no repeat, M-RoPE (four)
    qwen3next: bool = False
    n_seqs: int = 1  # sequences in the worst-case ubatch (n_seq_max): one state row set each
    # Hadamard rotations of Q/K and V for a quantized cache (src/llama-kv-cache.cpp, `attn_rot_k`,
    # `attn_rot_v`: a quantized type and a head width that is a multiple of 64): the rotation
    # matrix's side, 0 when off (src/llama-graph.cpp `build_attn`, `llama_mul_mat_hadamard`)
    rot_k: int = 0
    rot_v: int = 0
    n_outputs: int = 0  # the rows out_ids keeps for the logits (0: the ubatch; settings.n_outputs)


def hybrid_graph(s: HybridShape) -> Graph:
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    used = s.n_expert_used
    n_layer = len(s.recurrent)
    last = n_layer if s.last < 0 else s.last
    whole = s.first == 0 and last == n_layer
    leaves: dict[str, int] = {}
    k_dim = s.n_group * s.d_state
    chans = s.d_inner + 2 * k_dim
    n_embd_r = (s.d_conv - 1) * chans
    n_embd_s = s.d_state * s.d_inner

    def graph_input(name: str, size: int) -> int:
        if whole and name not in leaves:
            leaves[name] = g.leaf(size, CPU)
        return g.input(name, size, leaves.get(name, -1))

    def moe_sum(down: int, weights: int) -> int:
        weighted = g.op(e * used * f, down, weights, inplace=True)
        moe = g.op(e * f, g.view(weighted), g.view(weighted))
        for _ in range(used - 2):
            moe = g.op(e * f, moe, g.view(weighted), inplace=True)
        return moe

    def shared_tail(moe: int, sh: int, x_gate: int) -> int:
        sg = g.op(f, x_gate)  # the shared expert's gate: a 1-wide matmul, its sigmoid in place
        sg = g.op(f, sg, inplace=True)
        sh = g.op(e * f, sh, sg, inplace=True)
        return g.op(e * f, moe, sh, inplace=True)

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
        inp = -1
    else:
        # the CPU layer's weightless tail runs here ("expand GPU up"): the shared expert's gate
        # sigmoid, its weighting, the sum with the routed experts' output and the residual add,
        # on copies of their sources
        sg = g.input("shared_gate", f)
        sh = g.input("shexp", e * f)
        moe = g.input("moe_out", e * f)
        ffn_inp = g.input("ffn_inp", e * f)
        sg = g.op(f, sg, inplace=True)
        sh = g.op(e * f, sh, sg, inplace=True)
        out = g.op(e * f, moe, sh, inplace=True)
        inp = g.op(e * f, out, ffn_inp, inplace=True)
    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4  # the copy of the chosen ids (a strided view)

    hq, hkv, hv = s.n_head * s.head_k, s.n_head_kv * s.head_k, s.n_head_kv * s.head_v
    for il in range(s.first, last):
        norm = g.input("norm", e * f) if inp < 0 else g.op(e * f, inp, inplace=True)
        cur = g.op(e * f, norm, inplace=True)  # attn_norm
        if s.recurrent[il]:
            ns = s.n_seqs
            s_copy = graph_input("s_copy_main", 4 * ns)
            extra = g.zero_input("s_copy_extra")  # the other sequences' rows: none in the reserve
            conv_rows = g.op(n_embd_r * 4 * ns, s_copy)  # GET_ROWS of the conv state
            g.op(0, g.zero(extra))  # GET_ROWS of no extra rows, copied into the state
            qkv = g.op(chans * f, cur)
            conv_in = g.op((T + (s.d_conv - 1) * ns) * chans * 4, g.view(conv_rows), g.view(qkv))  # CONCAT
            g.op(0, g.view(conv_in))  # the last columns copied into the state
            state = g.op(n_embd_s * 4 * ns, s_copy)  # GET_ROWS of the delta-net state
            g.op(0, g.zero(extra))
            conv = g.op(chans * f, conv_in)  # SSM_CONV
            conv = g.op(chans * f, conv, inplace=True)  # SILU
            rep = s.n_v_heads // max(s.n_group, 1) if s.qwen3next else 1
            q = g.op(k_dim * f, g.view(conv))
            q = g.op(k_dim * f, q, inplace=True)
            if rep > 1:
                q = g.op(rep * k_dim * f, g.view(q))  # REPEAT to the value heads
            k = g.op(k_dim * f, g.view(conv))
            k = g.op(k_dim * f, k, inplace=True)
            if rep > 1:
                k = g.op(rep * k_dim * f, g.view(k))
            if s.qwen3next:
                ba = g.op(2 * s.n_v_heads * f, cur)
                gate = g.op(s.n_v_heads * f, g.view(ba))  # CONT of alpha
                gate = g.op(s.n_v_heads * f, gate, inplace=True)  # + dt bias
                gate = g.op(s.n_v_heads * f, gate, inplace=True)  # softplus
                gate = g.op(s.n_v_heads * f, gate, inplace=True)  # * A
                beta = g.op(s.n_v_heads * f, g.view(ba))  # CONT of beta
                beta = g.op(s.n_v_heads * f, beta, inplace=True)  # sigmoid
            else:
                alpha = g.op(s.n_v_heads * f, cur)
                gate = g.op(s.n_v_heads * f, g.view(alpha))  # + dt bias
                gate = g.op(s.n_v_heads * f, gate, inplace=True)  # softplus
                gate = g.op(s.n_v_heads * f, gate, inplace=True)  # * A
                beta = g.op(s.n_v_heads * f, cur)
                beta = g.op(s.n_v_heads * f, g.view(beta))  # sigmoid
            res = g.op((s.d_inner * T + n_embd_s * ns) * 4, q, k, g.view(conv), g.view(gate), beta, g.view(state))
            g.op(0, g.view(res))  # the new state copied into the cache
            nrm = g.op(s.d_inner * f, g.view(res))  # RMS_NORM of the output
            nrm = g.op(s.d_inner * f, nrm, inplace=True)
            z = g.op(s.d_inner * f, cur)
            z = g.op(s.d_inner * f, g.view(z))  # SILU
            nrm = g.op(s.d_inner * f, nrm, z, inplace=True)
            o = g.view(g.op(e * f, nrm))  # ssm_out
        else:
            pos = graph_input("pos", (1 if s.qwen3next else 4) * f)  # M-RoPE: four positions per token
            qf = g.op(2 * hq * f, cur)  # query and its gate
            qn = g.op(hq * f, g.view(qf))
            qn = g.op(hq * f, qn, inplace=True)
            qn = g.op(hq * f, qn, pos, inplace=True)  # RoPE
            if s.rot_k:
                qn = g.op(hq * f, g.view(qn), graph_input("k_rot", 4 * s.rot_k * s.rot_k))
            v = g.op(hv * f, cur)
            if s.rot_v:
                v = g.op(hv * f, g.view(v), graph_input("v_rot", 4 * s.rot_v * s.rot_v))
            k = g.op(hkv * f, cur)
            k = g.op(hkv * f, g.view(k))  # RMS_NORM
            k = g.op(hkv * f, k, inplace=True)
            k = g.op(hkv * f, k, pos, inplace=True)
            if s.rot_k:
                k = g.op(hkv * f, g.view(k), graph_input("k_rot", 4 * s.rot_k * s.rot_k))
            g.op(0, g.view(k), graph_input("k_idxs", 8 * T))
            g.op(0, g.view(v), graph_input("v_idxs", 8 * T))
            attn = g.op(s.n_head * s.head_v * f, g.view(qn), graph_input("mask", 2 * T * s.n_kv))
            if s.rot_v:
                attn = g.op(s.n_head * s.head_v * f, g.view(attn), graph_input("v_rot", 4 * s.rot_v * s.rot_v))
            gt = g.op(hq * f, g.view(qf))  # CONT of the gate
            gt = g.op(hq * f, gt, inplace=True)  # sigmoid
            a = g.op(hq * f, g.view(attn), gt, inplace=True)
            o = g.op(e * f, a)  # wo
        res_in = g.input("l_out", e * f) if inp < 0 else inp
        ffn_inp = g.op(e * f, o, res_in, inplace=True)
        x = g.op(e * f, ffn_inp, inplace=True)
        x = g.op(e * f, x, inplace=True)  # post-attention norm
        ne = s.n_expert * f
        probs = g.op(ne, g.op(ne, x), inplace=True)
        probs_r = g.view(probs)
        topk = g.view(g.op(ne, probs))
        weights = g.view(g.op(used * f, probs_r, topk))
        wsum = g.op(f, g.op(f, weights), inplace=True)
        weights = g.view(g.op(used * f, weights, wsum, inplace=True))
        xr = g.view(x)
        ffe = s.n_ff_exp * used * f
        cpu = s.experts_cpu[il]
        if cpu == ALL_CPU:
            g.split(CPU)
            xc = g.input(("x", il), e * f, xr)
            tc = g.input(("topk", il), tk, topk)
            down = g.op(e * used * f, g.op(ffe, g.op(ffe, xc, tc), g.op(ffe, xc, tc)), tc)
            g.split(GPU)
            down = g.input(("down", il), e * used * f, down)
        elif cpu:
            down = split_experts(g, cpu, il, xr, topk, tk, e * f, ffe, e * used * f)  # replay.split_experts
        else:
            down = g.op(e * used * f, g.op(ffe, g.op(ffe, xr, topk), g.op(ffe, xr, topk)), topk)
        out = moe_sum(down, weights)
        ffs = s.n_ff_shexp * f
        sh = g.op(e * f, g.op(ffs, g.op(ffs, x), g.op(ffs, x)))
        out = shared_tail(out, sh, x)
        inp = g.op(e * f, out, ffn_inp, inplace=True)  # l_out
    if last == n_layer:
        x = g.op(e * f, g.op(e * f, inp, inplace=True), inplace=True, output=True)  # output norm (t_h_nextn)
        fo = 4 * (s.n_outputs or T)  # the output rows (llama-server reserves fewer)
        rows = g.op(e * fo, x, graph_input("out_ids", fo))
        g.op(s.n_vocab * fo, rows, output=True)
    else:
        g.op(0, g.op(e * f, inp))
        g.op(0, inp)
    g.finish()
    return g


@lru_cache(maxsize=512)
def hybrid_peak(s: HybridShape, alignment: int) -> int:
    """The GPU's compute buffer size."""
    return hybrid_graph(s).peaks((alignment, 32))[0]


def rotation(cache_type: str, head: int, k: bool) -> int:
    """The Hadamard rotation's side for a cache of this type and head width (0: none)."""
    from moeconf.memory.settings import is_quantized

    if not is_quantized(cache_type) or head % 64:
        return 0
    if not k:
        return 64
    n = 64
    while head % (2 * n) == 0:
        n *= 2
    return n


def replayed_hybrid(placement: Placement, geo: Geometry, out_dev: str, n_tokens: int, cells: int,
                    ctk: str = "f16", ctv: str = "f16", n_seqs: int = 1, n_outputs: int = 0,
                    dry: bool = False) -> dict[str, int]:
    """Each GPU's compute buffer by the replay above, for a GPU running one contiguous range of
    whole layers (its routed experts there or on the CPU), after the CPU's layers or another
    GPU's, and the output if it runs the last layer (as `estimate._replayed_moe` for Qwen3-MoE)."""
    from collections import defaultdict

    import moeconf.memory.recurrent as rec
    from moeconf.engines import AUTO_GPU

    inv = placement.inventory
    rs = rec.shape(inv)
    n_layer = len(geo.layers)
    if (rs is None or geo.swa_type != "none" or geo.mla or geo.n_expert_used < 2 or not geo.n_ff_exp
            or not geo.n_ff_shexp or not n_layer or [la.index for la in geo.layers] != list(range(n_layer))):
        return {}
    home: dict[int, set[str | None]] = defaultdict(set)
    routed: dict[int, set[str | None]] = defaultdict(set)
    for t in inv.tensors:
        il = t.layer
        if il is None or il >= n_layer:
            continue
        if t.base == "ffn_gate_up_exps":
            return {}
        (routed if t.base in _ROUTED else home)[il].add(placement.devices[t.name])
    heads = {(la.n_head, la.n_head_kv, la.head_k, la.head_v) for la in geo.layers if not la.recurrent}
    if len(heads) != 1:
        return {}
    dev_of: list[str] = []
    experts: list[int] = []
    for il in range(n_layer):
        if len(home[il]) != 1:
            return {}
        d = next(iter(home[il]))
        if d is None or d == AUTO_GPU or not routed[il] <= {d, "CPU"}:
            return {}
        where = [placement.devices.get(f"blk.{il}.{b}.weight") for b in _ROUTED]
        if any(w is None for w in where):
            return {}
        experts.append(sum(bit for bit, w in zip((GATE_CPU, UP_CPU, DOWN_CPU), where, strict=True) if w == "CPU"))
        dev_of.append(d)
    n_head, n_head_kv, head_k, head_v = heads.pop()
    runs = device_runs(dev_of)
    out: dict[str, int] = {}
    for i, (d, first, last) in enumerate(runs):
        if d == "CPU" or sum(r[0] == d for r in runs) != 1:
            continue
        if last == n_layer:
            if out_dev != d or any(placement.devices.get(n) != d for n in ("output_norm.weight", "output.weight")
                                   if n in inv.by_name):
                continue
        elif runs[i + 1][0] == "CPU" or out_dev == d:
            continue
        after_cpu = first > 0 and dev_of[first - 1] == "CPU"
        if after_cpu and experts[first - 1] != ALL_CPU:
            continue
        shape = HybridShape(
            n_embd=geo.n_embd, n_vocab=geo.n_vocab, n_head=n_head, n_head_kv=n_head_kv, head_k=head_k,
            head_v=head_v, n_expert=geo.n_expert, n_expert_used=geo.n_expert_used, n_ff_exp=geo.n_ff_exp,
            n_ff_shexp=geo.n_ff_shexp, d_conv=rs.d_conv, d_inner=rs.d_inner, d_state=rs.d_state,
            n_group=rs.n_group, n_v_heads=rs.n_v_heads, recurrent=tuple(la.recurrent for la in geo.layers),
            experts_cpu=tuple(experts), n_tokens=n_tokens, n_kv=cells,
            first=first, last=-1 if last == n_layer else last, after_cpu=after_cpu, qwen3next=inv.arch == "qwen3next",
            n_seqs=max(1, n_seqs), rot_k=rotation(ctk, head_k, True), rot_v=rotation(ctv, head_v, False),
            n_outputs=n_outputs,
        )
        out[d] = 0 if dry else hybrid_peak(shape, 128 if d.startswith(("CUDA", "ROCm", "MUSA")) else 32)
    return out


_ROUTED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def hybrid_host_graph(s: HybridHostShape) -> Graph:
    """The host's share of the hybrid graph where GPUs run every layer and the output and the CPU
    some of the routed experts, wholly or in part (as `replay.host_graph`, with the partial
    layers' CPU matmuls and copies as `hybrid_graph.split_experts` places them)."""
    g = Graph()
    T = s.n_tokens
    f = 4 * T
    e = s.n_embd
    used = s.n_expert_used
    tk = (used - 1) * 4 + (T - 1) * s.n_expert * 4 + 4
    ffe = s.n_ff_exp * used * f
    for il, gpu, cpu in host_layers(g, s.layers, e, T, e, s.n_outputs):
        if not cpu:
            continue
        here = gpu

        def on(buf: int) -> None:
            nonlocal here
            if here != buf:
                g.split(buf)
                here = buf

        gate_buf = CPU if cpu & GATE_CPU else gpu
        up_buf = CPU if cpu & UP_CPU else gpu
        down_buf = CPU if cpu & DOWN_CPU else gpu
        act_buf = CPU if up_buf == CPU and down_buf == CPU else gpu
        outs: dict[str, int] = {}
        for name, buf in (("gate", gate_buf), ("up", up_buf)):
            on(buf)
            if buf == CPU:
                outs[name] = g.op(ffe, g.input(("x", il), e * f), g.input(("topk", il), tk))
        on(act_buf)
        if act_buf == CPU:
            srcs = [outs[n] if n in outs else g.input((n, il), ffe) for n in ("gate", "up")]
            outs["act"] = g.op(ffe, *srcs)
        elif "gate" in outs or "up" in outs:
            for n in ("gate", "up"):
                if n in outs:
                    g.input((n, il), ffe, outs[n])  # copied to the GPU
        on(down_buf)
        if down_buf == CPU:
            act = outs["act"] if "act" in outs else g.input(("act", il), ffe)
            down = g.op(e * used * f, act, g.input(("topk", il), tk))
            on(gpu)
            g.input(("down", il), e * used * f, down)
        on(gpu)
    g.finish()
    return g


@dataclass(frozen=True)
class HybridHostShape:
    n_embd: int
    n_tokens: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    # per layer: the GPU running it (1, 2, ...), the graph inputs it reads (name, bytes), which of
    # its routed experts run on the CPU (GATE_CPU | UP_CPU | DOWN_CPU)
    layers: tuple[tuple[int, tuple[tuple[str, int], ...], int], ...]
    n_outputs: int = 0  # the output rows (0: the ubatch; settings.n_outputs)


@lru_cache(maxsize=256)
def hybrid_host_peak(s: HybridHostShape) -> int:
    bufs = max(CPU, *(dev for dev, _, _ in s.layers)) + 1
    return hybrid_host_graph(s).peaks(tuple([32] * bufs))[CPU]


def replayed_hybrid_host(placement: Placement, geo: Geometry, out_dev: str, n_tokens: int, cells: int,
                         n_seqs: int = 1, n_outputs: int = 0) -> int | None:
    """The host's compute buffer for a hybrid whose layers all run on GPUs (the output too) and
    whose routed experts run wholly or partly on the CPU; None elsewhere."""
    from collections import defaultdict

    from moeconf.engines import AUTO_GPU

    inv = placement.inventory
    n_layer = len(geo.layers)
    if (not n_layer or not geo.n_ff_exp or out_dev == "CPU" or placement.devices.get("token_embd.weight") != "CPU"
            or [la.index for la in geo.layers] != list(range(n_layer))):
        return None
    home: dict[int, set[str | None]] = defaultdict(set)
    for t in inv.tensors:
        if t.layer is not None and t.layer < n_layer and t.base not in _ROUTED:
            home[t.layer].add(placement.devices[t.name])
    f = 4 * n_tokens
    buffers: dict[str, int] = {}
    layers = []
    for la in geo.layers:
        il = la.index
        if len(home[il]) != 1:
            return None
        dev = next(iter(home[il]))
        where = [placement.devices.get(f"blk.{il}.{b}.weight") for b in _ROUTED]
        if dev is None or dev in ("CPU", AUTO_GPU) or any(w not in (dev, "CPU") for w in where):
            return None
        buffers.setdefault(dev, 0 if not buffers else len(buffers) + 1)  # buffer 1 is the host's
        if la.recurrent:
            reads: tuple[tuple[str, int], ...] = (("s_copy", 4 * max(1, n_seqs)),)
        else:
            pos = f * (1 if inv.arch == "qwen3next" else 4)
            reads = (("pos", pos), ("k_idxs", 8 * n_tokens), ("v_idxs", 8 * n_tokens), ("mask", 2 * n_tokens * cells))
        cpu = sum(bit for bit, w in zip((GATE_CPU, UP_CPU, DOWN_CPU), where, strict=True) if w == "CPU")
        layers.append((buffers[dev], reads, cpu))
    if not any(cpu for _, _, cpu in layers):
        return None
    shape = HybridHostShape(geo.n_embd, n_tokens, geo.n_expert, geo.n_expert_used, geo.n_ff_exp, tuple(layers),
                            n_outputs)
    return hybrid_host_peak(shape)
