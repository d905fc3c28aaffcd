"""Kimi-Linear's (`kimi-linear`) KDA layers in the phase model of `estimate`, which a search runs
without the engine's graph (`estimate(replay=False)`); the estimate itself takes every compute
buffer from the graph (memory/graph/archs/kimi_linear.py).

Facts (llama.cpp 0.3.36, src/models/kimi-linear.cpp `graph` and `causal_conv1d`,
src/models/delta-net-base.cpp `build_delta_net_fused`): a KDA layer projects Q, K and V separately
and runs each through the concat of its conv state rows, SSM_CONV and SiLU, so Q, K and V (heads x
head_dim each) are alive together with the L2-normed copies of Q and K, the gate g1 (heads x
head_dim), the delta state rows read for the ubatch and the fused op's result (per-token output +
the new state). Measured with an instrumented ggml-alloc at -ub 512: 70.06 MiB alive at the fused
op's result on Kimi-Linear-48B-A3B; this gives 69.0."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moeconf.memory.recurrent import KdaShape


def layer_activations(ks: KdaShape, n_embd: int, n_tokens: int, n_seqs: int = 1) -> int:
    """Bytes alive at a KDA layer's peak: the layer input and its norm, Q, K and V after their
    convolutions, the L2-normed Q and K, g1, the state rows read and the fused op's result."""
    f4 = 4 * n_tokens
    state = ks.n_embd_s * 4 * max(1, n_seqs)
    return f4 * (2 * n_embd + 7 * ks.d_inner) + 2 * state
