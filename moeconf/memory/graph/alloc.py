"""ggml-alloc's dynamic allocator (ggml/src/ggml-alloc.c, `ggml_dyn_tallocr`) with one chunk, its best-fit and
merging rules as docs/memory.md, "The scheduler and the allocator" describes them."""

from __future__ import annotations

_LAST_BLOCK = 1 << 62  # the last free block reaches the end of a buffer that grows on demand


class Allocator:
    """ggml_dyn_tallocr with one chunk: free blocks sorted by offset, the last one open-ended."""

    __slots__ = ("alignment", "blocks", "max_size")

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, _LAST_BLOCK]]
        self.max_size = 0

    def _aligned(self, size: int) -> int:
        a = self.alignment
        return (size + a - 1) // a * a

    def alloc(self, size: int) -> int:
        size = self._aligned(size)
        blocks = self.blocks
        best = len(blocks) - 1
        best_size = _LAST_BLOCK
        for i in range(best):
            bs = blocks[i][1]
            if size <= bs <= best_size:  # best fit; a tie goes to the later block
                best, best_size = i, bs
        block = blocks[best]
        off = block[0]
        block[0] = off + size
        block[1] -= size
        if not block[1]:
            del blocks[best]
        if off + size > self.max_size:
            self.max_size = off + size
        return off

    def free(self, off: int, size: int) -> None:
        size = self._aligned(size)
        blocks = self.blocks
        end = off + size
        for i, block in enumerate(blocks):
            start = block[0]
            if start + block[1] == off:  # the freed range ends this block: extend it
                block[1] += size
                if i + 1 < len(blocks) and start + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if end == start:  # the freed range starts this block
                block[0] = off
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == off:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        # the engine's linear insert, not a bisect: a zero-size tensor freed inside a free block leaves a zero-size
        # block that the next allocation from that block passes, so the list is not always in offset order
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < off:
            pos += 1
        blocks.insert(pos, [off, size])
