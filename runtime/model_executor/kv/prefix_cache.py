"""Content-addressed KV blocks: a `BlockAllocator` that keeps full blocks findable by their tokens.

A full block's key is a hash of its rows chained with the previous block's key; the
first block chains with a root key naming the model (plan model, node, weights source,
dtype, block size), so equal keys mean equal KV contents. `prefix_root` builds that root,
`chain_keys` the keys of a row sequence's full blocks. A row is a token id (int) or, for
models whose rows are not all tokens (BAGEL's image rows, the Qwen3-Omni thinker's media rows), a
byte string naming its content, encoded so that no other row sequence spells the same bytes
(runtime/models/bagel/row_keys.py, runtime/conductor/media_keys.py). `tail_key` names the first rows of a
partly filled block: a model whose inputs cannot be computed from the middle (an image's
rows attend to each other) reuses a cached input whole, its last partial block copied.

Block life cycle, on top of the reference counts of `BlockAllocator`:
  * `register(block, key)` after the forward that wrote it: the block is now cached (a
    block may hold several keys: a full-block key and tail keys of its first rows);
  * `claim(keys)` takes the longest cached chain for a new request (one reference each);
  * `free` of the last reference puts a cached block on the evictable LRU list instead of
    the free list: it keeps its contents and stays findable;
  * `allocate` takes free blocks first and evicts least recently freed cached blocks only
    when none are left. A block with an owner is never evicted.
`num_free` counts free and evictable blocks: both can be handed out.

Keys are blake2b digests, identical in every process (the conductor keys the tables it owns
from the root a worker's executor names: see runtime/conductor/kv_ledger.py).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
import hashlib
import struct
from typing import Sequence

import torch

from runtime.model_executor.kv.block_allocator import BlockAllocator, OutOfBlocks, take_run_block

Key = bytes
Row = int | bytes


def prefix_root(*identity: object) -> Key:
    """The root key of one model's cache: a digest of what makes its KV contents what they are."""
    return hashlib.blake2b("\x1f".join(map(str, identity)).encode(), digest_size=16).digest()


def tensor_digest(t: torch.Tensor) -> bytes:
    """16-byte digest of a tensor's dtype, shape and bytes: rows named by an encoder's output share
    KV exactly when that output is bit-equal."""
    h = hashlib.blake2b(f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=16)
    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def _row_bytes(rows: Sequence[Row]) -> bytes:
    """Each row as its bytes: a token id as 4 little-endian signed bytes, a digest as itself."""
    try:
        return struct.pack(f"<{len(rows)}i", *rows)      # token ids (a block of them, in one call)
    except struct.error:                                 # digests among them (or an id past int32: raises below)
        return b"".join(r if isinstance(r, bytes) else int(r).to_bytes(4, "little", signed=True) for r in rows)


def chain_keys(parent: Key, tokens: Sequence[Row], block_size: int) -> list[Key]:
    """Keys of each full block of `tokens` (rows), the first chained with `parent`."""
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(_row_bytes(tokens[start:start + block_size]))
        parent = h.digest()
        keys.append(parent)
    return keys


def tail_key(parent: Key, rows: Sequence[Row]) -> Key:
    """The key of a partly filled block holding `rows` after the chain ending in `parent`
    (a domain of its own, apart from full-block keys: the "tail" tag and the row count)."""
    h = hashlib.blake2b(b"tail" + len(rows).to_bytes(4, "little"), digest_size=16)
    h.update(parent)
    h.update(_row_bytes(rows))
    return h.digest()


@dataclass
class PrefixStats:
    """What /metrics shows per cache: lookups, lookups that reused a block, tokens reused, evictions."""

    queries: int = 0
    hits: int = 0
    hit_tokens: int = 0
    query_tokens: int = 0
    evictions: int = 0


class PrefixCachingAllocator(BlockAllocator):
    """A `BlockAllocator` whose freed full blocks stay findable by key until evicted (LRU)."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._blocks: dict[Key, int] = {}                       # key -> cached block
        self._keys: dict[int, list[Key]] = {}                   # cached block -> its keys
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, no owner; oldest first
        self.stats = PrefixStats()

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._keys)

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int, after: int | None = None) -> list[int]:
        if not self.can_allocate(n):
            raise OutOfBlocks(n, self.num_free)
        blocks = []
        for _ in range(n):
            after = self._take(after) if self._free else self._evict(after)
            blocks.append(after)
        for b in blocks:
            self.refs[b] = 1
        return blocks

    def _evict(self, after: int | None = None) -> int:
        """Once no block is free: the cached block after `after` (the run goes on), else the start of the
        least recently used stretch (its blocks were freed together), its neighbours counted as used now."""
        block = take_run_block(self._evictable, after, self.num_blocks)
        for key in self._keys.pop(block):
            del self._blocks[key]
        self.stats.evictions += 1
        return block

    def _unowned(self, block: int) -> None:
        """A cached block stays findable (evictable, least recently freed first); any other is free."""
        if block in self._keys:
            self._evictable[block] = None
        else:
            self._free[block] = None

    def lookup(self, key: Key) -> int | None:
        """The block cached under `key`, if any (nothing changes)."""
        return self._blocks.get(key)

    def cached(self, keys: Sequence[Key]) -> list[int]:
        """The blocks of the longest cached chain that `keys` starts with (nothing changes)."""
        found = []
        for key in keys:
            block = self._blocks.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def claim(self, blocks: Sequence[int]) -> None:
        """One more owner for each of `blocks` (from `cached`), taking evictable ones off the LRU list."""
        for b in blocks:
            if b not in self._keys:
                raise ValueError(f"block {b} is not cached; only a cached block can be claimed")
            self._evictable.pop(b, None)
            self.refs[b] += 1

    def register(self, block: int, key: Key) -> None:
        """`block` (allocated, written) now holds the contents `key` names. A key already
        cached in another block (two requests computed it at once) keeps that block."""
        if self.refs[block] == 0:
            raise ValueError(f"block {block} is free; only a written, held block can be cached")
        if key in self._blocks:
            return
        self._blocks[key] = block
        self._keys.setdefault(block, []).append(key)

    def forget(self, block: int) -> None:
        """`block`'s contents are not what its key says (the forward that wrote them failed)."""
        keys = self._keys.pop(block, None)
        if keys is None:
            return
        for key in keys:
            del self._blocks[key]
        if block in self._evictable:
            del self._evictable[block]
            self._free[block] = None

    def note_query(self, query_tokens: int, hit_tokens: int) -> None:
        self.stats.queries += 1
        self.stats.query_tokens += query_tokens
        self.stats.hits += int(hit_tokens > 0)
        self.stats.hit_tokens += hit_tokens


__all__ = ["Key", "PrefixCachingAllocator", "PrefixStats", "Row", "chain_keys", "prefix_root", "tail_key",
           "tensor_digest"]
