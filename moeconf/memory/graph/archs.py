"""Each architecture's graph as a composition of the blocks (`blocks.GraphContext`), mirroring
its src/models/<arch>.cpp in the pinned llama.cpp. The registry `ARCHS` is the only place an
architecture's name is read: an architecture whose layers are the classic decoder's (a norm,
attention through the KV cache, a dense or MoE FFN, the residuals) is one `Decoder` row; one that
differs is one function here.

What a layer holds (biases, Q/K norms, a shared expert and its gate, a selection bias, fused
experts, rope factors) is read from the model's tensors, as the engine's loader creates them;
what the graph does with them (the gating function, whether the chosen weights are normalised,
which scales and clamps run) is the row's, or the GGUF key the architecture's loader reads
(`Facts`: a float key's presence stands for a value that is not 0 or 1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from moeconf.memory.graph.blocks import AttnInput, GraphContext, RsInput
from moeconf.memory.graph.ggml import OUTPUT, Tensor


@dataclass(frozen=True)
class Facts:
    """What a composition reads from the GGUF beyond the tensors."""

    gating: int | None = None  # expert_gating_func (1 softmax, 2 sigmoid, 3 softmax of the chosen)
    norm_w: int | None = None  # expert_weights_norm
    floats: frozenset[str] = frozenset()  # the float `{arch}.*` keys present (scales, clamps)
    groups: tuple[int, int] = (0, 0)  # expert_group_count, expert_group_used_count
    units: frozenset[str] = frozenset()  # the float `{arch}.*` keys present whose value is 0 or 1


@dataclass(frozen=True)
class Decoder:
    """The classic decoder layer (src/models/llama.cpp, qwen3moe.cpp, qwen2moe.cpp, olmoe.cpp,
    granite.cpp, phi3.cpp, dbrx.cpp, minimax-m2.cpp).

    norm: "rms" or "layer" (LLM_NORM). qk_norm: "head" (per head before RoPE, Qwen3), "full" (over
    the projection before the reshape, OLMoE, MiniMax-M2), "" none. q_scale: Q scaled after RoPE
    (Phi-3). clamp_key: the key whose presence clamps Q, K, V (DBRX's attention.clamp_kqv).
    ffn_norm: the FFN norm's tensor. gating / gating_key: the router's function and whether
    `expert_gating_func` overrides it; norm_w / norm_w_key likewise for the weights' normalisation.
    shexp_gate: how the shared expert's gate applies ("silu_div": x * silu(g)/g, Qwen2-MoE).
    granite: embedding, residual and logit scales where their keys are present. residual_first:
    the FFN's residual is the ADD's first source (Phi-3)."""

    norm: str = "rms"
    qk_norm: str = ""
    q_scale: bool = False
    clamp_key: str = ""
    ffn_norm: str = "ffn_norm"
    gating: str = "softmax"
    gating_key: bool = False
    norm_w: bool = True
    norm_w_key: bool = False
    shexp_gate: str = ""
    granite: bool = False
    residual_first: bool = False
    mrope: bool = False  # multi-section RoPE: four positions per token (Qwen3-VL)
    deepstack: bool = False  # the first layers add back slices of the wider input embedding (Qwen3-VL)


_GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def decoder(spec: Decoder) -> Callable[[GraphContext, Facts], None]:
    def build(g: GraphContext, facts: Facts) -> None:
        c, w, hp = g.ctx, g.w, g.hp
        rms = spec.norm == "rms"
        inp = g.inp_embd(_need(w.get("token_embd.weight")))
        pos = g.inp_pos(4 if spec.mrope else 1)
        attn_in = g.attn_inp_kv()
        out_ids = g.inp_out_ids()
        gating = _GATING.get(facts.gating or 0, spec.gating) if spec.gating_key else spec.gating
        norm_w = bool(facts.norm_w) if spec.norm_w_key and facts.norm_w is not None else spec.norm_w
        w_scale = "expert_weights_scale" in facts.floats
        res_scale = spec.granite and "residual_scale" in facts.floats
        clamp = bool(spec.clamp_key) and spec.clamp_key in facts.floats
        freqs = w.get("rope_freqs.weight")
        g.groups = facts.groups  # read for every architecture (llama-model.cpp)
        for il in range(hp.n_layer):
            res = inp
            cur = g.norm(inp, w.layer(il, "attn_norm"), w.layer(il, "attn_norm", "bias"), il, rms)
            n_head, n_kv = hp.n_head[il], hp.n_head_kv[il]
            if spec.qk_norm == "full":
                q, k, v = g.qkv(il, cur, n_head, n_kv, hp.head_k, hp.head_v, clamp, reshape=False)
                q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
                k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
                T = cur.ne[1]
                q, k, v = (c.reshape(q, hp.head_k, n_head, T), c.reshape(k, hp.head_k, n_kv, T),
                           c.reshape(v, hp.head_v, n_kv, T))
            else:
                q, k, v = g.qkv(il, cur, n_head, n_kv, hp.head_k, hp.head_v, clamp)
                if spec.qk_norm == "head" and w.layer(il, "attn_q_norm") is not None:
                    q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
                    k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
            q = c.rope(q, pos, freqs)
            k = c.rope(k, pos, freqs)
            if spec.qk_norm == "head_after_rope":
                k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
                q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
            if spec.q_scale:
                q = c.scale(q)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
            if il == hp.n_layer - 1:
                cur = c.get_rows(cur, out_ids)
                res = c.get_rows(res, out_ids)
            if res_scale:
                cur = c.scale(cur)
            ffn_inp = c.add(cur, res)
            cur = g.norm(ffn_inp, w.layer(il, spec.ffn_norm), w.layer(il, spec.ffn_norm, "bias"), il, rms)
            if w.layer(il, "ffn_gate_inp") is None:
                gate = w.layer(il, "ffn_gate")
                cur = g.ffn(cur, w.layer(il, "ffn_up"), gate, w.layer(il, "ffn_down"), il,
                            act="silu" if gate is not None else "swiglu",
                            up_b=w.layer(il, "ffn_up", "bias"), gate_b=w.layer(il, "ffn_gate", "bias"),
                            down_b=w.layer(il, "ffn_down", "bias"))
            else:
                cur = _moe(g, spec, il, cur, gating, norm_w, w_scale)
            if res_scale:
                cur = c.scale(cur)
            cur = c.add(ffn_inp, cur) if spec.residual_first else c.add(cur, ffn_inp)
            n_deep = hp.n_embd_inp // hp.n_embd - 1 if spec.deepstack and hp.n_embd_inp else 0
            if il < n_deep and g.t_inp_embd is not None:
                t = g.t_inp_embd
                cur = c.add(cur, c.view(t, (hp.n_embd, t.ne[1]), (t.nb[1],), (il + 1) * hp.n_embd * 4))
            inp = cur
        cur = g.norm(inp, w.get("output_norm.weight"), w.get("output_norm.bias"), -1, rms)
        logits = g.mm(_need(w.get("output.weight")), cur)
        out_b = w.get("output.bias")
        if out_b is not None:
            logits = c.add(logits, out_b)
        if spec.granite and "logit_scale" in facts.floats:
            logits = c.scale(logits)
        g.finish(cur, logits)

    return build


def _moe(g: GraphContext, spec: Decoder, il: int, cur: Tensor, gating: str, norm_w: bool, w_scale: bool) -> Tensor:
    """build_moe_ffn, then a shared expert (gated where the model has its gate) added to it."""
    c, w = g.ctx, g.w
    moe = g.moe_ffn(cur, il, gating=gating, norm_w=norm_w, w_scale=2.0 if w_scale else 0.0,
                    probs_bias=w.layer(il, "exp_probs_b", "bias"), groups=g.groups)
    if w.layer(il, "ffn_up_shexp") is None:
        return moe
    gate_inp = w.layer(il, "ffn_gate_inp_shexp")
    gate = None
    if gate_inp is not None and spec.shexp_gate == "silu_div":
        logits = g.mm(gate_inp, cur)
        gate = c.div(c.unary(logits, "silu"), logits)
    sh = g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"), w.layer(il, "ffn_down_shexp"), il)
    if gate is not None:
        sh = c.mul(sh, gate)
    return c.add(moe, sh)


def gpt_oss(g: GraphContext, facts: Facts) -> None:
    """src/models/openai-moe.cpp: sliding-window and full layers through the iSWA cache pair, the
    attention sinks, the router's bias, biased experts with the clamped SwiGLU, the chosen logits
    softmaxed; the last layer's output is a graph output (t_h_nextn), its rows taken after the loop."""
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(_need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    full, swa = g.attn_inp_kv_iswa()
    out_ids = g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        q = c.rope(q, pos)
        k = c.rope(k, pos)
        cur = g.attn(swa if g.swa_layers.get(il) else full, il, w.layer(il, "attn_output"),
                     w.layer(il, "attn_output", "bias"), q, k, v, sinks=w.layer(il, "attn_sinks"), iswa=True)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "post_attention_norm"), None, il)
        cur = g.moe_ffn(cur, il, gating="softmax_weight", norm_w=False, act="swiglu_oai",
                        gate_inp_b=w.layer(il, "ffn_gate_inp", "bias"))
        inp = c.add(cur, ffn_inp)
    inp.flags |= OUTPUT  # t_h_nextn
    cur = c.get_rows(inp, out_ids)
    cur = g.norm(cur, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(_need(w.get("output.weight")), cur))
    del facts


