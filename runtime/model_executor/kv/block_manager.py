"""Per-request block tables over a `BlockAllocator`, with prefix sharing and copy-on-write.

The owner's view of one KV cache (one KV node, or the nodes sharing one cache, on one rank): the
conductor's (runtime/conductor/kv_ledger.py; the worker is told each table's `changes`):
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

Prefix caching (`prefix_root` given; runtime/model_executor/kv/prefix_cache.py): `allocate` and
`append` take the token ids too, `prefix_hit(tokens)` says how many leading tokens are
cached in full blocks, `allocate(..., reuse=n)` shares those blocks instead of computing
them, and `commit(req)` after the forward makes the request's newly filled blocks
findable. A table whose tokens are unknown (given without ids) never caches a block, nor does one
past a `stop_ids` token (a placeholder whose rows an encoder's embeddings replace: its id
does not say what is there): a prompt holding one is neither looked up nor cached from it on.
A request's later prompt chunks look up too: `prefix_hit(tokens, after=req)` continues the
chain of a request whose full blocks are all keyed (its chunks so far were committed), and
`append(req, n, tokens, reuse=k)` shares those. When the request's last block is partly filled
(a chunk or a prompt piece that ended mid-block), a cached block holding those rows and the
next ones replaces it, so a chain continues across any chunk boundary.

Whole-input reuse (`extend(req, rows)`, BAGEL's segments): rows that can only be computed together (an
image's rows attend to each other) are reused whole or computed whole. `extend` looks up the
full blocks the rows end and the tail key of the partly filled block after them; on a hit the
request takes the cached full blocks and a copy of the tail block, else room to compute them.
`commit(req, tails=True)` also keys the request's partly filled last block by its rows so far.

Invariant: a block's reference count equals the number of block tables that hold it;
full shared blocks are never written (tokens are only appended), so only a partly
filled last block ever needs copying.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch

from runtime.model_executor.attention.metadata import AttentionMetadata
from runtime.model_executor.kv.block_allocator import BlockAllocator, OutOfBlocks
from runtime.model_executor.kv.prefix_cache import Key, PrefixCachingAllocator, Row, chain_keys, tail_key

RequestId = Hashable


@dataclass
class BlockTable:
    """The cache blocks of one request, in position order, and how many tokens they hold."""

    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0
    keys: list[Key] = field(default_factory=list)   # content keys of the first len(keys) (full) blocks
    pending: list[Row] | None = None                # rows after those blocks; None: unknown, never cached
    told: int = 0                                   # blocks[:told] are as the worker was last told (`changes`)


class KVBlockManager:
    """Block tables of every request on one paged KV cache."""

    def __init__(self, num_blocks: int, block_size: int, prefix_root: Key | None = None,
                 stop_ids: frozenset[int] = frozenset()) -> None:
        self.block_size = block_size
        self.prefix_root = prefix_root
        self.stop_ids = stop_ids
        self.allocator = BlockAllocator(num_blocks) if prefix_root is None else PrefixCachingAllocator(num_blocks)
        self._tables: dict[RequestId, BlockTable] = {}

    def __contains__(self, req: RequestId) -> bool:
        return req in self._tables

    def table(self, req: RequestId) -> BlockTable:
        return self._tables[req]

    def get(self, req: RequestId) -> BlockTable | None:
        return self._tables.get(req)

    def requests(self) -> list[RequestId]:
        return list(self._tables)

    def num_tokens(self, req: RequestId) -> int:
        return self._tables[req].num_tokens

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _chain_end(self, after: RequestId | None) -> tuple[Key, list[Row]] | None:
        """(the key `tokens` chain from, the rows before them in a partly filled block): the root and
        none for a new request; for `after`, its last full block's key and the rows after it, when
        every full block it holds is keyed and its partly filled last block is its own (a shared one
        stays: replacing it would free nothing); else None (no lookup)."""
        if self.prefix_root is None:
            return None
        if after is None:
            return self.prefix_root, []
        table = self._tables[after]
        pending = table.pending
        if pending is None or len(pending) >= self.block_size \
                or len(table.keys) * self.block_size + len(pending) != table.num_tokens:
            return None
        if pending and self.allocator.ref_count(table.blocks[-1]) > 1:
            return None
        return (table.keys[-1] if table.keys else self.prefix_root), list(pending)

    def prefix_hit(self, tokens: Sequence[Row], after: RequestId | None = None, limit: int | None = None) -> int:
        """Leading rows of `tokens` held in cached full blocks, leaving at least one to compute (the
        forward must produce the last row's logits) and reusing none at or past row `limit`; 0
        without prefix caching. `after`: a request that holds rows already, which `tokens` continue."""
        if len(tokens) < 2:      # a decode step's one row: it is computed, nothing to look up
            return 0
        end = self._chain_end(after)
        if end is None or self._stops(tokens):
            return 0
        parent, pending = end
        usable = len(tokens) - 1 if limit is None else min(limit, len(tokens) - 1)
        rows = [*pending, *tokens[:usable]]
        keys = chain_keys(parent, rows[:len(rows) // self.block_size * self.block_size], self.block_size)
        return max(0, len(self.allocator.cached(keys)) * self.block_size - len(pending))

    def _stops(self, tokens: Sequence[Row]) -> bool:
        return bool(self.stop_ids) and any(t in self.stop_ids for t in tokens)

    def _reused(self, tokens: Sequence[Row] | None, reuse: int, after: RequestId | None = None) -> list[int]:
        """The cached blocks holding the first `reuse` tokens (and the rows before them in the request's
        partly filled last block); a ValueError (a caller's mistake) if they are not all here."""
        if reuse == 0:
            return []
        hit = self.prefix_hit(tokens, after) if tokens is not None else 0
        parent, pending = self._chain_end(after) or (None, [])
        if (len(pending) + reuse) % self.block_size or reuse > hit:
            raise ValueError(f"asked to reuse {reuse} cached tokens, but this KV cache holds {hit} of them "
                             "(reuse only what prefix_hit finds, ending on a block boundary)")
        return self.allocator.cached(chain_keys(parent, [*pending, *tokens[:reuse]], self.block_size))

    def blocks_needed(self, num_tokens: int, tokens: Sequence[Row] | None = None, reuse: int = 0) -> int:
        """Blocks a new request takes from the free (or evictable) ones: all but the reused blocks
        that another request already holds."""
        reused = self._reused(tokens, reuse)
        held = sum(1 for b in reused if self.allocator.ref_count(b) > 0)
        return self._blocks_for(num_tokens) - held

    def can_allocate(self, num_tokens: int, tokens: Sequence[Row] | None = None, reuse: int = 0) -> bool:
        return self.blocks_needed(num_tokens, tokens, reuse) <= self.allocator.num_free

    def allocate(self, req: RequestId, num_tokens: int, tokens: Sequence[Row] | None = None,
                 reuse: int = 0) -> None:
        """A new request with room for its first `num_tokens` tokens (ids `tokens`, if known),
        sharing the cached blocks of its first `reuse` tokens."""
        if req in self._tables:
            raise ValueError(f"request {req!r} already has a KV block table")
        reused = self._reused(tokens, reuse)
        if not self.can_allocate(num_tokens, tokens, reuse):
            raise OutOfBlocks(self.blocks_needed(num_tokens, tokens, reuse), self.allocator.num_free)
        if reused:
            self.allocator.claim(reused)     # first: allocating fresh blocks must not evict these
        blocks = reused + self.allocator.allocate(self._blocks_for(num_tokens) - len(reused),
                                                  after=reused[-1] if reused else None)
        table = BlockTable(blocks, num_tokens)
        if self.prefix_root is not None and tokens is not None:
            table.keys = chain_keys(self.prefix_root, tokens[:reuse], self.block_size)
            table.pending = None if self._stops(tokens) else list(tokens[reuse:])
            self.allocator.note_query(len(tokens), reuse)
        self._tables[req] = table

    def open(self, req: RequestId) -> None:
        """An empty table whose rows will be known (`extend`, `append` with rows), so its blocks are cached."""
        if req in self._tables:
            raise ValueError(f"request {req!r} already has a KV block table")
        self._tables[req] = BlockTable(pending=[] if self.prefix_root is not None else None)

    def uncache(self, req: RequestId) -> None:
        """The forward that was to write the request's uncommitted rows failed: never key its blocks."""
        self._tables[req].pending = None

    def commit(self, req: RequestId, tails: bool = False) -> list[int]:
        """Make the request's full, written blocks findable (call after the forward that wrote them);
        returns the blocks newly keyed. `tails`: key the partly filled last block by its rows too (returned last)."""
        table = self._tables[req]
        if self.prefix_root is None or table.pending is None or (len(table.pending) < self.block_size and not tails):
            return []            # (no block filled since the last commit: a decode step's usual case)
        parent = table.keys[-1] if table.keys else self.prefix_root
        new = chain_keys(parent, table.pending, self.block_size)
        for i, key in enumerate(new, start=len(table.keys)):
            self.allocator.register(table.blocks[i], key)
        table.keys.extend(new)
        del table.pending[:len(new) * self.block_size]
        keyed = table.blocks[len(table.keys) - len(new):len(table.keys)]
        if tails and table.pending:
            self.allocator.register(table.blocks[-1], tail_key(table.keys[-1] if table.keys else self.prefix_root,
                                                               table.pending))
            keyed.append(table.blocks[-1])
        return keyed

    def _cached_extension(self, table: BlockTable,
                          rows: Sequence[Row]) -> tuple[list[Key], list[int], int | None] | None:
        """(full-block keys, their cached blocks, cached tail block or None) holding the table's
        pending rows followed by `rows`; None unless all of them are cached."""
        if self.prefix_root is None or table.pending is None:
            return None
        parent = table.keys[-1] if table.keys else self.prefix_root
        pending = [*table.pending, *rows]
        keys = chain_keys(parent, pending, self.block_size)
        blocks = self.allocator.cached(keys)
        if len(blocks) < len(keys):
            return None
        rest = pending[len(keys) * self.block_size:]
        if not rest:
            return keys, blocks, None
        tail = self.allocator.lookup(tail_key(keys[-1] if keys else parent, rest))
        return (keys, blocks, tail) if tail is not None else None

    def extend(self, req: RequestId, rows: Sequence[Row]) -> tuple[bool, list[tuple[int, int]]]:
        """Room for `rows` after the request's rows so far, reused whole from the cache when every
        block of them is cached: (reused, (src, dst) block copies to apply before the next
        allocation or forward). A miss is `append(req, len(rows), rows)`; both count one query."""
        table = self._tables[req]
        hit = self._cached_extension(table, rows)
        if hit is None:
            copies = self._grow(req, len(rows), list(rows), 0) if rows else []
            self.allocator.note_query(len(rows), 0)
            return False, copies
        keys, blocks, tail = hit
        claimed = [*blocks, *([tail] if tail is not None else [])]
        needed = self._blocks_for(table.num_tokens + len(rows)) - len(table.keys) - len(blocks)
        old = table.blocks[len(table.keys):]      # the partly filled last block: its rows are in `claimed`
        taken = sum(1 for b in claimed if self.allocator.ref_count(b) == 0)
        released = sum(1 for b in old if self.allocator.ref_count(b) == 1 and b not in claimed)
        if not self.allocator.can_allocate(needed + taken - released):
            raise OutOfBlocks(needed + taken - released, self.allocator.num_free)
        self.allocator.claim(claimed)             # first: allocating must not evict them
        self.allocator.free(old)
        fresh = self.allocator.allocate(needed, after=blocks[-1] if blocks else None)
        copies = [(tail, fresh[0])] if tail is not None else []
        if tail is not None:
            self.allocator.free([tail])           # its rows stay until an allocation reuses the block
        table.told = min(table.told, len(table.keys))
        table.blocks[len(table.keys):] = [*blocks, *fresh]
        table.keys.extend(keys)
        table.num_tokens += len(rows)
        table.pending = [*table.pending, *rows][len(keys) * self.block_size:]
        self.allocator.note_query(len(rows), len(rows))
        return True, copies

    def _append_needs(self, table: BlockTable, n: int, reused: Sequence[int] = (),
                      replaced: int = 0) -> tuple[int, bool]:
        """(fresh blocks needed, whether the shared last block must be copied first); `reused`
        cached blocks hold the first of the `n` tokens, the first of them in place of the table's
        last `replaced` (partly filled) block."""
        fresh = self._blocks_for(table.num_tokens + n) - len(table.blocks) + replaced - len(reused)
        last_partial = table.num_tokens % self.block_size != 0
        cow = not replaced and last_partial and self.allocator.ref_count(table.blocks[-1]) > 1
        return fresh + int(cow), cow

    def append_needs(self, req: RequestId, n: int, tokens: Sequence[Row] | None = None, reuse: int = 0) -> int:
        """Free blocks `append(req, n, tokens, reuse)` takes: its fresh blocks (and a copy's), the reused
        cached blocks nobody holds, less the partly filled last block a reuse gives back."""
        return self._growth(self._tables[req], n, tokens, reuse, req)[0]

    def _growth(self, table: BlockTable, n: int, tokens: Sequence[Row] | None, reuse: int,
                req: RequestId) -> tuple[int, int, bool, list[int], list[int]]:
        """(free blocks taken, fresh ones, whether the last block is copied, the reused cached blocks, the
        table's blocks they replace) of growing `table` by `n` rows, the first `reuse` in cached blocks."""
        reused = self._reused(tokens, reuse, after=req) if reuse else []
        replaced = table.blocks[len(table.keys):] if reused else []   # its rows are in reused[0]
        needed, cow = self._append_needs(table, n, reused, len(replaced))
        evictable = sum(1 for b in reused if self.allocator.ref_count(b) == 0)
        released = sum(1 for b in replaced if self.allocator.ref_count(b) == 1)
        return needed + evictable - released, needed, cow, reused, replaced

    def can_append(self, req: RequestId, n: int) -> bool:
        return self.allocator.can_allocate(self.append_needs(req, n))

    def append(self, req: RequestId, n: int, tokens: Sequence[Row] | None = None,
               reuse: int = 0) -> list[tuple[int, int]]:
        """Room for `n` more tokens (ids `tokens`, if known), the first `reuse` of them in cached
        blocks (`prefix_hit(tokens, after=req)`); returns (src, dst) block copies to apply before writing."""
        if n == 1 and not reuse and self.append_row(req, tokens):
            return []
        # a lookup when a full block could be found: rows after the partly filled last block's reach it
        # (never one row: a last block's rows are fewer than a block, see _chain_end)
        end = self._chain_end(req) if tokens is not None and len(tokens) > 1 else None
        is_lookup = end is not None and len(end[1]) + len(tokens) > self.block_size
        copies = self._grow(req, n, tokens, reuse)
        if is_lookup:
            self.allocator.note_query(len(tokens), reuse)    # a later prompt chunk: a lookup too
        return copies

    def append_in_place(self, req: RequestId, tokens: Sequence[Row] | None, told: bool = False) -> bool:
        """One row (a decode step's) into the request's own partly filled last block, as `append`
        would put it there (no block taken, none copied, nothing to look up); False, changing
        nothing, if it needs more than that (or the request holds no table). `told`: also False
        while the table has `changes` not yet taken (so after it there are none)."""
        table = self._tables.get(req)
        if table is None:
            return False
        n, blocks, size = table.num_tokens, table.blocks, self.block_size
        if (not n % size or len(blocks) != n // size + 1 or (told and table.told != len(blocks))
                or self.allocator.refs[blocks[-1]] != 1):
            return False
        if table.pending is not None:
            self._note_rows(table, tokens, 0)
        table.num_tokens = n + 1
        return True

    def append_row(self, req: RequestId, tokens: Sequence[Row] | None) -> bool:
        """One row (a decode step's) the short way, as `append` would place it: into the request's own
        partly filled last block (`append_in_place`), or, after a full last block, into one fresh block
        (nothing to copy, nothing to look up: one row is never a cached block). False, changing nothing,
        if it needs more than that (no table, a shared partly filled block, no block free)."""
        if self.append_in_place(req, tokens):
            return True
        table = self._tables.get(req)
        if table is None:
            return False
        n, blocks = table.num_tokens, table.blocks
        if n % self.block_size or len(blocks) != n // self.block_size or not self.allocator.can_allocate(1):
            return False
        blocks.extend(self.allocator.allocate(1, after=blocks[-1] if blocks else None))
        if table.pending is not None:
            self._note_rows(table, tokens, 0)
        table.num_tokens = n + 1
        return True

    def _note_rows(self, table: BlockTable, tokens: Sequence[Row] | None, reuse: int) -> None:
        """The rows after the first `reuse` of `tokens` wait in the table to be keyed (`commit`); rows
        not known, or past a placeholder, end its caching."""
        if table.pending is not None:     # the table's own list (allocate, open and a reuse give it a new one)
            if tokens is None or self._stops(tokens):
                table.pending = None
            else:
                table.pending.extend(tokens[reuse:] if reuse else tokens)

    def _grow(self, req: RequestId, n: int, tokens: Sequence[Row] | None, reuse: int) -> list[tuple[int, int]]:
        table = self._tables[req]
        taken, needed, cow, reused, replaced = self._growth(table, n, tokens, reuse, req)
        if not self.allocator.can_allocate(taken):
            raise OutOfBlocks(taken, self.allocator.num_free)
        if reused:
            parent, pending = self._chain_end(req)
            self.allocator.claim(reused)     # first: allocating fresh blocks must not evict these
            self.allocator.free(replaced)
            table.told = min(table.told, len(table.keys))
            del table.blocks[len(table.keys):]
            table.keys.extend(chain_keys(parent, [*pending, *tokens[:reuse]], self.block_size))
            table.blocks.extend(reused)
            table.pending = []
        fresh = self.allocator.allocate(needed, after=table.blocks[-1] if table.blocks else None)
        self._note_rows(table, tokens, reuse)
        copies = []
        if cow:
            src, dst = table.blocks[-1], fresh.pop()
            self.allocator.free([src])
            table.told = min(table.told, len(table.blocks) - 1)
            table.blocks[-1] = dst
            copies.append((src, dst))
        table.blocks.extend(fresh)
        table.num_tokens += n
        return copies

    def changes(self, req: RequestId) -> tuple[int, list[int]]:
        """(index, the table's blocks from it on) that changed since the last call: what the worker
        holding the cache tensors must be told (its copy is `table[index:] = blocks`); (len, []) when
        nothing did. Marks them told."""
        table = self._tables[req]
        at, blocks = table.told, table.blocks
        table.told = len(blocks)
        return at, blocks[at:]

    def fork(self, parent: RequestId, child: RequestId) -> None:
        """`child` starts with the same tokens as `parent`, sharing its blocks."""
        if child in self._tables:
            raise ValueError(f"request {child!r} already has a KV block table")
        source = self._tables[parent]
        self.allocator.share(source.blocks)
        pending = None if source.pending is None else list(source.pending)
        self._tables[child] = BlockTable(list(source.blocks), source.num_tokens, list(source.keys), pending)

    def free(self, req: RequestId) -> None:
        """Release a finished or preempted request's blocks (last first: a cache evicts the tail
        of a chain before its head, which more requests share)."""
        self.allocator.free(reversed(self._tables.pop(req).blocks))

    def metadata(self, schedule: Sequence[tuple[RequestId, int]],
                 device: torch.device | str = "cpu") -> AttentionMetadata:
        """Metadata for a forward that runs the last `n` tokens of each (request, n) in order."""
        return tables_metadata(self._tables, schedule, self.block_size, device)


def tables_metadata(tables: dict[RequestId, BlockTable], schedule: Sequence[tuple[RequestId, int]], block_size: int,
                    device: torch.device | str) -> AttentionMetadata:
    """Attention metadata of a forward over the last `n` rows of each (request, n) of `schedule`, in order."""
    held = [tables[req] for req, _ in schedule]
    return AttentionMetadata.build(
        query_lens=[n for _, n in schedule], seq_lens=[t.num_tokens for t in held],
        block_tables=[t.blocks for t in held], block_size=block_size, device=device)


__all__ = ["BlockTable", "KVBlockManager", "OutOfBlocks", "tables_metadata"]
