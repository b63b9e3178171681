"""The conductor's KV pools per (rank, KV node): every block table of every cache, owned here.

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

Nodes whose KV lives in one cache (BAGEL's LM and its `same_as` CFG branches on one rank: one module,
one cache) share one pool (`NodeInfo.kv_pool` names the node it is kept under; its size is the sum of
theirs): each is a `BranchPool` over it whose requests' tables are the pool's (request, node) ones, so
branches share blocks by equal key chains like requests do. A node whose family lays out its rows
(`Family.kv_rows`: BAGEL's segments) may ask for rows reused whole or computed whole (`try_grow(...,
whole=True)`: an image's rows attend to each other); such a pool keys a partly filled last block too, so
a segment ending mid-block is found again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Sequence

from runtime.model_executor.kv import BlockTable, KVBlockManager, OutOfBlocks, PrefixStats, chain_keys
from runtime.model_executor.kv.prefix_cache import Row
from runtime.transport.messages import NodeInfo, WorkItem

if TYPE_CHECKING:
    from runtime.conductor.plan_index import PlanIndex


class KVPoolLedger:
    """One KV pool the conductor owns: every request's block table (module docstring)."""

    recomputable = True     # a preempted request's context comes back by re-sending its tokens

    def __init__(self, num_blocks: int, block_size: int, prefix_root: bytes | None = None,
                 stop_ids: frozenset[int] = frozenset(), media_ids: frozenset[int] = frozenset(),
                 tails: bool = False) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.tails = tails and prefix_root is not None      # key partly filled last blocks too (whole reuse)
        self.members: list[str] = []                  # the nodes of its `BranchPool`s
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

    def try_grow(self, request_id: Hashable, n_new: int, tokens: Sequence[Row] | None = None,
                 whole: bool = False) -> int | None:
        """`grow` if `can_grow`, else None (one call for each row the scheduler places). A decode
        step's one row goes the short way (`KVBlockManager.append_row`): into its own partly filled
        last block, or into one fresh block after a full one. `whole`: the rows `tokens` are reused whole
        or computed whole (`extend`)."""
        if whole and self.tails and tokens is not None:
            return self._extend(request_id, tokens)
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

    def _extend(self, request_id: Hashable, rows: Sequence[Row]) -> int | None:
        """Room for `rows` after the request's, all reused or all computed; the rows reused (all or 0),
        None (nothing changed) when they do not fit. Another branch of the request holding exactly these
        rows (`_twin`) lends its table; else the cache is looked up (`KVBlockManager.extend`)."""
        twin = self._twin(request_id, rows)
        if twin is not None:
            if request_id in self.tables:
                self.tables.free(request_id)
            self.tables.fork(twin, request_id)
            self._grown.add(request_id)
            return len(rows)
        opened = request_id not in self.tables
        if opened:
            self.tables.open(request_id)
        try:
            reused, copies = self.tables.extend(request_id, rows)
        except OutOfBlocks:
            if opened:
                self.tables.free(request_id)
            return None
        if copies:
            self._copies.setdefault(request_id, []).extend(copies)
        self._grown.add(request_id)
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)
        return len(rows) if reused else 0

    def _twin(self, request_id: Hashable, rows: Sequence[Row]) -> Hashable | None:
        """A table of another branch of the same request (a (request, node) key of a `BranchPool`) that holds
        exactly the request's rows and then `rows`, written or being written this pass (BAGEL's CFG context
        copies: `cfg_text_context = deepcopy(gen_context)`)."""
        if not isinstance(request_id, tuple) or self.prefix_root is None:
            return None
        siblings = [(request_id[0], n) for n in self.members if (request_id[0], n) != request_id]
        siblings = [s for s in siblings if s in self.tables]
        want = self._content(self.tables.get(request_id), rows) if siblings else None
        if want is None:
            return None
        return next((s for s in siblings if self._content(self.tables.get(s), ()) == want), None)

    def _content(self, table: BlockTable | None, rows: Sequence[Row]) -> tuple[list, list] | None:
        """(full-block keys, rows after them) of a table followed by `rows`, keyed or not yet; None: unknown."""
        keys, pending = (table.keys, table.pending) if table is not None else ([], [])
        if pending is None:
            return None
        rest = [*pending, *rows]
        new = chain_keys(keys[-1] if keys else self.prefix_root, rest, self.block_size)
        return [*keys, *new], rest[len(new) * self.block_size:]

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
            self._committed = {rid: tables.commit(rid, self.tails) for rid in self._grown if rid in tables}
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

    def account(self) -> KVPoolLedger:
        """What holds this pool's capacity and use (for a `BranchPool`, the pool it shares)."""
        return self

    def free_blocks(self) -> int:
        return self.tables.allocator.num_free