def deepseek2(g: GraphContext, facts: Facts) -> None:
    """src/models/deepseek2.cpp: the low-rank Q (or a plain Q on the lite models) and the compressed
    KV; with MLA (key_length_mla in the GGUF) the absorbed queries against the latent K-only cache
    (V a view of it, decompressed by wv_b), else the decompressed heads through a full KV cache; then
    dense leading layers or the MoE with its shared expert."""
    c, w, hp = g.ctx, g.w, g.hp
    d = g.mla
    inp = g.inp_embd(_need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_in = g.attn_inp_k() if d.absorbed else g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    gating = _GATING.get(facts.gating or 0, "softmax")
    g.groups = facts.groups
    nope = d.head_k - d.rope
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        T, n_head = cur.ne[1], hp.n_head[il]
        if w.layer(il, "attn_q") is None:
            q = c.mul_mat(_need(w.layer(il, "attn_q_a")), cur)
            q = g.norm(q, w.layer(il, "attn_q_a_norm"), None, il)
            q = c.mul_mat(_need(w.layer(il, "attn_q_b")), q)
        else:
            q = c.mul_mat(_need(w.layer(il, "attn_q")), cur)
        q = c.reshape(q, d.head_k, n_head, T)
        kv_pe = c.mul_mat(_need(w.layer(il, "attn_kv_a_mqa")), cur)
        row = kv_pe.nb[1]
        kv_cmpr = c.view(kv_pe, (d.kv_lora_rank, T), (row,), 0)
        k_pe = c.view(kv_pe, (d.rope, 1, T), (row, row), 4 * d.kv_lora_rank)
        k_pe = c.rope(k_pe, pos)
        kv_cmpr = g.norm(kv_cmpr, w.layer(il, "attn_kv_a_norm"), None, il)
        if d.absorbed:
            q_nope = c.view(q, (nope, n_head, T), (q.nb[1], q.nb[2]), 0)
            q_pe = c.rope(c.view(q, (d.rope, n_head, T), (q.nb[1], q.nb[2]), 4 * nope), pos)
            absorbed = c.permute(c.mul_mat(_need(w.layer(il, "attn_k_b")), c.permute(q_nope, 0, 2, 1, 3)), 0, 2, 1, 3)
            q_cur = c.concat(absorbed, q_pe, 0)
            kv_cmpr = c.reshape(kv_cmpr, d.kv_lora_rank, 1, T)
            k_cur = c.concat(kv_cmpr, k_pe, 0)
            cur = g.attn_k(attn_in, il, w.layer(il, "attn_output"), q_cur, k_cur, kv_cmpr, w.layer(il, "attn_v_b"))
        else:
            kv = c.mul_mat(_need(w.layer(il, "attn_kv_b")), kv_cmpr)
            step = 4 * (nope + d.head_v)
            k_nope = c.view(kv, (nope, n_head, T), (step, step * n_head), 0)
            v_cur = c.cont(c.view(kv, (d.head_v, n_head, T), (step, step * n_head), 4 * nope))
            q_cur = c.rope(q, pos)
            k_cur = c.concat(k_nope, c.repeat(k_pe, d.rope, n_head, T, 1), 0)
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q_cur, k_cur, v_cur)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        else:
            cur = _moe(g, Decoder(), il, cur, gating, bool(facts.norm_w), "expert_weights_scale" in facts.floats)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, c.mul_mat(_need(w.get("output.weight")), cur))


