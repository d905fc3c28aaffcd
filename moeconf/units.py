"""Byte units and their text forms, shared by every layer (a leaf: imports nothing of moeconf)."""

from __future__ import annotations

MIB = 1024 * 1024
GIB = 1024 * MIB


def gib(n: int) -> str:
    """Bytes as GiB with two decimals, as the reports print them: 1610612736 -> '1.50'."""
    return f"{n / GIB:.2f}"
