"""The conductor's KV pools per (rank, KV node): the block tables it owns, and the caches it counts.

A pool the conductor owns is a `KVPoolLedger`: its `KVBlockManager` holds every request's block
table (runtime/model_executor/kv/block_manager.py). The scheduler grows a request's table when it
places a Run (`try_grow`: room for the Run's tokens, reusing cached full blocks where the node caches
prefixes, its `NodeInfo.kv_prefix_key`) and `tell`s the Run what changed in the table
(`WorkItem.kv_at` / `kv_blocks` / `kv_copies`: the full table on a request's first Run, then only new
blocks); the worker keeps its copy (runtime/model_executor/kv/block_tables.py) and allocates nothing,
so it never runs out and never disagrees. Full blocks are keyed (`commit`) once the pass's batches are
formed: the worker runs a pool's batches in order, so a later batch that reuses them reads what the
earlier one wrote; a batch that fails un-keys what it was to write (`forget`). Placeholder ids
(`NodeInfo.kv_prefix_stop_ids`) stop caching, unless the Run's tokens are the placeholders of a media
item and the node names those by it (`NodeInfo.kv_media_ids`, runtime/conductor/media_keys.py: the
Qwen3-Omni thinker). Admission is exact: a request is charged the blocks it really takes, reused ones
included or not as they are held, a later piece of its prompt too (`needed`).

A pool whose worker decides reuse itself (BAGEL: rows named by digests of the encoders' output,
runtime/model_executor/kv/prefix_cache.py) is a `ReportedPoolLedger`: the conductor cannot know
beforehand which blocks its worker will share, so it counts what the worker reports. Each
BatchDone (and a `KVUsage` after a close) carries the blocks the worker's cache holds right then
(`NodeInfo.kv_reported` names the node that reports for a cache several nodes share: BAGEL's
three CFG branches). The pool's use is that
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
from runtime.transport.messages import NodeInfo, PrefixCounts, WorkItem

if TYPE_CHECKING:
    from runtime.conductor.plan_index import PlanIndex


class KVPoolLedger:
    """One KV pool the conductor owns: every request's block table (module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_root: bytes | None = None,
                 stop_ids: frozenset[int] = frozenset(), media_ids: frozenset[int] = frozenset()) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_root, self.stop_ids = prefix_root, stop_ids
        # placeholder ids whose rows are named by the media item a Run reads (runtime/conductor/media_keys.py)
        self.media_ids = media_ids if prefix_root is not None else frozenset()
        self.tables = KVBlockManager(num_blocks, block_size, prefix_root, stop_ids)
        self.peak_blocks = 0                          # most blocks ever held at once
        self._grown: set[int] = set()                 # requests grown since the last commit (prefix caching)
        self._committed: dict[int, list[int]] = {}    # request -> blocks its last commit keyed
        self._copies: dict[int, list[tuple[int, int]]] = {}   # request -> copies its worker has not been told

    @property
    def used_blocks(self) -> int:
        """Blocks held now (a cached block no request holds is free: it can be handed out)."""
        return self.num_blocks - self.tables.allocator.num_free

    @property
    def stats(self) -> PrefixStats | None:
        return self.tables.allocator.stats if self.prefix_root is not None else None

    def held(self, request_id: int) -> int:
        """Tokens the request's table holds (0: none)."""
        table = self.tables.get(request_id)
        return 0 if table is None else table.num_tokens

    def _reuse(self, request_id: int, tokens: Sequence[int] | None) -> int:
        if tokens is None or self.prefix_root is None:
            return 0
        return self.tables.prefix_hit(tokens, after=request_id if request_id in self.tables else None)

    def cached_prefix(self, request_id: int, tokens: Sequence[int]) -> int:
        """Leading `tokens` (the request's next ones) a Run would reuse from the cache."""
        return self._reuse(request_id, tokens)

    def needed(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None, reuse: int | None = None) -> int:
        """Blocks growing by `n_new` tokens takes from the free ones, its first `reuse` in cached blocks
        (None: as many as the cache holds), exactly: a later piece of a prompt too."""
        reuse = self._reuse(request_id, tokens) if reuse is None else reuse
        if request_id in self.tables:
            return self.tables.append_needs(request_id, n_new, tokens, reuse)
        return self.tables.blocks_needed(n_new, tokens, reuse)

    def fits_alone(self, request_id: int, n_new: int) -> bool:
        """Whether the request's cache after growing fits the pool at all (with nobody else in it)."""
        return -(-(self.held(request_id) + n_new) // self.block_size) <= self.num_blocks

    def can_grow(self, request_id: int, n_new: int, reserved: int = 0, tokens: Sequence[int] | None = None) -> bool:
        return self.needed(request_id, n_new, tokens) + reserved <= self.tables.allocator.num_free

    def try_grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int | None:
        """`grow` if `can_grow`, else None (one call for each row the scheduler places). A decode
        step's one row goes the short way (`KVBlockManager.append_row`): into its own partly filled
        last block, or into one fresh block after a full one."""
        if n_new == 1 and self.tables.append_row(request_id, tokens):
            if self.prefix_root is not None:
                self._grown.add(request_id)
            used = self.used_blocks
            if used > self.peak_blocks:
                self.peak_blocks = used
            return 0
        reuse = self._reuse(request_id, tokens)    # looked up once for both
        if self.needed(request_id, n_new, tokens, reuse) > self.tables.allocator.num_free:
            return None
        return self.grow(request_id, n_new, tokens, reuse)

    def grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None, reuse: int | None = None) -> int:
        """Room for `n_new` more tokens (ids `tokens`, if known), the first `reuse` in cached blocks (None:
        as many as the cache holds); returns those (`WorkItem.cached`). OutOfBlocks if they do not fit."""
        reuse = self._reuse(request_id, tokens) if reuse is None else reuse
        if request_id in self.tables:
            copies = self.tables.append(request_id, n_new, tokens, reuse)
            if copies:
                self._copies.setdefault(request_id, []).extend(copies)
        else:
            self.tables.allocate(request_id, n_new, tokens, reuse)
        if self.prefix_root is not None:
            self._grown.add(request_id)
        used = self.used_blocks
        if used > self.peak_blocks:
            self.peak_blocks = used
        return reuse

    def place_row(self, request_id: int, tokens: Sequence[int], item: WorkItem) -> bool:
        """A decode row's one token into its request's own partly filled last block, nothing to tell
        (the usual decode step; a steady row's hot path): `try_grow` and `tell` in one call. False,
        changing nothing, when the row needs more (a block, a copy, a change the worker was not told)."""
        if not self.tables.append_in_place(request_id, tokens, told=True):
            return False
        if self.prefix_root is not None:
            self._grown.add(request_id)
        item.cached = 0
        if item.kv_at != -1 or item.kv_copies:    # what the item's last Run was told (a steady row's item is kept)
            item.kv_at, item.kv_blocks, item.kv_copies = -1, [], []
        return True

    def tell(self, request_id: int, item: WorkItem) -> None:
        """Put in the request's Run what its worker's copy of the table lacks (runtime/model_executor/
        kv/block_tables.py): the blocks from `kv_at` on (-1: none changed) and the copies to make first."""
        at, blocks = self.tables.changes(request_id)
        item.kv_at, item.kv_blocks = (at, blocks) if blocks else (-1, blocks)
        item.kv_copies = self._copies.pop(request_id, []) if self._copies else []

    def commit(self) -> None:
        """The batches of this scheduling pass are formed: their full blocks count as cached."""
        if self._grown:   # else this pass formed no batch here: the one in flight keeps its record
            tables = self.tables
            self._committed = {rid: tables.commit(rid) for rid in self._grown if rid in tables}
            self._grown.clear()

    def forget(self, request_ids: Sequence[int]) -> None:
        """The batch that was to write these requests' latest blocks failed: they are not cached."""
        for rid in request_ids:
            for block in self._committed.pop(rid, []):
                self.tables.allocator.forget(block)

    def free(self, request_id: int) -> None:
        if request_id in self.tables:
            self.tables.free(request_id)
        self._grown.discard(request_id)
        self._copies.pop(request_id, None)

    def clear(self, num_blocks: int | None = None) -> None:
        """The worker restarted with an empty cache (of `num_blocks`, if given): so do the tables
        (the prefix counters go on)."""
        stats = self.stats
        self.num_blocks = self.num_blocks if num_blocks is None else num_blocks
        self.tables = KVBlockManager(self.num_blocks, self.block_size, self.prefix_root, self.stop_ids)
        if stats is not None:
            self.tables.allocator.stats = stats
        self._grown.clear()
        self._committed.clear()
        self._copies.clear()

    def holders(self) -> list[int]:
        return self.tables.requests()

    def account(self) -> KVPoolLedger | ReportedCache:
        """What holds this pool's capacity and use (a cache several pools share, or the pool)."""
        return self

    def frees_pending(self) -> bool:
        """Whether blocks freed here come back later (a reported cache): a preemption for room
        then waits for the worker's report instead of taking the next victim at once."""
        return False

    def free_blocks(self) -> int:
        return self.tables.allocator.num_free


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


