"""Kimi-Linear's (`kimi-linear`) compute terms beside the phase model in `estimate`: its KDA
layers' activations, and where its MLA layers' queries land when the layer before returned its
routed experts' output from another device.

Facts (llama.cpp 0.3.36, src/models/kimi-linear.cpp `graph`, src/models/delta-net-base.cpp
`build_delta_net_fused`), checked against an instrumented ggml-alloc (AT_PRINTF) of the pinned
build on Kimi-Linear-48B-A3B:

- A KDA layer projects Q, K and V separately (`causal_conv1d`: a matmul, the concat of the conv
  state rows and the tokens, SSM_CONV, SiLU), so Q, K and V (heads x head_dim each) are alive
  together with their L2-normed copies of Q and K, the gate g1 (heads x head_dim, through
  softplus and A in place), the delta state rows read for the ubatch and the fused op's result
  (per-token output + the new state). Measured at -ub 512: 70.06 MiB at the fused op's result.
- An MLA layer's graph inputs (the mask, the K indices) are copied at the start of the first split
  that reads them. When the layer before ran its routed experts on another device (`-ot
  exps=CPU`), that split starts with the copy of the experts' output (n_expert_used x n_embd
  floats per token) above the residual stream, the router's scratch and the FFN input, and the
  mask lands above the copy; the layer's absorbed queries (heads x kv_lora_rank) and the
  concatenated queries (heads x (kv_lora_rank + rope)) go above the mask (measured on a GPU
  running layers 0-13 of Kimi-Linear-48B-A3B with its experts on the CPU: 150.05 MiB at -ub 512,
  where the phase model alone gives 129)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moeconf.memory.geometry import Geometry
    from moeconf.memory.recurrent import KdaShape
    from moeconf.placement import Placement

_ATTN = ("attn_q", "attn_kv_a_mqa", "attn_output")
_EXPERTS = ("ffn_down_exps", "ffn_up_exps")


def layer_activations(ks: KdaShape, n_embd: int, n_tokens: int, n_seqs: int = 1) -> int:
    """Bytes alive at a KDA layer's peak: the layer input and its norm, Q, K and V after their
    convolutions, the L2-normed Q and K, g1, the state rows read and the fused op's result."""
    f4 = 4 * n_tokens
    state = ks.n_embd_s * 4 * max(1, n_seqs)
    return f4 * (2 * n_embd + 7 * ks.d_inner) + 2 * state


def _dev(placement: Placement, il: int, bases: tuple[str, ...]) -> str | None:
    for b in bases:
        d = placement.devices.get(f"blk.{il}.{b}.weight")
        if d is not None:
            return d
    return None


def mla_after_copy(placement: Placement, geo: Geometry, n_tokens: int) -> dict[str, int]:
    """Per device: the peak (without the masks, which `estimate` adds as live) of its first MLA
    layer when the layer before it ran on the same device and returned its routed experts' output
    from another one (see the module's notes); absent where that does not happen."""
    f4 = 4 * n_tokens
    e = geo.n_embd
    seen: set[str] = set()
    out: dict[str, int] = {}
    prev = None
    for la in geo.layers:
        il = la.index
        a_dev = _dev(placement, il, _ATTN)
        if a_dev is None:
            prev = la
            continue
        if not la.recurrent and a_dev not in seen:
            seen.add(a_dev)
            if prev is not None and _dev(placement, prev.index, _ATTN) == a_dev:
                x_dev = _dev(placement, prev.index, _EXPERTS)
                if x_dev is not None and x_dev != a_dev:
                    r = geo.kv_lora_rank
                    copy = geo.n_expert_used * e
                    router = geo.n_expert + 2 * geo.n_expert_used + 1
                    queries = la.n_head * r + la.n_head * (r + geo.n_rot)
                    out[a_dev] = f4 * (2 * e + router + copy + e + queries)
        prev = la
    return out
