"""Picks the next batches: one per (rank, node), across requests, within KV capacity.

Continuous batching at node granularity: every request whose track rests on a `Run` of
node N is a candidate for N's next batch, whatever walk or iteration it is in, so a new
request's prefill joins the running decode loop between iterations.

Placement: a batch of a tensor-parallel node goes to its lead rank and, in step, to every
rank of the group (`PlannedBatch.group`); a Run of a KV node on another rank than the one
holding the request's cache (prefill/decode disaggregation) moves the cache there first
(`Entry.kv_from`), counted in the new pool and freed from the old one. A node placed on
several ranks without TP is a set of data-parallel replicas: a request's first Run of it
goes to the least loaded replica and its later Runs (later walks too) stay there, by its
KV cache, until a preemption frees that cache (`Request.replicas`).

Chunked prefill: a prompt longer than `prefill_chunk_tokens` goes to a node whose worker
takes chunks (`NodeInfo.prefill_chunks`) one chunk per step, in the same batch as the
running decodes, so a long prompt never stalls the decoding requests on its rank for more than one
chunk's forward. The Run's cursor stays on it until its last chunk comes back. A short
tail (at most a quarter chunk) rides with the chunk before it. A request alone in the system
(nothing running or waiting beside it) takes larger chunks (`prefill_chunk_alone_tokens`):
no stream is there to keep flowing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from mstar_compiler.catalogue import load_families, load_ref
from mstar_compiler.plan import Plan
from runtime.conductor.batch import Entry, PlannedBatch
from runtime.conductor.cursor import PendingRun
from runtime.conductor.kv_ledger import KVLedger, Pool
from runtime.conductor.media_keys import media_names, medium, run_rows
from runtime.conductor.plan_index import PlanIndex, RunFacts
from runtime.conductor.request import MediaInput, Request, RequestState, SizedInput
from runtime.conductor.steady import steady_row
from runtime.conductor.streams import StreamLedger
from runtime.model_executor.kv.run_rows import KVRowRule, KVRun, Medium
from runtime.transport.messages import Route, WorkItem


# a prompt's last piece of at most 1/TAIL_FRACTION of a chunk joins the chunk before it (a 276-token
# prompt is one forward, not 256 + 20: the second forward would cost a whole decode step's fixed work)
TAIL_FRACTION = 4


@dataclass
class SchedulerConfig:
    max_running: int = 256           # requests admitted at once (RUNNING + PREEMPTED)
    # rows per batch: an LM's new tokens (prefill rows + decode rows), an encoder's rows (its pictures' or
    # utterances' placeholders), so one call's activations stay within what the memory plan keeps free
    max_batch_tokens: int = 4096
    batch_invariant: bool = False    # one Run per batch: no output depends on what else is running
    # prompt tokens per prefill chunk (0: whole prompts). 256 rows keep a CPU forward's GEMMs
    # compute-bound (past ~128 rows they run near peak FLOP/s), while a chunk's forward costs
    # a few decode steps of a small model, so the running requests keep decoding
    prefill_chunk_tokens: int = 256
    # the chunk of a prompt whose request is the only one in the system (0: prefill_chunk_tokens).
    # No stream waits on it, and fewer, larger forwards take long prompts faster on CPU (fewer
    # forwards' fixed costs, the keys packed for attention fewer times; docs/benchmark-log.md);
    # a request arriving meanwhile waits for at most one such chunk, then chunks shrink again
    prefill_chunk_alone_tokens: int = 1024


def kv_row_rules(plan: Plan) -> dict[str, KVRowRule]:
    """node -> the rows its next Run writes, for the KV nodes whose family declares them (`Family.kv_rows`)."""
    declared = {name: ref for family in load_families().values() for name, ref in family.kv_rows.items()}
    return {n.name: load_ref(declared[n.executor])(plan, n)
            for n in plan.nodes if n.kv_pools and n.executor in declared}


class Scheduler:
    """Forms batches; owns nothing but the decision (state lives in requests and the ledger)."""

    def __init__(self, index: PlanIndex, ledger: KVLedger, config: SchedulerConfig,
                 preempt: Callable[[Request], None], lookup: Callable[[int], Request],
                 streams: StreamLedger | None = None) -> None:
        self.lookup = lookup
        self.streams = streams      # streaming edges: back-pressure, chunk readiness, takes and routes
        self.index = index
        self.ledger = ledger
        self.config = config
        self.preempt = preempt
        self._load: dict[tuple[int, str], int] = {}   # (rank, node) -> requests bound to that replica
        self.rejected: list[tuple[Request, str]] = []  # requests whose cache can never fit (last schedule)
        self.holds = 0                                 # admissions held back for KV room (once per wait)
        self.preemptions = 0                           # requests whose cache was taken back for another
        self._held: set[int] = set()                   # requests waiting for KV room now
        self.admitted: list[Request] = []              # requests the last schedule admitted or resumed
        self._open: set[tuple[int, str]] = set()       # (rank, node) batches not yet full this step
        self._cohorts: dict[tuple[int, str], int] = {}  # (rank, walk) of a loop of several nodes -> its op this step
        self.chunked_prefill: set[tuple[int, str]] = set()   # (rank, node) whose worker takes prompt chunks
        self._chunk_tokens = config.prefill_chunk_tokens      # this step's chunk (_chunk_size)
        # per-node facts asked for every placed Run, read once from the plan
        self._batch_limit = {n: 1 if config.batch_invariant else node.max_batch for n, node in index.nodes.items()}
        self._tp = {n: node.placement.tp_size > 1 for n, node in index.nodes.items()}
        self._facts = index.facts_memo     # (walk, node) -> RunFacts asked so far (index.facts adds the rest)
        self._passes = 0                   # scheduling passes so far (`Request.placed_pass` counts in them)
        self._kv_rows = kv_row_rules(index.plan)    # node -> the rule of a node whose tokens do not say its rows

    def schedule(self, running: list[Request], waiting: list[Request], busy: set[tuple[int, str]],
                 ready_ranks: set[int], cohorts: set[tuple[int, str]] = frozenset()) -> list[PlannedBatch]:
        # Invariant: after this call every KV pool's held blocks (ledger) <= its capacity, every
        # planned item's blocks are already counted, and each (rank, node) has at most one
        # batch in flight — so a worker never runs out of blocks and never sees a request twice.
        # `cohorts`: (rank, walk) of the loops of several nodes that have a batch in flight there. A rank
        # runs one op of such a loop at a time (a Parallel's branches are one op): its other rows there wait
        # for the batches in flight (or, in one step, for the op the first of them was placed at), and when
        # they return their rows and the waiting ones form one batch. A rank runs its batches one after
        # another, so waiting costs them nothing; dispatched at once, two groups of a loop's rows would
        # alternate between its nodes in half-full batches for ever.
        batches: dict[tuple[int, str], PlannedBatch] = {}
        placed: set[int] = set()
        self.rejected = []
        self._held = {rid for rid in self._held if self._is_waiting(rid)}   # an aborted request is held no more
        self.admitted = []
        # replica load counts every request; a plan without replicas skips that scan
        self._load = self._replica_load([*running, *waiting]) if self.index.replicated else {}
        self._open = set(self.index.batch_keys - busy)   # keys that can still take a Run this step
        self._cohorts = dict.fromkeys(cohorts, -1)      # -1: in flight, no op takes its rows this step
        self._chunk_tokens = self._chunk_size(alone=len(running) + len(waiting) == 1)
        for req in waiting:      # suspects of a failed batch first: alone, they must not wait behind batches
            if req.state == RequestState.WAITING or not self._open:
                break            # suspects were running, so PREEMPTED: the queue's front (Conductor._preempt)
            if req.isolated:
                self._place(req, batches, ready_ranks, placed, admitting=True)
        num_admitted = len(running) + len(placed)     # so far `placed` holds only those suspects
        self._passes += 1
        if self.config.batch_invariant:
            # one Run per batch: requests take turns, the least recently placed first (suspects before all), and
            # every other pass admission goes first; else the first running request takes every batch of its
            # node until it ends and a request arriving meanwhile waits for the whole answer
            running = sorted(running, key=lambda r: (not r.isolated, r.placed_pass))
            if self._passes % 2 == 0:
                num_admitted = self._admit(waiting, batches, ready_ranks, placed, num_admitted)
        elif any(r.isolated for r in running):        # stable: suspects first, else in order
            running = sorted(running, key=lambda r: not r.isolated)
        for req in running:
            if not self._open:                        # every batch is full or in flight: the rest wait
                break
            if req.state == RequestState.RUNNING:     # not one preempted earlier in this loop
                row = req.steady
                if row is None or not row.place(req, batches, self._open, ready_ranks, placed):
                    self._place(req, batches, ready_ranks, placed, admitting=False)
        self._admit(waiting, batches, ready_ranks, placed, num_admitted)
        if self.config.batch_invariant:
            for req in (*running, *self.admitted):
                if req.request_id in placed:
                    req.placed_pass = self._passes
        self.ledger.commit()     # the workers cache these batches' full blocks once they have run
        return [b for b in batches.values() if b.entries]

    def _admit(self, waiting: list[Request], batches: dict, ready_ranks: set, placed: set, num_admitted: int) -> int:
        """Admit waiting requests in order while they fit; the number admitted (running) after it."""
        for req in waiting:
            if num_admitted >= self.config.max_running or not self._open:
                break
            if req.request_id in placed or req.isolated:
                continue
            if not self._place(req, batches, ready_ranks, placed, admitting=True):
                if any(r is req for r, _ in self.rejected):
                    continue
                break   # FIFO: a request that does not fit holds the ones behind it
            num_admitted += req.request_id in placed   # one with nothing to run yet takes no slot (a realtime
                                                       # utterance waiting for its stream's first window)
        return num_admitted

    def _place(self, req: Request, batches: dict, ready_ranks: set, placed: set, *, admitting: bool) -> bool:
        """Add the request's ready runs to batches; False if it must wait for KV room.
        (Run for every placed row of every step: what the plan fixes per Run is read from its RunFacts.)"""
        streams = self.streams if self.streams is not None and self.streams.has_edges(req) else None
        for cursor in req.tracks:
            for pending in cursor.ready():
                run = pending.run
                facts = self._facts.get((pending.walk, run.node)) or self.index.facts(pending.walk, run.node)
                rank = run.ranks[0] if len(run.ranks) == 1 else self._rank(pending, req, ready_ranks)
                key = (rank, run.node)
                if key not in self._open or (not ready_ranks.issuperset(run.ranks) if facts.is_tp
                                             else rank not in ready_ranks):
                    continue     # in flight, full, or its rank (a rank of its TP group) is not ready
                if streams is not None and not streams.can_run(req, pending):
                    continue
                ops = self.index.cohort_ops.get(pending.walk)
                cohort = (rank, pending.walk) if ops is not None else None
                if cohort is not None and self._cohorts.get(cohort, ops[run.node]) != ops[run.node]:
                    continue     # its loop runs at another of its ops on this rank: it joins those rows next
                batch = batches.get(key)
                if batch is None:
                    batch = batches[key] = PlannedBatch(rank, run.node, group=list(run.ranks) if facts.is_tp else [rank])
                elif batch.entries and (req.isolated or batch.entries[0].request.isolated):
                    continue    # a suspect of a failed batch runs alone (Conductor._batch_failed)
                entry = self._entry(req, pending, rank, facts)
                if run.node in req.prefill_rest or 0 < self._chunk_tokens < len(entry.item.tokens):
                    self._chunk(req, entry, rank)       # else a decode row or a short prompt: whole
                moved = req.kv_fed.get(run.node, 0) if entry.kv_from is not None else 0
                if not self._reserve(req, entry, key, batch, placed, admitting, moved):
                    return False
                if entry.kv_from is not None:
                    self._moved(req, entry, run.node)
                if admitting:
                    req.resume() if req.state == RequestState.PREEMPTED else req.admit()
                    self._held.discard(req.request_id)
                    self.admitted.append(req)
                    admitting = False
                entries = batch.entries
                entries.append(entry)
                batch.num_tokens += len(entry.item.tokens) + entry.rows - entry.item.cached
                if cohort is not None:
                    self._cohorts[cohort] = ops[run.node]
                if len(entries) >= self._batch_limit[run.node]:
                    self._open.discard(key)
                if streams is not None:
                    streams.bind(req, pending, entry.item)
                if entry.read:
                    req.note_dispatch(run.node, rank, entry.version, entry.read, self._reader(req, pending))
                else:                                   # note_dispatch without inputs read, inline
                    req.produced[run.node] = (rank, entry.version)
                placed.add(req.request_id)
                if facts.is_replicated:
                    self._stick(req, pending, rank)
                cursor.in_flight.add(pending.branch)    # cursor.start, inline
                if facts.fed_back is not None:          # a decode row: kept from step to step if it can be
                    req.steady = steady_row(req, entry, cursor, facts, self.ledger.pools,
                                            self._batch_limit[run.node], self.config.max_batch_tokens)
        return True

    def _reserve(self, req: Request, entry: Entry, key: tuple[int, str], batch: PlannedBatch, placed: set,
                 admitting: bool, moved: int = 0) -> bool:
        """Room in the (rank, node) `key` pool for the item's tokens (and `moved` tokens of a cache moving here)."""
        pool = self.ledger.pools.get(key)
        n_new, whole = len(entry.item.tokens), False
        tokens = entry.item.tokens if not moved else None    # a moved cache's contents are not hashed
        rule = self._kv_rows.get(key[1]) if pool is not None else None
        if rule is not None:                                  # its rows are not its tokens (Family.kv_rows)
            laid = rule(KVRun(entry.pending.walk, entry.item.tokens, pool.held(req.request_id), req.prompt_ids,
                              self._medium(req, entry.pending.item)))
            if laid.count == 0:                               # it writes no KV (a BAGEL generation step)
                return True
            n_new, tokens, whole = laid.count, laid.rows if not moved else None, laid.whole
            entry.item.kv_rows = n_new
        elif tokens is not None and entry.read and pool is not None and pool.media_ids:
            tokens = self._media_rows(req, entry.read, tokens, pool.media_ids)
        if n_new + entry.rows + batch.num_tokens > self.config.max_batch_tokens and batch.entries:
            # only computed tokens count: cached ones cost the forward nothing (asked only when it matters)
            cached = pool.cached_prefix(req.request_id, tokens) if pool is not None and tokens is not None else 0
            if n_new + entry.rows - cached + batch.num_tokens > self.config.max_batch_tokens:
                return False
        if pool is None:
            return True
        n_new += moved
        cached = pool.try_grow(req.request_id, n_new, tokens, whole)
        while cached is None:
            if not pool.fits_alone(req.request_id, n_new):     # asked only here: what can grow fits alone
                self._reject(req, pool.held(req.request_id) + n_new, batch, pool)
                return False
            victim = None if admitting else self._victim(pool.holders(), req, placed)
            if victim is None:
                if admitting and req.request_id not in self._held:
                    self._held.add(req.request_id)
                    self.holds += 1
                return False
            self.preempt(victim)
            self.preemptions += 1
            cached = pool.try_grow(req.request_id, n_new, tokens, whole)
        entry.item.cached = cached
        pool.tell(req.request_id, entry.item)
        return True

    def _media_rows(self, req: Request, read: list[int], tokens: list[int], media_ids: frozenset[int]) -> Sequence:
        """The Run's rows as its pool keys them: its tokens, those that are the placeholders of a media item
        it read named by the item (runtime/conductor/media_keys.py)."""
        item = next((i for i in read if isinstance(req.input_items[i][1], MediaInput)), None)
        if item is None:
            return tokens
        return run_rows(tokens, req.input_items[item][1], media_ids, self._names(req, item))

    @staticmethod
    def _names(req: Request, item: int) -> list[tuple[bytes, int]]:
        """`media_names` of the request's input item, taken once per request."""
        known = req.media_names = req.media_names or {}
        if item not in known:
            known[item] = media_names(req.input_items[item][1])
        return known[item]

    def _medium(self, req: Request, item: int) -> Medium | None:
        """The media input item of a for_each state (`item` >= 0), as a rule of `Family.kv_rows` reads it."""
        value = req.input_items[item][1] if 0 <= item < len(req.input_items) else None
        return medium(value, self._names(req, item)) if isinstance(value, (MediaInput, SizedInput)) else None

    def _chunk(self, req: Request, entry: Entry, rank: int) -> None:
        """Cut the entry's prompt to its next chunk when it is prefilled in chunks."""
        node, item, size = entry.pending.run.node, entry.item, self._chunk_tokens
        is_first = node not in req.prefill_rest
        if is_first and (size <= 0 or len(item.tokens) <= size):    # a decode row, a short prompt: whole
            return
        if is_first:
            is_recompute = req.kv_fed.get(node, 0) == 0 and bool(req.kv_history.get(node))
            if ((rank, node) not in self.chunked_prefill or is_recompute
                    or item.inputs or entry.tensors or item.routes or item.emit or entry.kv_from is not None
                    or not self.index.can_chunk_prefill(node)):
                return
        pool, rest = self.ledger.pool(rank, node), req.prefill_rest.get(node, item.tokens)
        if pool is not None:     # cached tokens cost no compute: a chunk takes them on top of its size
            size += pool.cached_prefix(req.request_id, rest)
        if len(rest) - size <= self._chunk_tokens // TAIL_FRACTION:
            size = len(rest)     # a short tail rides with this chunk: one forward (tens of ms) less
        if is_first and len(item.tokens) <= size:
            return
        item.tokens, item.partial = req.next_prefill_chunk(node, item.tokens, size)

    def _chunk_size(self, alone: bool) -> int:
        """Prompt tokens per prefill chunk this step (0: whole prompts); larger for a request alone."""
        size, config = self.config.prefill_chunk_tokens, self.config
        if alone and size > 0 and config.prefill_chunk_alone_tokens > size:
            return max(size, min(config.prefill_chunk_alone_tokens, config.max_batch_tokens))
        return size

    def _is_waiting(self, request_id: int) -> bool:
        try:
            return self.lookup(request_id).state in (RequestState.WAITING, RequestState.PREEMPTED)
        except KeyError:     # released: it ended while it waited
            return False

    def stats(self) -> dict[str, float]:
        """KV pressure numbers for /metrics."""
        return {"kv_peak_usage": self.ledger.peak_usage(), "kv_preemptions": self.preemptions, "kv_holds": self.holds}

    def _reject(self, req: Request, tokens: int, batch: PlannedBatch, pool: Pool) -> None:
        """The request's cache can never fit the pool, even alone: it fails instead of waiting forever."""
        self._held.discard(req.request_id)
        self.rejected.append((req, f"its context of {tokens} tokens needs {-(-tokens // pool.block_size)} KV blocks, "
                                   f"more than the whole KV pool of node {batch.node!r} on rank {batch.rank} "
                                   f"({pool.num_blocks} blocks of {pool.block_size} tokens)"))

    def _victim(self, holders: list[int], req: Request, placed: set) -> Request | None:
        """The most recently arrived running request holding blocks here, not in flight, whose context can be
        computed again."""
        candidates = [r for r in map(self.lookup, holders) if r is not req and r.request_id not in placed
                      and r.state == RequestState.RUNNING and not any(c.in_flight for c in r.tracks)
                      and self.ledger.recomputes(r.request_id)]
        return max(candidates, key=lambda r: r.arrival, default=None)

    def _rank(self, pending: PendingRun, req: Request, ready_ranks: set[int]) -> int:
        """The rank whose results count: a TP group's lead, else the request's replica of the node
        (chosen on its first Run: fewest requests bound there, then most free KV blocks, then rank)."""
        ranks, node = pending.run.ranks, pending.run.node
        if len(ranks) == 1 or self._tp[node]:
            return ranks[0]
        if node in req.replicas:
            return req.replicas[node]
        live = [r for r in ranks if r in ready_ranks] or list(ranks)
        return min(live, key=lambda r: (self._load.get((r, node), 0), -self._free_blocks(r, node), r))

    def _free_blocks(self, rank: int, node: str) -> int:
        pool = self.ledger.pool(rank, node)
        return 0 if pool is None else pool.free_blocks()

    def _stick(self, req: Request, pending: PendingRun, rank: int) -> None:
        """Bind the request to the replica its Run was placed on (counted in that replica's load)."""
        node = pending.run.node
        if len(pending.run.ranks) > 1 and not self._tp[node] and node not in req.replicas:
            req.replicas[node] = rank
            self._load[(rank, node)] = self._load.get((rank, node), 0) + 1

    @staticmethod
    def _replica_load(requests: list[Request]) -> dict[tuple[int, str], int]:
        """(rank, node) -> requests bound to that replica (running, or queued after their first Run)."""
        load: dict[tuple[int, str], int] = {}
        for req in requests:
            for node, rank in req.replicas.items():
                load[(rank, node)] = load.get((rank, node), 0) + 1
        return load

    def _moved(self, req: Request, entry: Entry, node: str) -> None:
        """The cache moves with the Run: the old pool lets go, the worker waits for the cache."""
        old = self.ledger.pool(entry.kv_from, node)
        if old is not None:
            old.free(req.request_id)
        entry.item.kv_in = True

    def _entry(self, req: Request, pending: PendingRun, rank: int, facts: RunFacts) -> Entry:
        node = pending.run.node
        produced = req.produced.get(node)      # (rank, runs) of its last Run of the node
        fed_back = facts.fed_back
        is_decode = fed_back is not None and fed_back in req.values     # a decode row: its last token
        item = WorkItem(request_id=req.request_id, tokens=list(req.last_values[fed_back]) if is_decode else [],
                        step=pending.step, walk=pending.walk)
        entry = Entry(req, pending, item, facts, version=produced[1] + 1 if produced is not None else 1)
        if not is_decode:
            for port, sources, is_tokens in facts.ports:
                self._bind(entry, rank, port, sources, is_tokens)
        if facts.has_kv:
            if req.kv_fed.get(node, 0):      # its cache is on the rank that ran it last: moved if not here
                held = produced[0] if produced is not None else rank
                if held != rank:
                    entry.kv_from = held
            elif req.kv_history.get(node):
                item.tokens = [*req.kv_history[node], *item.tokens]   # recompute after preemption
        if facts.has_routes:   # another rank keeps every value it receives under a versioned key: never a stale one
            item.routes = [Route(port, dst, f"{node}.{port}#{entry.version}")
                           for port, dst in self.index.routes(pending.walk, node, rank)]
        if facts.client_tensors:
            item.emit = list(facts.client_tensors)
        return entry

    @staticmethod
    def _reader(req: Request, pending: PendingRun) -> tuple[int, int]:
        """(track, state) of the Run: request inputs belong to the state that reads them."""
        return pending.track, req.tracks[pending.track].state

    def _bind(self, entry: Entry, rank: int, port: str, sources: tuple, is_tokens: bool) -> None:
        req, node, item = entry.request, entry.pending.run.node, entry.item
        for src in sources:
            if src.is_request_input and src.key in req.port_inputs:
                value = req.port_inputs[src.key]
                if value is None:
                    continue
            elif src.is_request_input:
                found = req.input_for(entry.pending.item, self.index.port_dtype(node, port),
                                      self._reader(req, entry.pending))
                if found is None:
                    continue
                entry.read.append(found[0])
                value = found[1]
                if not is_tokens:
                    entry.rows = req.media_rows(found[0])
            else:
                value = req.values.get(src.key)
                if value is None:
                    continue
            if is_tokens:
                item.tokens = list(value if src.is_request_input else req.last_values[src.key])
            elif src.is_request_input:
                entry.tensors[f"{req.request_id}/{src.key}"] = value
                item.inputs[port] = src.key
            else:
                item.inputs[port] = req.value_key(src.key, rank)
            return