class ReportedPoolLedger:
    """A pool of a `ReportedCache`: tokens per request (for fitting and preemption) and the
    blocks charged to its Run in flight (at most one batch per (rank, node) is)."""

    def __init__(self, num_blocks: int, block_size: int, cache: ReportedCache, node: str) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.tokens: dict[int, int] = {}     # request id -> tokens in the cache (the cache counts blocks)
        self.cache, self.charged = cache, 0
        self.media_ids: frozenset[int] = frozenset()   # the worker names its rows itself
        cache.members[node] = self
        cache.num_blocks += num_blocks

    def held(self, request_id: int) -> int:
        return self.tokens.get(request_id, 0)

    def needed(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int:
        """Every block new, and one more when the last block is partly filled: the worker may
        have shared it (a fork) and copy it before writing."""
        held, size = self.tokens.get(request_id, 0), self.block_size
        partial = n_new > 0 and held % size != 0
        return (-held // size) - (-(held + n_new) // size) + partial   # ceil(after) - ceil(before), + a copy

    def fits_alone(self, request_id: int, n_new: int) -> bool:
        return -(-(self.tokens.get(request_id, 0) + n_new) // self.block_size) <= self.num_blocks

    def can_grow(self, request_id: int, n_new: int, reserved: int = 0, tokens: Sequence[int] | None = None) -> bool:
        return self.needed(request_id, n_new) + reserved <= self.cache.num_blocks - self.cache.used_blocks

    def try_grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int | None:
        return self.grow(request_id, n_new, tokens) if self.can_grow(request_id, n_new, tokens=tokens) else None

    def grow(self, request_id: int, n_new: int, tokens: Sequence[int] | None = None) -> int:
        """Charge the Run in full; the worker decides reuse itself (returns 0: the conductor reuses nothing)."""
        self.charged += self.needed(request_id, n_new)
        self.tokens[request_id] = self.tokens.get(request_id, 0) + n_new
        self.cache.peak_blocks = max(self.cache.peak_blocks, self.cache.used_blocks)
        return 0

    def cached_prefix(self, request_id: int, tokens: Sequence[int]) -> int:
        return 0

    def place_row(self, request_id: int, tokens: Sequence[int], item: WorkItem) -> bool:
        """Never: each Run is charged in full (`try_grow`)."""
        return False

    def tell(self, request_id: int, item: WorkItem) -> None:
        """Nothing to tell: the worker keeps this pool's tables."""
        return None

    def commit(self) -> None:
        return None

    def forget(self, request_ids: Sequence[int]) -> None:
        """The batch failed: what it allocated before failing counts until the worker's next report."""
        self.cache.unsettled += self.charged
        self.charged = 0

    def free(self, request_id: int) -> None:
        """The blocks come back once the worker reports the close (KVUsage naming the request)."""
        if self.tokens.pop(request_id, None) is not None:
            self.cache.awaiting.add(request_id)

    def clear(self, num_blocks: int | None = None) -> None:
        self.tokens.clear()
        self.charged = 0
        self.cache.reported = self.cache.unsettled = 0
        self.cache.awaiting.clear()

    def holders(self) -> list[int]:
        return list(self.tokens)

    def account(self) -> ReportedCache:
        return self.cache

    def frees_pending(self) -> bool:
        return bool(self.cache.awaiting)

    def free_blocks(self) -> int:
        return self.cache.num_blocks - self.cache.used_blocks


Pool = KVPoolLedger | ReportedPoolLedger


class KVLedger:
    """Every KV pool of the plan, keyed by (rank, node)."""

    def __init__(self) -> None:
        self.pools: dict[tuple[int, str], Pool] = {}
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
        """The pools of a rank that reported Ready. A node's pool caches prefixes when that is on and
        the node is whole on each rank; a TP group's ranks all take the lead's tables (every rank of
        it runs the same Runs), so the lead's pool gets the group's smallest size."""
        self.reported_caches = {key: c for key, c in self.reported_caches.items() if key[0] != rank}   # anew
        for info in nodes:
            if not info.kv_blocks:
                continue
            whole = index.nodes[info.name].placement.tp_size == 1
            root = bytes.fromhex(info.kv_prefix_key) if prefix_cache and info.kv_prefix_key and whole else None
            # a TP group's ranks decide alike but only the lead answers: counted as a plain pool
            self.add_pool(rank, info.name, info.kv_blocks, info.kv_block_size, root,
                          frozenset(info.kv_prefix_stop_ids), reported_by=info.kv_reported if whole else "",
                          media_ids=frozenset(info.kv_media_ids))
        for node in index.kv_nodes():
            if node.placement.tp_size > 1:
                pools = [self.pool(r, node.name) for r in node.placement.ranks]
                smallest = min((p.num_blocks for p in pools if p is not None), default=0)
                if all(pools) and pools[0].num_blocks != smallest:
                    pools[0].clear(smallest)

    def add_pool(self, rank: int, node: str, num_blocks: int, block_size: int,
                 prefix_root: bytes | None = None, stop_ids: frozenset[int] = frozenset(),
                 reported_by: str = "", media_ids: frozenset[int] = frozenset()) -> None:
        """`reported_by`: the node whose reports count the worker cache this pool is part of."""
        old = self.pools.get((rank, node))
        if isinstance(old, ReportedPoolLedger):    # a worker that joins again loads its nodes anew
            old.cache.members.pop(node, None)
            old.cache.num_blocks -= old.num_blocks
        if reported_by:
            cache = self.reported_caches.setdefault((rank, reported_by), ReportedCache())
            self.pools[(rank, node)] = ReportedPoolLedger(num_blocks, block_size, cache, node)
        else:
            self.pools[(rank, node)] = KVPoolLedger(num_blocks, block_size, prefix_root, stop_ids, media_ids)

    def pool(self, rank: int, node: str) -> Pool | None:
        return self.pools.get((rank, node))

    def commit(self) -> None:
        """The batches of this scheduling pass are formed: their full blocks count as cached."""
        for pool in self.pools.values():
            pool.commit()

    def prefix_stats(self) -> dict[tuple[int, str], PrefixStats]:
        """(rank, node) -> prefix-cache counters of every pool that caches prefixes."""
        owned = {key: pool.stats for key, pool in self.pools.items()
                 if isinstance(pool, KVPoolLedger) and pool.stats is not None}
        return {**self.reported, **owned}

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