def llama4(g: GraphContext, facts: Facts) -> None:
    """src/models/llama4.cpp: chunked layers with RoPE (and an L2 norm of Q and K unless the model
    has 128 experts), full layers without RoPE, their queries scaled by the temperature input; the
    iSWA cache pair unless the GGUF turns the chunking off; MoE layers routing one expert by the
    sigmoid of its logit, applied to the experts' input, and a shared expert; dense layers between."""
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(_need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_scale = g.ctx.input("F32", 1, 1, g.n_tokens, name="inp_attn_scale")
    chunked = any(g.swa_layers.values())
    full, swa = g.attn_inp_kv_iswa() if chunked else (g.attn_inp_kv(), None)
    out_ids = g.inp_out_ids()
    kq_norm = hp.n_expert != 128
    freqs = w.get("rope_freqs.weight")
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        use_rope = not chunked or (il + 1) % 4 != 0
        if use_rope:
            q, k = c.rope(q, pos, freqs), c.rope(k, pos, freqs)
            if kq_norm:
                q, k = c.rms_norm(q), c.rms_norm(k)
        else:
            q = c.mul(q, attn_scale)
        inp_attn = swa if (swa is not None and g.swa_layers.get(il)) else full
        cur = g.attn(inp_attn, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v,
                     iswa=chunked)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        if w.layer(il, "ffn_gate_inp") is None:
            cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        else:
            moe = g.moe_ffn(cur, il, gating="sigmoid", norm_w=False, weight_before=True,
                            w_scale=2.0 if "expert_weights_scale" in facts.floats else 0.0)
            sh = g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"), w.layer(il, "ffn_down_shexp"),
                       il)
            cur = c.add(moe, sh)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(_need(w.get("output.weight")), cur))


