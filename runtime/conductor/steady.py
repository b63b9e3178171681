"""Steady decode rows: a request in a decode loop keeps its batch row from step to step.

Most rows of most steps are decode rows: one token in, one token out, the same Run of the same
node on the same rank as the step before. The general path builds each of them anew every step
(the cursor's ready Runs, a PendingRun, a WorkItem, an Entry, its input bindings and KV checks)
and takes each result through the cursor's general completion. A `SteadyRow` is made once, when
the general path has placed a decode row that nothing but its token and its counts can change
until its loop ends (one track, one rank, no stream edges, no routes, no client tensors, no
cache to move, no recompute), and keeps that row's Entry and WorkItem. From then on a step

  places it:   the KV pool grows by the token, the item takes the token and the loop's step,
               the request's run count and KV history move by one (what `Scheduler._place`,
               `_entry`, `_reserve` and `Conductor._dispatch` do for such a row);
  applies it:  the token is stored, emitted and counted, the loop's next iteration begins or
               the loop ends (what `Conductor._batch_done` and `TrackCursor.complete` do).

Anything else goes the general way and ends the steady row first (`Request.steady = None`): no KV
room (a preemption may follow), the batch's token limit, an isolated request, a loop that ends, a
preemption (`Request.preempt`). The general path makes a new one the next time it places such a
row. Equal results either way are a test (tests/runtime/conductor/test_steady_rows.py).

The WorkItem is reused: a RunBatch is encoded when it is sent (`ConductorQueue.send`), and the
request is in at most one batch at a time (its cursor's `in_flight`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mstar_compiler.plan import DONE, DynamicLoopEnd
from runtime.conductor.batch import Entry, PlannedBatch
from runtime.conductor.kv_ledger import Pool

if TYPE_CHECKING:
    from runtime.conductor.cursor import TrackCursor, _Loop
    from runtime.conductor.plan_index import RunFacts
    from runtime.conductor.request import Request
    from runtime.transport.messages import ItemResult


class SteadyRow(msgspec.Struct):
    """One request's decode row kept between steps (see the module docstring)."""

    entry: Entry
    key: tuple[int, str]               # (rank, node) of its batches
    rank: int
    node: str
    limit: int                         # the most rows of a batch of the node
    max_batch_tokens: int              # the most new tokens of a batch (SchedulerConfig)
    cursor: TrackCursor
    loop: _Loop                        # the decode loop (its counter is the item's step)
    end: DynamicLoopEnd                # that loop's end op (passed when it ends)
    fed_back: str                      # the value whose last ids are the next item's tokens
    pools: dict[tuple[int, str], Pool]   # the ledger's pools (a rank that reports Ready anew gets new ones)
    history: list[int] | None          # the request's KV history of the node (None: no KV node)
    client_tokens: bool                # its tokens go to the client
    cap: int | None                    # the most client tokens the request may get (max_tokens)

    def place(self, req: Request, batches: dict[tuple[int, str], PlannedBatch], open_keys: set[tuple[int, str]],
              ready_ranks: set[int], placed: set[int]) -> bool:
        """Place the row as `Scheduler._place` would; False (the row ended) where the general path
        must decide instead: no KV room, or the batch's token limit reached."""
        key = self.key
        if key not in open_keys or self.rank not in ready_ranks:
            return True          # in flight, full, or its rank is not ready: it waits, as in _place
        batch = batches.get(key)
        if batch is None:
            batch = batches[key] = PlannedBatch(self.rank, self.node)
        elif batch.entries:
            if req.isolated or batch.entries[0].request.isolated:
                return True      # a suspect of a failed batch runs alone
            if batch.num_tokens >= self.max_batch_tokens:
                req.steady = None
                return False
        entry, pool = self.entry, self.pools.get(key)
        item = entry.item
        item.tokens = tokens = list(req.last_values[self.fed_back])
        cached = 0
        if pool is not None:
            rid = req.request_id
            if len(tokens) != 1 or not pool.place_row(rid, tokens, item):
                if (cached := pool.try_grow(rid, len(tokens), tokens)) is None:
                    req.steady = None
                    return False
                item.cached = cached
                pool.tell(rid, item)
        item.step = self.loop.counter
        if self.history is not None:             # Request.note_kv of a cache that is held
            self.history.extend(tokens)
            req.kv_fed[self.node] = len(self.history)
            entry.kv_added = len(tokens)
        entry.version += 1
        req.produced[self.node] = (self.rank, entry.version)
        entry.steady = True
        entries = batch.entries
        entries.append(entry)
        batch.num_tokens += len(tokens) - cached
        if len(entries) >= self.limit:
            open_keys.discard(key)
        placed.add(req.request_id)
        self.cursor.in_flight.add(-1)
        return True

    def apply(self, req: Request, result: ItemResult, token_keys: tuple[str, ...],
               other_keys: tuple[str, ...]) -> bool:
        """Apply the row's result (as `Conductor._batch_done` would); whether its track is done."""
        tokens = result.tokens
        values, last = req.values, req.last_values
        for key in token_keys:
            values.setdefault(key, []).extend(tokens)
            last[key] = tokens
        for key in other_keys:
            values.setdefault(key, [])
        cursor = self.cursor
        if tokens and self.client_tokens:
            req.emit_tokens(tokens, result.logprobs)
            if self.cap is not None and len(req.output_ids) >= self.cap:
                cursor.force_exit("max")
        if cursor.state != DONE:
            if result.finished:        # the node ends the loop (e.g. the talker's codec EOS)
                cursor.forced_exit = result.finished
            cursor.in_flight.discard(-1)
            if cursor.next_iteration(self.loop, req):
                return False
            cursor.leave_loop(self.end, req)
        req.steady = None
        return cursor.state == DONE


def steady_row(req: Request, entry: Entry, cursor: TrackCursor, facts: RunFacts,
               pools: dict[tuple[int, str], Pool], limit: int, max_batch_tokens: int) -> SteadyRow | None:
    """The row to keep if `entry`, just placed by the general path, is a decode row that only its
    token and counts change from step to step; else None."""
    item, run = entry.item, entry.pending.run
    fed_back = facts.fed_back
    if (fed_back is None or fed_back not in req.values or len(item.tokens) != 1 or len(req.tracks) != 1
            or len(run.ranks) != 1 or facts.has_routes or facts.client_tensors or entry.read or entry.tensors
            or entry.kv_from is not None or item.partial or item.inputs or item.emit or req.isolated
            or run.node in req.prefill_rest or (facts.has_kv and not req.kv_fed.get(run.node, 0))):
        return None
    program, pc = cursor.walk.program, cursor.pc
    end: Any = program[pc + 1] if pc + 1 < len(program) else None
    if type(end) is not DynamicLoopEnd or end.begin != pc - 1 or end.loop != max(cursor.loops):
        return None       # not the one Run of the innermost loop
    rank = run.ranks[0]
    return SteadyRow(entry, (rank, run.node), rank, run.node, limit, max_batch_tokens, cursor, cursor.loops[end.loop],
                     end, fed_back, pools, req.kv_history[run.node] if facts.has_kv else None,
                     facts.client_tokens and cursor.is_on_last_item,
                     req.token_cap(facts.token_budget) if facts.token_budget is not None else None)
