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

A pool whose worker decides reuse itself (BAGEL: rows named by digests of the encoders' output,
the Qwen3-Omni thinker: media rows named by their embeds; runtime/model_executor/kv/prefix_cache.py) is a
`ReportedPoolLedger`: the conductor cannot know beforehand which blocks its worker will share,
so it counts what the worker reports. Each BatchDone (and a `KVUsage` after a close) carries
the blocks the worker's cache holds right then (`NodeInfo.kv_reported` names the node that
reports for a cache several nodes share: BAGEL's three CFG branches). The pool's use is that
count plus the blocks charged, in full (every block new, one more for a copy-on-write of a
shared partly filled last block), to Runs the worker has not yet answered. That is an upper
bound at every moment: what a report counts can only shrink by frees, and what it has not seen
yet is charged in full. So a request reusing cached blocks (an image seen before, a CFG branch
forked from another) costs its full blocks until its first batch is answered and only what it
really took from then on; a free counts once the worker reports the close (so a preemption for
room takes one victim and waits for that report before it takes another). Its prefix
counters come from the worker too (`note_reported`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from runtime.model_executor.kv import KVBlockManager, PrefixStats
from runtime.transport.messages import NodeInfo, PrefixCounts

if TYPE_CHECKING:
    from runtime.conductor.plan_index import PlanIndex


@dataclass
class KVPoolLedger:
    """One KV pool: capacity and tokens held per request."""

    num_blocks: int
    block_size: int
    tokens: dict[int, int] = field(default_factory=dict)   # request id -> tokens in the cache
    peak_blocks: int = 0                                     # most blocks ever held at once
    used_blocks: int = 0                                     # blocks held now: the sum over `tokens`

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "try_grow" not in cls.__dict__:    # a pool with its own count: the inline one is not its
            cls.try_grow = KVPoolLedger.checked_grow

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

    def try_grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int | None:
        """`grow` if `can_grow`, else None: one call for each row the scheduler places (here the
        two inline, one count of the blocks; the other pools check then grow, `checked_grow`)."""
        held, size = self.tokens.get(request_id, 0), self.block_size
        needed = (-held // size) - (-(held + n_new) // size)
        if needed > self.num_blocks - self.used_blocks:
            return None
        self.used_blocks += needed
        self.tokens[request_id] = held + n_new
        if self.used_blocks > self.peak_blocks:
            self.peak_blocks = self.used_blocks
        return 0

    def checked_grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int | None:
        if not self.can_grow(request_id, n_new, tokens=tokens):
            return None
        return self.grow(request_id, n_new, tokens)

    def grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int:
        """Count `n_new` more tokens (ids `tokens` if known); returns the cached prompt tokens
        the worker reuses (always 0 here: this pool caches no prefixes)."""
        held, size = self.tokens.get(request_id, 0), self.block_size
        self.used_blocks += (-held // size) - (-(held + n_new) // size)
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

    def account(self) -> KVPoolLedger | ReportedCache:
        """What holds this pool's capacity and use (a cache several pools share, or the pool)."""
        return self

    def frees_pending(self) -> bool:
        """Whether blocks freed here come back later (a reported cache): a preemption for room
        then waits for the worker's report instead of taking the next victim at once."""
        return False

    def free_blocks(self) -> int:
        account = self.account()
        return account.num_blocks - account.used_blocks


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

    def try_grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int | None:
        """`checked_grow`, but a decode step's one row into its own partly filled last block goes
        straight there: it needs no block (so it always fits), reuses nothing and frees nothing."""
        if n_new == 1 and self.mirror.append_in_place(request_id, tokens):
            self._grown.add(request_id)
            self.tokens[request_id] = self.tokens.get(request_id, 0) + 1
            return 0
        return self.checked_grow(request_id, n_new, tokens)

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


@dataclass
class ReportedCache:
    """One worker cache that decides reuse itself, counted from its reports; the pools of the
    nodes that share it (BAGEL's CFG branches) each charge their unanswered Runs here."""

    num_blocks: int = 0                 # the cache's blocks: the sum of its nodes' pools
    reported: int = 0                   # blocks it held at the worker's latest report
    unsettled: int = 0                  # charges of failed batches, settled by the next report
    peak_blocks: int = 0
    members: dict[str, ReportedPoolLedger] = field(default_factory=dict)   # node -> its pool
    awaiting: set[int] = field(default_factory=set)   # requests freed here whose close is not reported yet

    @property
    def used_blocks(self) -> int:
        return self.reported + self.unsettled + sum(m.charged for m in self.members.values())

    def note_used(self, used: int, node: str | None) -> None:
        """The worker's count, sent after it answered `node`'s batch (None: after a close): it covers
        that batch and every one it answered or failed before."""
        self.reported, self.unsettled = used, 0
        if node in self.members:
            self.members[node].charged = 0
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)


class ReportedPoolLedger(KVPoolLedger):
    """A pool of a `ReportedCache`: tokens per request (for fitting and preemption) and the
    blocks charged to its Run in flight (at most one batch per (rank, node) is)."""

    def __init__(self, num_blocks: int, block_size: int, cache: ReportedCache, node: str) -> None:
        super().__init__(num_blocks, block_size)
        self.cache, self.charged = cache, 0
        cache.members[node] = self
        cache.num_blocks += num_blocks

    def account(self) -> ReportedCache:
        return self.cache

    def needed(self, request_id: int, n_new: int) -> int:
        """Every block new, and one more when the last block is partly filled: the worker may
        have shared it (a fork) and copy it before writing."""
        partial = n_new > 0 and self.tokens.get(request_id, 0) % self.block_size != 0
        return super().needed(request_id, n_new) + partial

    def can_grow(self, request_id: int, n_new: int, reserved: int = 0, tokens: Sequence[int] | None = None) -> bool:
        return self.needed(request_id, n_new) + reserved <= self.cache.num_blocks - self.cache.used_blocks

    def grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int:
        self.charged += self.needed(request_id, n_new)
        self.used_blocks += super().needed(request_id, n_new)    # this pool's full count, for show
        self.tokens[request_id] = self.tokens.get(request_id, 0) + n_new
        self.cache.peak_blocks = max(self.cache.peak_blocks, self.cache.used_blocks)
        return 0

    def forget(self, request_ids: Sequence[int]) -> None:
        """The batch failed: what it allocated before failing counts until the worker's next report."""
        self.cache.unsettled += self.charged
        self.charged = 0

    def free(self, request_id: int) -> None:
        """The blocks come back once the worker reports the close (KVUsage naming the request)."""
        if request_id in self.tokens:
            self.cache.awaiting.add(request_id)
        super().free(request_id)

    def frees_pending(self) -> bool:
        return bool(self.cache.awaiting)

    def clear(self) -> None:
        super().clear()
        self.charged = 0
        self.cache.reported = self.cache.unsettled = 0
        self.cache.awaiting.clear()


class KVLedger:
    """Every KV pool of the plan, keyed by (rank, node)."""

    def __init__(self) -> None:
        self.pools: dict[tuple[int, str], KVPoolLedger] = {}
        self.reported: dict[tuple[int, str], PrefixStats] = {}   # caches workers decide on their own
        self.reported_caches: dict[tuple[int, str], ReportedCache] = {}   # (rank, reporting node) -> its cache

    def note_reported(self, rank: int, counts: Sequence[PrefixCounts]) -> None:
        """A worker's totals for the prefix caches it decides itself (BatchDone.prefix)."""
        for c in counts:
            self.reported[(rank, c.node)] = PrefixStats(queries=c.queries, hits=c.hits, hit_tokens=c.hit_tokens,
                                                       query_tokens=c.query_tokens, evictions=c.evictions)

    def note_used(self, rank: int, used: dict[str, int], node: str | None = None,
                  closed: Sequence[int] = ()) -> None:
        """A worker's counts of its reported caches (by reporting node), sent after `node`'s batch
        (BatchDone.kv_used) or after closing the requests `closed` (KVUsage)."""
        for reporter, blocks in used.items():
            cache = self.reported_caches.get((rank, reporter))
            if cache is not None:
                cache.note_used(blocks, node)
                cache.awaiting.difference_update(closed)

    def add_rank(self, rank: int, nodes: Sequence[NodeInfo], index: PlanIndex, prefix_cache: bool) -> None:
        """The pools of a rank that reported Ready. A node's pool mirrors its worker's prefix cache
        when that is on and the node is whole on each rank (a TP group's ranks would each need the
        lead's count); a TP group's caches advance in lockstep, so the lead's (counted) pool gets
        the group's smallest size."""
        self.reported_caches = {key: c for key, c in self.reported_caches.items() if key[0] != rank}   # anew
        for info in nodes:
            if not info.kv_blocks:
                continue
            whole = index.nodes[info.name].placement.tp_size == 1
            root = bytes.fromhex(info.kv_prefix_key) if prefix_cache and info.kv_prefix_key and whole else None
            # a TP group's ranks decide alike but only the lead answers: counted as a plain pool
            self.add_pool(rank, info.name, info.kv_blocks, info.kv_block_size, root,
                          frozenset(info.kv_prefix_stop_ids), reported_by=info.kv_reported if whole else "")
        for node in index.kv_nodes():
            if node.placement.tp_size > 1:
                pools = [self.pool(r, node.name) for r in node.placement.ranks]
                if all(pools):
                    pools[0].num_blocks = min(p.num_blocks for p in pools)

    def add_pool(self, rank: int, node: str, num_blocks: int, block_size: int,
                 prefix_root: bytes | None = None, stop_ids: frozenset[int] = frozenset(),
                 reported_by: str = "") -> None:
        """`reported_by`: the node whose reports count the worker cache this pool is part of."""
        old = self.pools.get((rank, node))
        if isinstance(old, ReportedPoolLedger):    # a worker that joins again loads its nodes anew
            old.cache.members.pop(node, None)
            old.cache.num_blocks -= old.num_blocks
        if reported_by:
            cache = self.reported_caches.setdefault((rank, reported_by), ReportedCache())
            self.pools[(rank, node)] = ReportedPoolLedger(num_blocks, block_size, cache, node)
        elif prefix_root is not None:
            self.pools[(rank, node)] = PrefixPoolLedger(num_blocks, block_size, prefix_root, stop_ids)
        else:
            self.pools[(rank, node)] = KVPoolLedger(num_blocks, block_size)

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

    def accounts(self, node: str | None = None) -> list[KVPoolLedger | ReportedCache]:
        """Each pool's capacity holder once (a shared cache counts once), of `node`'s pools or all."""
        found = {id(a): a for (_, n), p in self.pools.items() if node in (None, n) for a in [p.account()]}
        return list(found.values())

    def usage(self) -> float:
        """Fraction of all KV blocks in use."""
        accounts = self.accounts()
        total = sum(a.num_blocks for a in accounts)
        return 0.0 if total == 0 else sum(a.used_blocks for a in accounts) / total

    def peak_usage(self) -> float:
        """The highest fraction of its blocks any one pool (or shared cache) ever held."""
        return max((a.peak_blocks / a.num_blocks for a in self.accounts() if a.num_blocks), default=0.0)
