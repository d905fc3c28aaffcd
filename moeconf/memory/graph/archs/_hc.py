"""The hyper-connections DeepSeek-V4 and GLM-5.3-Flash build alike (`hc_pre`, `hc_post`, fused or by hand);
Hy4 and Qwen4Exp take its views and parts (docs/memory.md, "What the larger compositions build")."""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce

from moeconf.memory.graph.archs.common import need
from moeconf.memory.graph.blocks import GraphContext
from moeconf.memory.graph.ggml import Tensor


def fused(g: GraphContext, name: str, t: Tensor, il: int, record: bool = True) -> Tensor:
    """`t`, the fused op `name`, recorded (where `record`) for the engine's probe (`GraphContext.fused`)."""
    if record:
        g.fused.append((name, t, il))
    return t


def affine_part(g: GraphContext, mixes: Tensor, scale: Tensor, base: Tensor, k: int, start: int, n: int) -> Tensor:
    """The mixes' k-th affine part: their `n` values from `start`, times scale[k], plus base[start:start + n]."""
    c = g.ctx
    return c.add(c.mul(c.view(mixes, (n, mixes.ne[1]), (mixes.nb[1],), 4 * start), c.view(scale, (1,), (), 4 * k)),
                 c.view(base, (n,), (), 4 * start))


def sublayer_mixes(g: GraphContext, x: Tensor, il: int, part: str, hc: int) -> tuple[Tensor, Tensor, Tensor]:
    """A sublayer's (`part`'s) mixes of the streams `x` (RMS-normed, projected by hc_{part}_fn), its hc_{part}_scale
    and hc_{part}_base."""
    fn, scale, base = (need(g.w.layer(il, f"hc_{part}_{k}")) for k in ("fn", "scale", "base"))
    return hc_mixes(g, x, fn, hc), scale, base


def hc_pre(g: GraphContext, x: Tensor, il: int, part: str, hc: int, iters: int,
           record: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """build_hc_pre (docs/memory.md, "What the larger compositions build"): the mixed streams normed by the
    sublayer's {part}_norm, the post weights and the comb matrix (`record`: as `fused`)."""
    c = g.ctx
    mixes, scale, base = sublayer_mixes(g, x, il, part, hc)
    pre = c.scale(c.unary(affine_part(g, mixes, scale, base, 0, 0, hc), "sigmoid"))
    post = c.scale(c.unary(affine_part(g, mixes, scale, base, 1, hc, hc), "sigmoid"))
    unfused = g.cp.unfused
    if "DSV4_HC_COMB" not in unfused:
        comb = fused(g, "DSV4_HC_COMB", c.dsv4_hc_comb(mixes, scale, base, hc), il, record)
    else:
        comb = affine_part(g, mixes, scale, base, 2, 2 * hc, hc * hc)
        comb = sinkhorn(g, c.reshape(comb, hc, hc, x.ne[2]), iters)
    if "DSV4_HC_PRE" not in unfused:
        out = fused(g, "DSV4_HC_PRE", c.dsv4_hc_pre(x, pre), il, record)
    else:
        out = weighted(g, x, pre, hc)
    return g.norm(out, g.w.layer(il, f"{part}_norm"), None, il), post, comb


def head_weights(g: GraphContext, x: Tensor, hc: int) -> Tensor:
    """build_hc_head's weights, one per stream and token: a sigmoid of the affine part (output_hc_scale,
    output_hc_base) of the streams' mixes by output_hc_fn, scaled."""
    c, w = g.ctx, g.w
    mixes = hc_mixes(g, x, need(w.get("output_hc_fn.weight")), hc)
    scale, base = need(w.get("output_hc_scale.weight")), need(w.get("output_hc_base.weight"))
    return c.scale(c.unary(c.add(c.mul(mixes, scale), base), "sigmoid"))


def hc_mixes(g: GraphContext, x: Tensor, fn: Tensor, hc: int) -> Tensor:
    """The streams [n_embd, hc, tokens] RMS-normed as one row per token, projected by `fn`."""
    return g.mm(fn, g.ctx.rms_norm(g.ctx.reshape(x, x.ne[0] * hc, x.ne[2])))


def stream(g: GraphContext, x: Tensor, i: int) -> Tensor:
    """Stream `i` of the streams [n_embd, hc, tokens], a view [n_embd, tokens]."""
    return g.ctx.view(x, (x.ne[0], x.ne[2]), (x.nb[2],), i * x.nb[1])


def weight(g: GraphContext, w: Tensor, i: int) -> Tensor:
    """Stream `i`'s weights of the per-stream weights [hc, tokens], a view [1, tokens]."""
    return g.ctx.view(w, (1, w.ne[1]), (w.nb[1],), i * w.nb[0])


def concat(g: GraphContext, streams: Iterable[Tensor]) -> Tensor:
    """Tensors [n, 1, tokens] concatenated along their second axis into [n, k, tokens] (the hyper-connection
    streams; MiniMax-M3's per-stream attention outputs)."""
    return reduce(lambda a, b: g.ctx.concat(a, b, 1), streams)


def weighted(g: GraphContext, x: Tensor, pre: Tensor, hc: int) -> Tensor:
    """The streams weighted by `pre` (one weight per stream and token) and summed, by hand."""
    return reduce(g.ctx.add, (g.ctx.mul(stream(g, x, i), weight(g, pre, i)) for i in range(hc)))


def sinkhorn(g: GraphContext, comb: Tensor, iters: int) -> Tensor:
    """build_hc_sinkhorn: a softmax over the destinations, eps added, one column normalisation, then
    (iters - 1) row and column normalisations."""
    c = g.ctx
    comb = c.soft_max(comb)
    eps = c.fill(c.new("F32", 1))
    comb = c.add(comb, eps)

    def cols(m: Tensor) -> Tensor:
        s = c.add(c.sum_rows(c.cont(c.permute(m, 1, 0, 2, 3))), eps)
        return c.div(m, c.permute(s, 1, 0, 2, 3))

    comb = cols(comb)
    for _ in range(1, iters):
        comb = cols(c.div(comb, c.add(c.sum_rows(comb), eps)))
    return comb


def hc_post(g: GraphContext, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor, hc: int, il: int) -> Tensor:
    """build_hc_post, fused or by hand (docs/memory.md, "What the larger compositions build")."""
    c = g.ctx
    if "DSV4_HC_POST" not in g.cp.unfused:
        return fused(g, "DSV4_HC_POST", c.dsv4_hc_post(x, residual, post, comb), il)
    n_embd, T = x.ne[0], x.ne[1]

    def dst_stream(dst: int) -> Tensor:
        cur = c.mul(x, weight(g, post, dst))
        for src in range(hc):
            cur = c.add(cur, c.mul(stream(g, residual, src),
                                   c.view(comb, (1, T), (comb.nb[2],), dst * comb.nb[0] + src * comb.nb[1])))
        return c.reshape(cur, n_embd, 1, T)

    return concat(g, (dst_stream(dst) for dst in range(hc)))
