"""The block tables a worker's cache is read and written by, as the conductor hands them out.

The conductor owns every block table of a pool it allocates (runtime/conductor/kv_ledger.py): it
takes blocks, decides prefix reuse and copy-on-write, and tells each Run what changed in the
request's table (`WorkItem.kv_at`: the index from which `kv_blocks` replace the table, -1 when
nothing changed; `kv_copies`: (src, dst) block copies to make first). A worker keeps only its copy
of each table and how many rows the cache holds for it; it allocates nothing. A Run whose rows
would not fit its table is the conductor's mistake and fails loudly, naming the request.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch

from runtime.model_executor.attention.metadata import AttentionMetadata
from runtime.model_executor.kv.block_manager import BlockTable, tables_metadata
from runtime.model_executor.kv.paged_cache import PagedKVCache

RequestId = Hashable


class BlockTables:
    """One paged cache's tables, per request, as the conductor last told them."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self._tables: dict[RequestId, BlockTable] = {}

    def __contains__(self, req: RequestId) -> bool:
        return req in self._tables

    def table(self, req: RequestId) -> BlockTable:
        return self._tables[req]

    def num_tokens(self, req: RequestId) -> int:
        return self._tables[req].num_tokens

    def take(self, req: RequestId, at: int, blocks: Sequence[int], copies: Sequence[tuple[int, int]],
             cache: PagedKVCache) -> None:
        """A Run's changes to its request's table (`WorkItem.kv_at`, `kv_blocks`, `kv_copies`): the
        copies made in `cache` first, then `table[at:] = blocks` (at -1: the table is unchanged)."""
        table = self._tables.get(req)
        if table is None:
            table = self._tables[req] = BlockTable()
        if copies:
            cache.copy_blocks(copies)
        if at >= 0:
            if at > len(table.blocks) or any(not 0 <= b < self.num_blocks for b in blocks):
                raise ValueError(f"request {req}: the conductor's table change (from index {at}: {list(blocks)}) "
                                 f"does not fit a table of {len(table.blocks)} blocks in a pool of {self.num_blocks}")
            table.blocks[at:] = blocks

    def grow(self, req: RequestId, n: int) -> int:
        """`n` more rows in the request's cache; returns how many it held before."""
        table = self._tables[req]
        held = table.num_tokens
        if held + n > len(table.blocks) * self.block_size:
            raise ValueError(f"request {req}: {held + n} cache rows do not fit the {len(table.blocks)} blocks of "
                             f"{self.block_size} its table holds (the conductor's table and this Run disagree)")
        table.num_tokens = held + n
        return held

    def hold(self, req: RequestId, num_tokens: int) -> None:
        """The request's cache holds `num_tokens` rows, written some other way (a cache moved here)."""
        table = self._tables[req]
        if num_tokens > len(table.blocks) * self.block_size:
            raise ValueError(f"request {req}: a moved cache of {num_tokens} rows does not fit the "
                             f"{len(table.blocks)} blocks of its table")
        table.num_tokens = num_tokens

    def free(self, req: RequestId) -> None:
        self._tables.pop(req, None)

    def used_blocks(self) -> int:
        """Blocks the tables here hold (a block shared by several counts once)."""
        return len({b for t in self._tables.values() for b in t.blocks})

    def metadata(self, schedule: Sequence[tuple[RequestId, int]],
                 device: torch.device | str = "cpu") -> AttentionMetadata:
        """Metadata for a forward that runs the last `n` rows of each (request, n) in order."""
        return tables_metadata(self._tables, schedule, self.block_size, device)


__all__ = ["BlockTables"]
