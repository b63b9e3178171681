"""Per-request block tables over a `BlockAllocator`, with prefix sharing and copy-on-write.

The scheduler's view of one KV cache (one KV node on one rank):
  * `can_allocate(n_tokens)` / `allocate(req, n_tokens)`: admit a request with room for
    its first tokens;
  * `can_append(req, n)` / `append(req, n)`: room for n more tokens (a prefill chunk or
    a decode step); returns the copy-on-write block copies the worker must apply to the
    cache tensors (`PagedKVCache.copy_blocks`) before the forward that writes them;
  * `fork(parent, child)`: the child shares every block of the parent (a prompt prefix
    for CFG branches or parallel samples) with no copying; the first append into a
    shared, partly filled last block copies that block;
  * `free(req)`: drop the request's references;
  * `metadata(schedule)`: the `AttentionMetadata` of a batch of (request, new tokens).
Every method that can fail raises `OutOfBlocks` before changing any state.

Invariant: a block's reference count equals the number of block tables that hold it;
full shared blocks are never written (tokens are only appended), so only a partly
filled last block ever needs copying.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch

from runtime.attention.metadata import AttentionMetadata
from runtime.kv.block_allocator import BlockAllocator, OutOfBlocks

RequestId = Hashable


@dataclass
class BlockTable:
    """The cache blocks of one request, in position order, and how many tokens they hold."""

    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0


class KVBlockManager:
    """Block tables of every request on one paged KV cache."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self._tables: dict[RequestId, BlockTable] = {}

    def __contains__(self, req: RequestId) -> bool:
        return req in self._tables

    def table(self, req: RequestId) -> BlockTable:
        return self._tables[req]

    def num_tokens(self, req: RequestId) -> int:
        return self._tables[req].num_tokens

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.allocator.can_allocate(self._blocks_for(num_tokens))

    def allocate(self, req: RequestId, num_tokens: int) -> None:
        """A new request with room for its first `num_tokens` tokens."""
        if req in self._tables:
            raise ValueError(f"request {req!r} already has a KV block table")
        blocks = self.allocator.allocate(self._blocks_for(num_tokens))
        self._tables[req] = BlockTable(blocks, num_tokens)

    def _append_needs(self, table: BlockTable, n: int) -> tuple[int, bool]:
        """(fresh blocks needed, whether the shared last block must be copied first)."""
        fresh = self._blocks_for(table.num_tokens + n) - len(table.blocks)
        last_partial = table.num_tokens % self.block_size != 0
        cow = last_partial and self.allocator.ref_count(table.blocks[-1]) > 1
        return fresh + int(cow), cow

    def can_append(self, req: RequestId, n: int) -> bool:
        return self.allocator.can_allocate(self._append_needs(self._tables[req], n)[0])

    def append(self, req: RequestId, n: int) -> list[tuple[int, int]]:
        """Room for `n` more tokens; returns (src, dst) block copies to apply before writing."""
        table = self._tables[req]
        needed, cow = self._append_needs(table, n)
        fresh = self.allocator.allocate(needed)
        copies = []
        if cow:
            src, dst = table.blocks[-1], fresh.pop()
            self.allocator.free([src])
            table.blocks[-1] = dst
            copies.append((src, dst))
        table.blocks.extend(fresh)
        table.num_tokens += n
        return copies

    def fork(self, parent: RequestId, child: RequestId) -> None:
        """`child` starts with the same tokens as `parent`, sharing its blocks."""
        if child in self._tables:
            raise ValueError(f"request {child!r} already has a KV block table")
        source = self._tables[parent]
        self.allocator.share(source.blocks)
        self._tables[child] = BlockTable(list(source.blocks), source.num_tokens)

    def free(self, req: RequestId) -> None:
        """Release a finished or preempted request's blocks."""
        self.allocator.free(self._tables.pop(req).blocks)

    def metadata(self, schedule: Sequence[tuple[RequestId, int]],
                 device: torch.device | str = "cpu") -> AttentionMetadata:
        """Metadata for a forward that runs the last `n` tokens of each (request, n) in order."""
        tables = [self._tables[req] for req, _ in schedule]
        return AttentionMetadata.build(
            query_lens=[n for _, n in schedule], seq_lens=[t.num_tokens for t in tables],
            block_tables=[t.blocks for t in tables], block_size=self.block_size, device=device)


__all__ = ["BlockTable", "KVBlockManager", "OutOfBlocks"]
