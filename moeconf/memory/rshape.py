"""The gated delta-net's sizes (the `ssm.*` keys), shared by the recurrent layers' memory (memory/recurrent.py)
and the graph blocks that build them (memory/graph/blocks.py), so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecurrentShape:
    d_conv: int  # ssm.conv_kernel
    d_inner: int  # ssm.inner_size (value heads x head width)
    d_state: int  # ssm.state_size (head width)
    n_group: int  # ssm.group_count (key heads)
    n_v_heads: int  # ssm.time_step_rank (value heads)

    @property
    def n_embd_r(self) -> int:
        return max(self.d_conv - 1, 0) * (self.d_inner + 2 * self.n_group * self.d_state)

    @property
    def n_embd_s(self) -> int:
        return self.d_state * self.d_inner

    def state_bytes(self, n_seq_max: int) -> int:
        """One recurrent layer's conv + delta-net state, F32, for `n_seq_max` sequences."""
        return (self.n_embd_r + self.n_embd_s) * 4 * max(1, n_seq_max)
