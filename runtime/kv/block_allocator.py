"""Reference-counted allocator of fixed-size KV cache blocks.

Paired verbs: `can_allocate(n)` / `allocate(n)` / `free(blocks)`. A block shared by
several owners (requests forked from one prompt, CFG branches) carries a reference count;
`share` adds a reference and `free` drops one, returning the block to the free list
when the last owner lets go. Running out is an `OutOfBlocks` exception, raised before
any state changes, so the scheduler can preempt or wait and retry.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable


class OutOfBlocks(RuntimeError):
    """Not enough free KV cache blocks; nothing was allocated."""

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(f"KV cache out of blocks: need {needed}, {free} free "
                         "(preempt or finish a request, or give the cache more memory)")
        self.needed = needed
        self.free = free


class BlockAllocator:
    """Hands out block ids 0 .. num_blocks-1 and tracks how many owners each has."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """`n` fresh blocks, each with one owner; raises OutOfBlocks if fewer are free."""
        if not self.can_allocate(n):
            raise OutOfBlocks(n, len(self._free))
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._refs[b] = 1
        return blocks

    def share(self, blocks: Iterable[int]) -> None:
        """Add one owner to each of `blocks` (all must be allocated)."""
        for b in blocks:
            if self._refs[b] == 0:
                raise ValueError(f"block {b} is free; only allocated blocks can be shared")
            self._refs[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one owner from each of `blocks`; a block with no owner left is free again."""
        for b in blocks:
            if self._refs[b] == 0:
                raise ValueError(f"block {b} is freed twice")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)