def arctic(g: GraphContext, facts: Facts) -> None:
    """src/models/arctic.cpp: the classic attention, then a dense FFN with its residual, and beside it
    the MoE on the layer's input (the attention's input, normed by ffn_norm_exps) added to that."""
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(_need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_in = g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(attn_in, il, w.layer(il, "attn_output"), None, q, k, v)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il)
        ffn_out = c.add(cur, ffn_inp)
        cur = g.norm(res, w.layer(il, "ffn_norm_exps"), None, il)
        cur = g.moe_ffn(cur, il, gating="softmax", norm_w=True)  # its loader reads no expert_weights_scale
        inp = c.add(cur, ffn_out)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    g.finish(cur, g.mm(_need(w.get("output.weight")), cur))
    del facts


def grok(g: GraphContext, facts: Facts) -> None:
    """src/models/grok.cpp: embeddings scaled (the loader's default scale unless the GGUF sets 0 or 1: a
    scale of exactly 1 is not told apart here), the KQ logits softcapped without flash attention, the
    attention's output normed before its residual, a GELU MoE (plus a dense GELU FFN where the layer has
    one, the two summed and scaled), normed after; the logits scaled and, where the GGUF sets
    final_logit_softcapping, softcapped."""
    c, w, hp = g.ctx, g.w, g.hp
    if "embedding_scale" not in facts.units:
        g.hp = hp = replace(hp, embedding_scale=1.0)
    g.kq_softcap = True
    inp = g.inp_embd(_need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_in = g.attn_inp_kv()
    out_ids = g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        q, k = c.rope(q, pos), c.rope(k, pos)
        cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
        if il == hp.n_layer - 1:
            cur = c.get_rows(cur, out_ids)
            res = c.get_rows(res, out_ids)
        cur = g.norm(cur, w.layer(il, "attn_output_norm"), None, il)
        ffn_inp = c.add(cur, res)
        cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), None, il)
        moe = g.moe_ffn(cur, il, gating="softmax", norm_w=True, act="gelu")  # no expert_weights_scale read
        if w.layer(il, "ffn_up") is not None:
            dense = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il, act="gelu")
            moe = c.scale(c.add(dense, moe))
        post = w.layer(il, "layer_output_norm") or w.layer(il, "post_ffw_norm")
        cur = g.norm(moe, post, None, il)
        inp = c.add(cur, ffn_inp)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    logits = c.scale(g.mm(_need(w.get("output.weight")), cur))
    if "final_logit_softcapping" in facts.floats:
        logits = c.scale(c.unary(c.scale(logits), "tanh"))
    g.finish(cur, logits)


