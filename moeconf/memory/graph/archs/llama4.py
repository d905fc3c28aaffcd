"""src/models/llama4.cpp: chunked layers with RoPE (and an L2 norm of Q and K unless the model
has 128 experts), full layers without RoPE, their queries scaled by the temperature input; the
iSWA cache pair unless the GGUF turns the chunking off; MoE layers routing one expert by the
sigmoid of its logit, applied to the experts' input, and a shared expert; dense layers between."""

from __future__ import annotations

from moeconf.memory.graph.archs.common import REPLAYED, Facts, need
from moeconf.memory.graph.blocks import GraphContext

ARCH = "llama4"
MEMORY = REPLAYED


def build(g: GraphContext, facts: Facts) -> None:
    c, w, hp = g.ctx, g.w, g.hp
    inp = g.inp_embd(need(w.get("token_embd.weight")))
    pos = g.inp_pos()
    attn_scale = g.ctx.input("F32", 1, 1, g.n_tokens, name="inp_attn_scale")
    chunked = any(g.swa_layers.values())
    full, swa = g.attn_inp_kv_iswa() if chunked else (g.attn_inp_kv(), None)
    out_ids = g.inp_out_ids()
    kq_norm = hp.n_expert != 128
    for il in range(hp.n_layer):
        res = inp
        cur = g.norm(inp, w.layer(il, "attn_norm"), None, il)
        q, k, v = g.qkv(il, cur, hp.n_head[il], hp.n_head_kv[il], hp.head_k, hp.head_v)
        use_rope = not chunked or (il + 1) % 4 != 0
        if use_rope:
            freqs = w.copy("rope_freqs.weight", il)
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
    g.finish(cur, g.mm(need(w.get("output.weight")), cur))
