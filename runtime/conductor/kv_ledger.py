"""The conductor's count of KV blocks per (rank, KV node), mirroring the workers' block tables.

A worker's `KVBlockManager` holds ceil(tokens / block_size) blocks per request (no forks
across requests yet), so counting tokens here tells exactly whether its next allocation
fits: the conductor only dispatches work that fits, and a worker never runs out.
Paired verbs: `can_grow` / `grow` / `free`.

A pool whose worker caches prefixes (its `NodeInfo.kv_prefix_key`) is a `PrefixPoolLedger`:
it runs its own `KVBlockManager` with prefix caching over the same token ids, in the same
order as the worker (grows in batch order, `commit` once the pass's batches are formed:
the worker commits after their forward, before any later batch of that pool or any close
sent after them), so both hold the same cached chains. `grow` returns the prompt tokens the
worker will reuse (`WorkItem.cached`), for a request's first Run and for each later chunk of
its prompt; `cached_prefix` says beforehand how many of them a Run of `tokens` would reuse.
A worker that does not hold them fails the batch loudly (`PrefixOutOfStep`) instead of
computing on the wrong blocks. Placeholder ids (`NodeInfo.kv_prefix_stop_ids`) stop caching
in the mirror as in the worker.

A pool whose worker decides reuse itself (BAGEL: rows named by image digests) is counted
as a plain pool, an upper bound (cached blocks nobody holds are free to the worker), and its
prefix counters come from the worker (`note_reported`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from runtime.kv import KVBlockManager, PrefixStats
from runtime.transport.messages import PrefixCounts


@dataclass
class KVPoolLedger:
    """One KV pool: capacity and tokens held per request."""

    num_blocks: int
    block_size: int
    tokens: dict[int, int] = field(default_factory=dict)   # request id -> tokens in the cache
    peak_blocks: int = 0                                     # most blocks ever held at once
    used_blocks: int = 0                                     # blocks held now: the sum over `tokens`

    def _blocks(self, n: int) -> int:
        return -(-n // self.block_size)

    def needed(self, request_id: int, n_new: int) -> int:
        held = self.tokens.get(request_id, 0)
        return (-held // self.block_size) - (-(held + n_new) // self.block_size)   # ceil(after) - ceil(before)

    def fits_alone(self, request_id: int, n_new: int) -> bool:
        """Whether the request's cache after growing fits the pool at all (with nobody else in it)."""
        return self._blocks(self.tokens.get(request_id, 0) + n_new) <= self.num_blocks

    def can_grow(self, request_id: int, n_new: int, reserved: int = 0, tokens: Sequence[int] | None = None) -> bool:
        return self.needed(request_id, n_new) + reserved <= self.num_blocks - self.used_blocks

    def grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int:
        """Count `n_new` more tokens (ids `tokens` if known); returns the cached prompt tokens
        the worker reuses (always 0 here: this pool caches no prefixes)."""
        held = self.tokens.get(request_id, 0)
        self.used_blocks += (-held // self.block_size) - (-(held + n_new) // self.block_size)
        self.tokens[request_id] = held + n_new
        if self.used_blocks > self.peak_blocks:
            self.peak_blocks = self.used_blocks
        return 0

    def cached_prefix(self, request_id: int, tokens: Sequence[int]) -> int:
        """Leading `tokens` (the request's next ones) a Run would reuse from the cache: none here."""
        return 0

    def commit(self) -> None:
        return None

    def forget(self, request_ids: Sequence[int]) -> None:
        """The batch that was to write these requests' latest blocks failed (nothing to undo here)."""
        return None

    def free(self, request_id: int) -> None:
        self.used_blocks -= self._blocks(self.tokens.pop(request_id, 0))

    def clear(self) -> None:
        self.tokens.clear()
        self.used_blocks = 0

    def holders(self) -> list[int]:
        return list(self.tokens)


class PrefixPoolLedger(KVPoolLedger):
    """A pool whose worker caches full blocks by content: counted by a mirror of its block tables."""

    def __init__(self, num_blocks: int, block_size: int, prefix_root: bytes,
                 stop_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(num_blocks, block_size)
        self.prefix_root, self.stop_ids = prefix_root, stop_ids
        self.mirror = KVBlockManager(num_blocks, block_size, prefix_root, stop_ids)
        self._grown: set[int] = set()                 # requests grown since the last commit
        self._committed: dict[int, list[int]] = {}    # request -> blocks its last commit keyed

    @property
    def stats(self) -> PrefixStats:
        return self.mirror.allocator.stats

    def _reuse(self, request_id: int, tokens: Sequence[int] | None) -> int:
        if tokens is None:
            return 0
        return self.mirror.prefix_hit(tokens, after=request_id if request_id in self.mirror else None)

    def cached_prefix(self, request_id: int, tokens: Sequence[int]) -> int:
        return self._reuse(request_id, tokens)

    def needed(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int:
        if request_id in self.mirror:    # an upper bound when a later chunk reuses cached blocks
            return super().needed(request_id, n_new)
        return self.mirror.blocks_needed(n_new, tokens, self._reuse(request_id, tokens))

    def can_grow(self, request_id: int, n_new: int, reserved: int = 0, tokens: Sequence[int] | None = None) -> bool:
        return self.needed(request_id, n_new, tokens) + reserved <= self.mirror.allocator.num_free

    def grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int:
        reuse = self._reuse(request_id, tokens)
        if request_id in self.mirror:
            self.mirror.append(request_id, n_new, tokens, reuse)
        else:
            self.mirror.allocate(request_id, n_new, tokens, reuse)
        self._grown.add(request_id)
        self.tokens[request_id] = self.tokens.get(request_id, 0) + n_new
        self._recount()
        return reuse

    def commit(self) -> None:
        if self._grown:   # else this pass formed no batch here: the one in flight keeps its record
            self._committed = {rid: self.mirror.commit(rid) for rid in self._grown if rid in self.mirror}
        self._grown.clear()

    def forget(self, request_ids: Sequence[int]) -> None:
        """The worker never cached what the failed batch was to write: neither does the mirror."""
        for rid in request_ids:
            for block in self._committed.pop(rid, []):
                self.mirror.allocator.forget(block)
        self._recount()

    def free(self, request_id: int) -> None:
        if request_id in self.mirror:
            self.mirror.free(request_id)
        self.tokens.pop(request_id, None)
        self._grown.discard(request_id)
        self._recount()

    def clear(self) -> None:
        """The worker restarted with an empty cache: so does the mirror (the counters go on)."""
        stats = self.stats
        super().clear()
        self.mirror = KVBlockManager(self.num_blocks, self.block_size, self.prefix_root, self.stop_ids)
        self.mirror.allocator.stats = stats
        self._grown.clear()
        self._committed.clear()

    def _recount(self) -> None:
        self.used_blocks = self.num_blocks - self.mirror.allocator.num_free
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)


class KVLedger:
    """Every KV pool of the plan, keyed by (rank, node)."""

    def __init__(self) -> None:
        self.pools: dict[tuple[int, str], KVPoolLedger] = {}
        self.reported: dict[tuple[int, str], PrefixStats] = {}   # caches workers decide on their own

    def note_reported(self, rank: int, counts: Sequence[PrefixCounts]) -> None:
        """A worker's totals for the prefix caches it decides itself (BatchDone.prefix)."""
        for c in counts:
            self.reported[(rank, c.node)] = PrefixStats(queries=c.queries, hits=c.hits, hit_tokens=c.hit_tokens,
                                                       query_tokens=c.query_tokens, evictions=c.evictions)

    def add_pool(self, rank: int, node: str, num_blocks: int, block_size: int,
                 prefix_root: bytes | None = None, stop_ids: frozenset[int] = frozenset()) -> None:
        self.pools[(rank, node)] = (KVPoolLedger(num_blocks, block_size) if prefix_root is None
                                    else PrefixPoolLedger(num_blocks, block_size, prefix_root, stop_ids))

    def pool(self, rank: int, node: str) -> KVPoolLedger | None:
        return self.pools.get((rank, node))

    def commit(self) -> None:
        """The batches of this scheduling pass are formed: their full blocks count as cached."""
        for pool in self.pools.values():
            pool.commit()

    def prefix_stats(self) -> dict[tuple[int, str], PrefixStats]:
        """(rank, node) -> prefix-cache counters of every pool that caches prefixes."""
        mirrored = {key: pool.stats for key, pool in self.pools.items() if isinstance(pool, PrefixPoolLedger)}
        return {**self.reported, **mirrored}

    def free_request(self, request_id: int) -> None:
        for pool in self.pools.values():
            pool.free(request_id)

    def free_rank(self, rank: int) -> None:
        for (r, _), pool in self.pools.items():
            if r == rank:
                pool.clear()

    def usage(self) -> float:
        """Fraction of all KV blocks in use."""
        total = sum(p.num_blocks for p in self.pools.values())
        return 0.0 if total == 0 else sum(p.used_blocks for p in self.pools.values()) / total

    def peak_usage(self) -> float:
        """The highest fraction of its blocks any one pool ever held."""
        return max((p.peak_blocks / p.num_blocks for p in self.pools.values() if p.num_blocks), default=0.0)