def qwen3next(g: GraphContext, facts: Facts) -> None:
    """src/models/qwen3next.cpp: gated delta-net layers (the conv state and the recurrent state through
    build_rs, the short convolution, the L2-normed Q and K repeated to the value heads, the fused
    GATED_DELTA_NET op, its new state copied back, the gated norm) and full attention layers with a gated
    Q; a MoE with a sigmoid-gated shared expert; the output rows taken after the final norm."""
    _delta_net_hybrid(g, qwen35=False)
    del facts


def qwen35moe(g: GraphContext, facts: Facts) -> None:
    """src/models/qwen35moe.cpp: Qwen3-Next's layers with separate beta and alpha projections, Q and K
    not repeated to the value heads (the fused delta-net op broadcasts them: llama.cpp repeats them only
    where a fused GDN form is off; the dumps' devices have both), the gated Q a view without a reshape,
    multi-section RoPE (four positions per token)."""
    _delta_net_hybrid(g, qwen35=True)
    del facts


def _delta_net_hybrid(g: GraphContext, qwen35: bool) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(_need(w.get("token_embd.weight")))
    attn_in = g.attn_inp_kv()
    rs_in = g.rs_inp()
    pos = g.inp_pos(4 if qwen35 else 1)
    out_ids = g.inp_out_ids()
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        g.expand(cur)
        if il in g.rs:
            cur = _delta_net_layer(g, rs_in, cur, il, repeat=not qwen35)
        else:
            cur = _gated_attn_layer(g, attn_in, cur, pos, il, reshape=not qwen35)
        cur = c.add(cur, res)
        ffn_res = cur
        cur = g.norm(cur, w.layer(il, "post_attention_norm"), None, il)
        moe = g.moe_ffn(cur, il, gating="softmax", norm_w=True)
        if w.layer(il, "ffn_up_shexp") is not None:
            sh = g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"), w.layer(il, "ffn_down_shexp"),
                       il)
            gate = c.unary(g.mm(_need(w.layer(il, "ffn_gate_inp_shexp")), cur), "sigmoid")
            moe = c.add(moe, c.mul(sh, gate))
        inp = c.add(moe, ffn_res)
    cur = g.norm(inp, w.get("output_norm.weight"), None, -1)
    cur.flags |= OUTPUT  # t_h_nextn
    cur = c.get_rows(cur, out_ids)
    g.finish(cur, g.mm(_need(w.get("output.weight")), cur))


def _gated_attn_layer(g: GraphContext, attn_in: AttnInput, cur: Tensor, pos: Tensor, il: int,
                      reshape: bool) -> Tensor:
    c, w, hp = g.ctx, g.w, g.hp
    n_head, n_kv, hd, T = hp.n_head[il], hp.n_head_kv[il], hp.head_k, cur.ne[1]
    q_full, k, v = g.qkv(il, cur, n_head, n_kv, 2 * hd, hd, reshape=False)
    if reshape:
        q_full = c.reshape(q_full, 2 * hd, n_head, T, 1)
        q = c.view(q_full, (hd, n_head, T, 1), (q_full.nb[1], q_full.nb[2], q_full.nb[3]), 0)
        gate = c.view(q_full, (hd, n_head, T, 1), (q_full.nb[1], q_full.nb[2], q_full.nb[3]), hd * 4)
    else:
        q = c.view(q_full, (hd, n_head, T), (4 * 2 * hd, 4 * 2 * hd * n_head), 0)
        gate = c.view(q_full, (hd, n_head, T), (4 * 2 * hd, 4 * 2 * hd * n_head), hd * 4)
    k = c.reshape(k, hd, n_kv, T)
    v = c.reshape(v, hd, n_kv, T)
    q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
    k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
    q, k = c.rope(q, pos), c.rope(k, pos)
    cur = g.attn(attn_in, il, None, None, q, k, v)
    gate = c.unary(c.cont(gate, hd * n_head, T), "sigmoid")
    return g.mm(_need(w.layer(il, "attn_output")), c.mul(cur, gate))


