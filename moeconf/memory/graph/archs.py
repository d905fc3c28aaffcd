"""Each architecture's graph as a composition of the blocks (`blocks.GraphContext`), mirroring
its src/models/<arch>.cpp in the pinned llama.cpp. The registry `ARCHS` is the only place an
architecture's name is read: a new architecture whose layers are the classic decoder's (norm,
attention through the KV cache, a dense or MoE FFN, the residuals) is one `Decoder` row; one that
differs is one function here.

What a layer holds (a Q/K norm, biases, a shared expert and its gate, a selection bias, fused
experts) is read from the model's tensors, as the engine's loader creates them; what the graph
does with them (the router's gating function, whether the chosen weights are normalised) is the
row's, or the GGUF key the architecture's loader reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import Tensor


@dataclass(frozen=True)
class Decoder:
    """The classic decoder layer (llama.cpp src/models/llama.cpp, qwen3moe.cpp and their kin).

    qk_norm: where the Q/K norms run: "head" (per head, after the reshape, before RoPE: Qwen3),
    "full" (over the whole projection before the reshape: OLMoE), "" none.
    gating: the router's gating function ("softmax", "sigmoid"); `gating_key`: the GGUF key
    (`{arch}.expert_gating_func`, 1 softmax, 2 sigmoid) overriding it where the loader reads it.
    norm_w: whether the chosen experts' weights are normalised; `norm_w_key` the key overriding it.
    shexp_gate: the shared expert's output multiplied by sigmoid(its gate) (`ffn_gate_inp_shexp`).
    """

    qk_norm: str = ""
    gating: str = "softmax"
    gating_key: bool = False
    norm_w: bool = True
    norm_w_key: bool = False
    scale_key: bool = True  # `{arch}.expert_weights_scale` read (a SCALE of the weights unless 1)
    norm: str = "rms"  # "layer": LayerNorm with bias (Phi-MoE)
    embedding_scale: bool = False  # Granite: the embeddings, residuals and logits scaled
    output_bias: bool = False


@dataclass(frozen=True)
class Facts:
    """What a composition reads from the GGUF beyond the tensors."""

    gating: int | None = None  # expert_gating_func
    norm_w: int | None = None  # expert_weights_norm
    scaled: bool = False  # expert_weights_scale present and not 1


def decoder(spec: Decoder) -> Callable[[GraphContext, Facts], None]:
    def build(g: GraphContext, facts: Facts) -> None:
        c, w, hp = g.ctx, g.w, g.hp
        rms = spec.norm == "rms"
        tok = w.get("token_embd.weight")
        assert tok is not None
        inp = g.inp_embd(tok)
        pos = g.inp_pos()
        attn_in = g.attn_inp_kv()
        out_ids = g.inp_out_ids()
        gating = spec.gating
        if spec.gating_key and facts.gating in (1, 2):
            gating = "softmax" if facts.gating == 1 else "sigmoid"
        norm_w = bool(facts.norm_w) if spec.norm_w_key and facts.norm_w is not None else spec.norm_w
        for il in range(hp.n_layer):
            res = inp
            cur = g.norm(inp, w.layer(il, "attn_norm"), w.layer(il, "attn_norm", "bias"), il, rms)
            n_head, n_kv = hp.n_head[il], hp.n_head_kv[il]
            if spec.qk_norm == "full":
                q, k, v = _qkv_full_norm(g, il, cur, n_head, n_kv)
            else:
                q, k, v = g.qkv(il, cur, n_head, n_kv, hp.head_k, hp.head_v)
                if spec.qk_norm == "head":
                    q = g.norm(q, w.layer(il, "attn_q_norm"), None, il)
                    k = g.norm(k, w.layer(il, "attn_k_norm"), None, il)
            q = c.rope(q, pos, w.get("rope_freqs.weight"))
            k = c.rope(k, pos, w.get("rope_freqs.weight"))
            cur = g.attn(attn_in, il, w.layer(il, "attn_output"), w.layer(il, "attn_output", "bias"), q, k, v)
            if il == hp.n_layer - 1:
                cur = c.get_rows(cur, out_ids)
                res = c.get_rows(res, out_ids)
            if spec.embedding_scale:
                cur = c.scale(cur)
            ffn_inp = c.add(cur, res)
            cur = g.norm(ffn_inp, w.layer(il, "ffn_norm"), w.layer(il, "ffn_norm", "bias"), il, rms)
            if w.layer(il, "ffn_gate_inp") is None:
                cur = g.ffn(cur, w.layer(il, "ffn_up"), w.layer(il, "ffn_gate"), w.layer(il, "ffn_down"), il,
                            up_b=w.layer(il, "ffn_up", "bias"), gate_b=w.layer(il, "ffn_gate", "bias"),
                            down_b=w.layer(il, "ffn_down", "bias"))
            else:
                moe = g.moe_ffn(cur, il, gating=gating, norm_w=norm_w, w_scale=2.0 if facts.scaled else 0.0,
                                probs_bias=w.layer(il, "exp_probs_b", "bias"))
                if w.layer(il, "ffn_up_shexp") is not None:
                    sh = g.ffn(cur, w.layer(il, "ffn_up_shexp"), w.layer(il, "ffn_gate_shexp"),
                               w.layer(il, "ffn_down_shexp"), il)
                    gate_inp = w.layer(il, "ffn_gate_inp_shexp")
                    if gate_inp is not None:
                        sh = c.mul(sh, c.unary(g.mm(gate_inp, cur), "sigmoid"))
                    moe = c.add(moe, sh)
                cur = moe
            if spec.embedding_scale:
                cur = c.scale(cur)
            cur = c.add(cur, ffn_inp)
            inp = cur
        out = w.get("output.weight")
        assert out is not None
        logits = g.output(inp, w.get("output_norm.weight"), out, w.get("output_norm.bias"), rms)
        if spec.output_bias and w.get("output.bias") is not None:
            raise NotImplementedError
        if spec.embedding_scale:
            raise NotImplementedError
        del logits

    return build


def _qkv_full_norm(g: GraphContext, il: int, cur: Tensor, n_head: int, n_kv: int) -> tuple[Tensor, Tensor, Tensor]:
    """OLMoE: Q and K normed over the whole projection, then reshaped per head."""
    c, w, hp = g.ctx, g.w, g.hp
    T = cur.ne[1]
    q = g.norm(g.mm(_need(w.layer(il, "attn_q")), cur), w.layer(il, "attn_q_norm"), None, il)
    k = g.norm(g.mm(_need(w.layer(il, "attn_k")), cur), w.layer(il, "attn_k_norm"), None, il)
    v = g.mm(_need(w.layer(il, "attn_v")), cur)
    return (c.reshape(q, hp.head_k, n_head, T), c.reshape(k, hp.head_k, n_kv, T), c.reshape(v, hp.head_v, n_kv, T))


def _need(t: Tensor | None) -> Tensor:
    assert t is not None
    return t


Build = Callable[[GraphContext, Facts], None]

# architecture -> its composition (src/models/<arch>.cpp)
ARCHS: dict[str, Build] = {
    "qwen3moe": decoder(Decoder(qk_norm="head", scale_key=False)),
    "llama": decoder(Decoder()),
}