class BranchPool:
    """One node's tables in a pool several nodes' KV lives in (module docstring): the pool's tables of
    (request, this node)."""

    # BAGEL's: a picture's rows are not tokens a recompute could re-send, so a request holding blocks here is
    # never preempted (its Runs wait for room) and a batch of it that fails is not retried (its context is gone)
    recomputable = False

    def __init__(self, pool: KVPoolLedger, node: str, reports: bool) -> None:
        self.pool, self.node = pool, node
        pool.members.append(node)
        self.reports = reports            # the node the pool's prefix counters are shown under
        self.block_size, self.media_ids = pool.block_size, pool.media_ids

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def stats(self) -> PrefixStats | None:
        return self.pool.stats if self.reports else None

    def held(self, request_id: int) -> int:
        return self.pool.held((request_id, self.node))

    def cached_prefix(self, request_id: int, tokens: Sequence[Row]) -> int:
        return self.pool.cached_prefix((request_id, self.node), tokens)

    def fits_alone(self, request_id: int, n_new: int) -> bool:
        return self.pool.fits_alone((request_id, self.node), n_new)

    def try_grow(self, request_id: int, n_new: int, tokens: Sequence[Row] | None = None,
                 whole: bool = False) -> int | None:
        return self.pool.try_grow((request_id, self.node), n_new, tokens, whole)

    def place_row(self, request_id: int, tokens: Sequence[int], item: WorkItem) -> bool:
        return self.pool.place_row((request_id, self.node), tokens, item)

    def tell(self, request_id: int, item: WorkItem) -> None:
        self.pool.tell((request_id, self.node), item)

    def commit(self) -> None:
        self.pool.commit()

    def forget(self, request_ids: Sequence[int]) -> None:
        self.pool.forget([(rid, self.node) for rid in request_ids])

    def free(self, request_id: int) -> None:
        self.pool.free((request_id, self.node))

    def clear(self, num_blocks: int | None = None) -> None:
        self.pool.clear()

    def holders(self) -> list[int]:
        """Requests holding blocks of the shared pool (any branch): freeing one frees all its branches."""
        return sorted({rid for rid, _ in self.pool.holders()})

    def account(self) -> KVPoolLedger:
        return self.pool

    def free_blocks(self) -> int:
        return self.pool.free_blocks()


Pool = KVPoolLedger | BranchPool


class KVLedger:
    """Every KV pool of the plan, keyed by (rank, node)."""

    def __init__(self) -> None:
        self.pools: dict[tuple[int, str], Pool] = {}

    def add_rank(self, rank: int, nodes: Sequence[NodeInfo], index: PlanIndex, prefix_cache: bool) -> None:
        """The pools of a rank that reported Ready. A node's pool caches prefixes when that is on and
        the node is whole on each rank; a TP group's ranks all take the lead's tables (every rank of
        it runs the same Runs), so the lead's pool gets the group's smallest size. Nodes naming one
        `kv_pool` share one pool of the sum of their sizes."""
        shared_sizes: dict[str, int] = {}
        for info in nodes:
            if info.kv_blocks and info.kv_pool:
                shared_sizes[info.kv_pool] = shared_sizes.get(info.kv_pool, 0) + info.kv_blocks
        shared: dict[str, KVPoolLedger] = {}
        for info in nodes:
            if not info.kv_blocks:
                continue
            whole = index.nodes[info.name].placement.tp_size == 1
            root = bytes.fromhex(info.kv_prefix_key) if prefix_cache and info.kv_prefix_key and whole else None
            args = (root, frozenset(info.kv_prefix_stop_ids), frozenset(info.kv_media_ids))
            if not info.kv_pool:
                self.add_pool(rank, info.name, info.kv_blocks, info.kv_block_size, *args)
                continue
            pool = shared.get(info.kv_pool)
            if pool is None:
                pool = shared[info.kv_pool] = KVPoolLedger(shared_sizes[info.kv_pool], info.kv_block_size, *args,
                                                           tails=True)
            self.pools[(rank, info.name)] = BranchPool(pool, info.name, reports=info.name == info.kv_pool)
        for node in index.kv_nodes():
            if node.placement.tp_size > 1:
                pools = [self.pool(r, node.name) for r in node.placement.ranks]
                smallest = min((p.num_blocks for p in pools if p is not None), default=0)
                if all(pools) and pools[0].num_blocks != smallest:
                    pools[0].clear(smallest)

    def add_pool(self, rank: int, node: str, num_blocks: int, block_size: int,
                 prefix_root: bytes | None = None, stop_ids: frozenset[int] = frozenset(),
                 media_ids: frozenset[int] = frozenset()) -> None:
        self.pools[(rank, node)] = KVPoolLedger(num_blocks, block_size, prefix_root, stop_ids, media_ids)

    def pool(self, rank: int, node: str) -> Pool | None:
        return self.pools.get((rank, node))

    def commit(self) -> None:
        """The batches of this scheduling pass are formed: their full blocks count as cached."""
        for pool in self.pools.values():
            pool.commit()

    def prefix_stats(self) -> dict[tuple[int, str], PrefixStats]:
        """(rank, node) -> prefix-cache counters of every pool that caches prefixes (a shared one under
        the node it is kept under)."""
        return {key: pool.stats for key, pool in self.pools.items() if pool.stats is not None}

    def recomputes(self, request_id: int) -> bool:
        """Whether the request's KV context can be taken back and computed again (`recomputable` pools only)."""
        return all(pool.recomputable or not pool.held(request_id) for pool in self.pools.values())

    def free_request(self, request_id: int) -> None:
        for pool in self.pools.values():
            pool.free(request_id)

    def free_rank(self, rank: int) -> None:
        for (r, _), pool in self.pools.items():
            if r == rank:
                pool.clear()

    def accounts(self, node: str | None = None) -> list[KVPoolLedger]:
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