def _delta_net_layer(g: GraphContext, rs_in: RsInput, cur: Tensor, il: int, repeat: bool) -> Tensor:
    """build_layer_attn_linear with llm_build_delta_net_base's conv state and recurrent attention (the
    fused op, no rollback snapshots)."""
    c, w, hp = g.ctx, g.w, g.hp
    rec = g.rec
    assert rec is not None
    T, n_seqs = cur.ne[1], rs_in.n_seqs
    hk, nk, nv = rec.d_state, rec.n_group, rec.n_v_heads
    hv = rec.d_inner // nv
    wqkv = w.layer(il, "attn_qkv")
    if wqkv is not None:
        qkv = c.reshape(g.mm(wqkv, cur), hk * nk * 2 + hv * nv, T, n_seqs)
        z = g.mm(_need(w.layer(il, "attn_gate")), cur)
    else:
        # the older conversions' single ssm_in projection (split into Q, K, V, Z by views) has no recorded dump
        raise NotImplementedError(f"blk.{il}.ssm_in (Qwen3-Next's older fused QKVZ projection) is not composed; "
                                  "the pinned converter writes attn_qkv and attn_gate")
    w_beta = w.layer(il, "ssm_beta")
    if w_beta is not None:  # Qwen3.5: separate beta and alpha projections
        beta = c.unary(c.reshape(g.mm(w_beta, cur), 1, nv, T, n_seqs), "sigmoid")
        alpha = c.reshape(g.mm(_need(w.layer(il, "ssm_alpha")), cur), nv, T, n_seqs)
    else:
        ba = g.mm(_need(w.layer(il, "ssm_ba")), cur)
        ba = c.reshape(ba, 2 * nv // nk, nk, T, n_seqs)
        per = nv // nk
        b = c.view(ba, (per, nk, T, n_seqs), (ba.nb[1], ba.nb[2], ba.nb[3]), 0)
        a = c.view(ba, (per, nk, T, n_seqs), (ba.nb[1], ba.nb[2], ba.nb[3]), per * 4)
        beta = c.reshape(c.unary(c.cont(b), "sigmoid"), 1, nv, T, n_seqs)
        alpha = c.cont(a, nv, T, n_seqs)
    alpha = c.unary(c.add(alpha, _need(w.layer(il, "ssm_dt", "bias"))), "softplus")
    gate = c.mul(alpha, _need(w.get(f"blk.{il}.ssm_a")))
    gate = c.reshape(gate, 1, nv, T, n_seqs)
    conv_all, ssm_all = g.rs[il]
    kernel = _need(w.layer(il, "ssm_conv1d"))
    d_conv, channels = kernel.ne[0], rec.conv_channels
    # build_conv_state
    conv = g.rs_states(rs_in, conv_all, rec.n_embd_r)
    conv = c.reshape(conv, d_conv - 1, channels, n_seqs)
    conv_in = c.concat(conv, c.transpose(qkv), 0)
    last = c.view(conv_in, (d_conv - 1, channels, n_seqs), (conv_in.nb[1], conv_in.nb[2]),
                  4 * (conv_in.ne[0] - conv.ne[0]))
    rows = (d_conv - 1) * channels
    g.expand(c.cpy(last, c.view(conv_all, (rows, n_seqs), (conv_all.nb[1],), 0)))
    state = g.rs_states(rs_in, ssm_all, rec.n_embd_s)
    state = c.reshape(state, hv, hv, nv, n_seqs)
    mix = c.unary(c.ssm_conv(conv_in, kernel), "silu")
    row = 4 * (hk * nk * 2 + hv * nv)
    q = c.view(mix, (hk, nk, T, n_seqs), (4 * hk, row, row * T), 0)
    k = c.view(mix, (hk, nk, T, n_seqs), (4 * hk, row, row * T), 4 * hk * nk)
    v = c.view(mix, (hv, nv, T, n_seqs), (4 * hv, row, row * T), 4 * 2 * hk * nk)
    q, k = c.scale(c.rms_norm(q)), c.scale(c.rms_norm(k))  # build_gdn_l2_norm
    if nk != nv and repeat:
        rep = nv // nk
        q = c.reshape(c.repeat(c.reshape(q, hk, 1, nk, T * n_seqs), hk, rep, nk, T * n_seqs), hk, nk * rep, T, n_seqs)
        k = c.reshape(c.repeat(c.reshape(k, hk, 1, nk, T * n_seqs), hk, rep, nk, T * n_seqs), hk, nk * rep, T, n_seqs)
    out = c.gated_delta_net(q, k, v, gate, beta, state)
    s_v, h_v = hv, nv
    output = c.view(out, (s_v, h_v, T, n_seqs), (4 * s_v, 4 * s_v * h_v, 4 * s_v * h_v * T), 0)
    new_state = c.view(out, (s_v, s_v, h_v, n_seqs), (4 * s_v, 4 * s_v * s_v, 4 * s_v * s_v * h_v),
                       4 * s_v * h_v * T * n_seqs)
    g.expand(c.cpy(new_state, c.view(ssm_all, (rec.n_embd_s, n_seqs), (ssm_all.nb[1],), 0)))
    z2 = c.reshape(z, hv, nv, T, n_seqs)
    normed = g.norm(output, w.layer(il, "ssm_norm"), None, il)
    cur = c.mul(normed, c.unary(z2, "silu"))
    cur = c.reshape(cur, hv * nv, T, n_seqs)
    cur = g.mm(_need(w.layer(il, "ssm_out")), cur)
    return c.reshape(cur, hp.n_embd, T * n_seqs)


def _need(t: Tensor | None) -> Tensor:
    assert t is not None
    return t


Build = Callable[[GraphContext, Facts], None]

# architecture -> its composition (src/models/<arch>.cpp)
ARCHS: dict[str, Build] = {
    "qwen3moe": decoder(Decoder(qk_norm="head")),
    "llama": decoder(Decoder()),  # Mixtral
    "qwen2moe": decoder(Decoder(norm_w=False, shexp_gate="silu_div")),
    "olmoe": decoder(Decoder(qk_norm="full", norm_w=False)),
    "granitemoe": decoder(Decoder(granite=True)),
    "phimoe": decoder(Decoder(q_scale=True, residual_first=True)),
    "dbrx": decoder(Decoder(norm="layer", clamp_key="attention.clamp_kqv", ffn_norm="attn_output_norm")),
    "minimax-m2": decoder(Decoder(qk_norm="full", gating_key=True)),
    "dots1": decoder(Decoder(qk_norm="head", gating="sigmoid", gating_key=True, norm_w=False, norm_w_key=True)),
    "ernie4_5-moe": decoder(Decoder()),
    "hunyuan-moe": decoder(Decoder(qk_norm="head_after_rope")),
    "bailingmoe2": decoder(Decoder(qk_norm="head", gating="sigmoid", gating_key=True, norm_w=False, norm_w_key=True)),
    "qwen3vlmoe": decoder(Decoder(qk_norm="head", mrope=True, deepstack=True)),
    "deepseek": decoder(Decoder(norm_w=False)),  # DeepSeek-MoE (v1)
    "bailingmoe": decoder(Decoder(norm_w=False, norm_w_key=True)),  # Ling (v1)
    "gpt-oss": gpt_oss,
    "deepseek2": deepseek2,
    "llama4": llama4,
    "arctic": arctic,
    "grok": grok,
    "qwen3next": qwen3next,
    "qwen35moe": qwen35moe,
    "glm4moe": decoder(Decoder(qk_norm="head", ffn_norm="post_attention_norm", gating="sigmoid", gating_key=True,
                               norm_w=False, norm_w_key=True)),
}
