"""Reference-counted allocator of fixed-size KV cache blocks.

Paired verbs: `can_allocate(n)` / `allocate(n)` / `free(blocks)`. A block shared by
several owners (requests forked from one prompt, CFG branches) carries a reference count;
`share` adds a reference and `free` drops one, returning the block to the free list
when the last owner lets go. Running out is an `OutOfBlocks` exception, raised before
any state changes, so the scheduler can preempt or wait and retry.

Blocks are handed out in runs: `allocate(n, after=last)` continues a table whose last block
is `last` with the block after it where that one is free, and a block taken from the front of
the free list (a run's start) sends its next RUN_BLOCKS - 1 free neighbours to the back, so
requests that grow side by side (decodes, a block each every block_size steps) still get
their blocks next to each other in memory. A kept neighbour is still free: any request takes
it once the others are gone, so nothing is reserved and no count changes. Why: attention
reads a request's blocks in table order, and the CPU's prefetchers follow a run, not a scatter
(`python tools/bench.py attention` times the decode kernel over blocks in runs against interleaved
ones; figures in docs/benchmark-log.md).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

RUN_BLOCKS = 16     # blocks a table aims to hold in a row (256 tokens of 16-token blocks)


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
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))   # oldest first
        self.refs = [0] * num_blocks      # owners of each block (read it, change it only through these methods)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self.refs[block]

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int, after: int | None = None) -> list[int]:
        """`n` fresh blocks, each with one owner, continuing a run after block `after` where they can;
        raises OutOfBlocks if fewer are free."""
        if not self.can_allocate(n):
            raise OutOfBlocks(n, len(self._free))
        blocks = []
        for _ in range(n):
            after = self._take(after)
            blocks.append(after)
        for b in blocks:
            self.refs[b] = 1
        return blocks

    def _take(self, after: int | None) -> int:
        """A free block off the list: the one after `after` if free, else a new run's start."""
        return take_run_block(self._free, after, self.num_blocks)

    def share(self, blocks: Iterable[int]) -> None:
        """Add one owner to each of `blocks` (all must be allocated)."""
        for b in blocks:
            if self.refs[b] == 0:
                raise ValueError(f"block {b} is free; only allocated blocks can be shared")
            self.refs[b] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one owner from each of `blocks`; a block with no owner left is free again."""
        for b in blocks:
            if self.refs[b] == 0:
                raise ValueError(f"block {b} is freed twice")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self._unowned(b)

    def _unowned(self, block: int) -> None:
        """Where a block goes once its last owner freed it: the free list."""
        self._free[block] = None


def take_run_block(pool: OrderedDict[int, None], after: int | None, num_blocks: int) -> int:
    """Off `pool` (oldest first): block after + 1 if there, else a run's start: the first of the stretch of
    pooled blocks the oldest lies in (a freed table comes back tail first), its next RUN_BLOCKS - 1 pooled
    neighbours sent to the back (kept for this run)."""
    if after is not None and after + 1 in pool:
        del pool[after + 1]
        return after + 1
    block = next(iter(pool))
    while block - 1 in pool and block % RUN_BLOCKS:
        block -= 1
    del pool[block]
    for neighbour in range(block + 1, min(block + RUN_BLOCKS, num_blocks)):
        if neighbour in pool:
            pool.move_to_end(neighbour)
    return block
