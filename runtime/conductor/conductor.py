"""The conductor: one asyncio loop that drives every request through its task.

    step():  schedule  ->  dispatch  ->  apply results

`submit()` / `abort()` / `end_early()` are the server's entry points; requests report
back through their `events` queue. Workers are watched: a dead rank fails the requests
that had state on it within a heartbeat timeout, and local ranks are restarted; a remote
rank that speaks again after being given up is asked to rejoin (runtime/ranks/joining.py).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Callable

import msgspec
import zmq
import zmq.asyncio

from mstar_compiler.plan import DONE, Plan
from runtime.ranks.joining import Joining
from runtime.conductor.kv_ledger import KVLedger
from runtime.conductor.live_state import LiveState
from runtime.conductor.plan_index import PlanIndex
from runtime.conductor.playback import PlaybackBook
from runtime.conductor.replies import InFlight, ReplyCheck, can_retry_alone, retry_alone
from runtime.conductor.request import Request, RequestState
from runtime.conductor.running import RunningSet
from runtime.conductor.batch import PlannedBatch
from runtime.conductor.config import ConductorConfig, QueueFull
from runtime.conductor.scheduler import Scheduler
from runtime.ranks.start_watch import StartFailed, StartWatch
from runtime.conductor.streams import StreamLedger
from runtime.ranks.workers import WorkerSet
from runtime.transport.messages import (
    BatchDone, BatchFailed, CloseRequest, Heartbeat, Hello, ItemResult, MoveKV, OpenRequest, PeerUnreachable,
    Peers, Ready, RunBatch, Shutdown, StreamItems,
)
from runtime.transport.keys import cluster_keys, start_guard
from runtime.transport.log_rate import is_worth_logging
from runtime.transport.queues import ConductorQueue, Envelope
from runtime.transport.request_params import RequestParams

log = logging.getLogger(__name__)
TICK_S = 0.1


class Conductor:
    """Holds every request's task state; batches at node granularity; talks to the workers."""

    def __init__(self, plan: Plan, config: ConductorConfig, on_batch: Callable[[str, int, float], None] | None = None) -> None:
        self.plan = plan
        self.config = config
        self.index = PlanIndex(plan)
        self.ledger = KVLedger()
        self.streams = StreamLedger(plan)
        self.playback = PlaybackBook(plan)
        self.live = LiveState()                        # batch counters for /v1/state
        self.worker_stats: dict[int, Heartbeat] = {}   # latest heartbeat numbers per rank
        self.replies = ReplyCheck()                     # drops replies that answer nothing sent
        self.split_batches = 0                          # shared batches that failed: their requests retried alone
        self.requests: dict[int, Request] = {}
        self.scheduler = Scheduler(self.index, self.ledger, config.scheduler, self._preempt, self.requests.__getitem__,
                                   self.streams)
        self.waiting: list[Request] = []
        self._waiting_stale = False                    # a request ended since the queue was last pruned
        self.running = RunningSet()
        self.in_flight: dict[int, InFlight] = {}
        self.on_batch = on_batch or (lambda node, size, ms: None)
        self._ids = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._events: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._start_watch: StartWatch | None = None     # while start() waits for the workers' Ready

    # ---- life cycle ----------------------------------------------------------------

    async def start(self, ready_timeout: float = 300.0) -> None:
        """Bind the control socket, start local workers, wait until every rank is ready: for as long as each
        rank not yet ready reports start steps `ready_timeout` s apart and no worker exits (start_watch.py)."""
        self.ctx = zmq.asyncio.Context()
        # key files for the ranks started here as subprocesses; a launcher's ranks make their own pairs
        file_ranks = range(len(self.plan.ranks)) if self.config.launcher is None else ()
        keys, key_files = cluster_keys(self.config.keys_dir, file_ranks)
        self.guard = start_guard(self.ctx, keys)
        self.queue = ConductorQueue(self.ctx, self.config.endpoint, keys)
        self.workers = WorkerSet(self.config.plan_path, self.queue.endpoint, len(self.plan.ranks),
                                 set(self.config.remote_ranks), self.config.weights, self.config.log_level,
                                 key_files, self.config.worker_host, self.config.launcher, self.guard.admission,
                                 keys.server_public)
        self.joining = Joining(self.plan, self.workers, self._send)
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._tick()),
                       asyncio.create_task(self._loop())]
        self.workers.start_local()
        watch = self._start_watch = StartWatch(ready_timeout)
        while len(self.workers.ready_ranks()) < len(self.plan.ranks):
            if (why := watch.stalled(self.worker_stats, self.workers.ready_ranks(), len(self.plan.ranks))):
                ready = sorted(self.workers.ready_ranks())
                await self.stop()           # no worker outlives a failed start
                raise StartFailed(f"workers not ready: {why} (ready ranks: {ready})")
            await asyncio.sleep(0.05)
        self._start_watch = None

    async def stop(self) -> None:
        """Abort what is left, shut the workers down, close sockets."""
        self._stopping = True
        for req in list(self.requests.values()):
            self._fail(req, "the server shut down before the request finished", 503, "shutting_down")
        for rank in self.workers.ready_ranks():
            self._send(rank, Shutdown())
        await asyncio.to_thread(self.workers.stop)
        for task in self._tasks:
            task.cancel()
        self.queue.close()
        self.guard.stop()
        self.ctx.term()
        if self.config.keys_dir is None:     # this start's own keys go with it
            self.workers.remove_key_files()

    @property
    def endpoint(self) -> str:
        return self.queue.endpoint

    # ---- the server's entry points -------------------------------------------------

    def submit(self, task: str, params: RequestParams, input_items: list[tuple[str, Any]],
               stop_token_ids: frozenset[int] = frozenset(), timeout_s: float | None = None,
               port_inputs: dict[str, Any] | None = None) -> Request:
        """Queue a request; its output arrives on `request.events`. QueueFull when `max_queue`
        requests already wait for admission (nothing of the request is kept then)."""
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFull(f"{len(self.waiting)} requests are waiting for admission (--max-queue)")
        rid = next(self._ids)
        tracks = [self.streams.cursor(i, t, rid) for i, t in enumerate(self.plan.task(task).tracks)]
        req = Request(rid, task, params, input_items, tracks, stop_token_ids, port_inputs=port_inputs or {})
        self.streams.open(req)
        self.playback.open(req)
        if timeout_s is not None:
            req.deadline = time.monotonic() + timeout_s
        for cursor in tracks:
            cursor.settle(req)
        self.requests[rid] = req
        self.waiting.append(req)
        self._wake()
        return req

    def abort(self, req: Request, reason: str = "abort") -> None:
        """The client went away (or timed out): free every resource of the request now."""
        if req.state.is_final:
            return
        req.abort(reason)
        self._release(req)

    async def push_stream(self, req: Request, stream: str, items: list[dict[str, Any]]) -> None:
        """Feed items (dicts of tensors; the consumer reads "value") of a client-fed stream of a live
        request, in order, straight to its consumer's rank; waits while that buffer is full (the
        client is held back as any producer is). ValueError if the stream was closed."""
        edge = self.streams.client_edge(req, stream)
        rank = edge.stream.dst_rank
        for item in items:
            if edge.is_finished:
                raise ValueError(f"request {req.request_id}: stream '{stream}' was closed")
            while not edge.mirror.can_push() and not req.state.is_final:
                await asyncio.sleep(TICK_S / 10)   # a consumer Run frees room within a step or two
            if req.state.is_final or edge.is_orphaned:
                return
            self._open_ranks(req, {rank})    # the consumer's rank refuses items of a request it never opened
            index = self.streams.push_client(edge)
            self._send(rank, StreamItems(request_id=req.request_id, stream=stream, index=index), item)
        self._wake()

    def close_stream(self, req: Request, stream: str) -> None:
        """The client's last item of the stream is in: its consumer takes the rest as the final chunk."""
        if not req.state.is_final:
            self.streams.close_client(self.streams.client_edge(req, stream))
            self._wake()

    def end_early(self, req: Request, reason: str) -> None:
        """The request is complete before its walks say so (a stop string matched)."""
        if req.state.is_final:
            return
        for cursor in req.tracks:
            cursor.force_exit(reason)
        self._finish(req)

    # ---- the loop ------------------------------------------------------------------

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.step()
            except Exception:   # a conductor bug must not take the server down silently
                log.exception("conductor step failed")
                await asyncio.sleep(TICK_S)

    async def step(self) -> None:
        """Schedule, dispatch, apply results (waits for at least one event)."""
        self._check_workers()
        self._prune_waiting()      # a request aborted while it waited (its client left) is no candidate
        running = self.playback.order(self.running.requests())
        busy = {(b.batch.rank, b.batch.node) for b in self.in_flight.values()}
        cohorts = {(b.batch.rank, walk) for b in self.in_flight.values() for walk in b.cohorts}
        for batch in self.scheduler.schedule(running, self.waiting, busy, self.workers.ready_ranks(), cohorts):
            self._dispatch(batch)
        for req, message in self.scheduler.rejected:
            self._fail(req, message)
        if self.scheduler.admitted or self._waiting_stale:   # else the queue is unchanged: no O(queue) scan
            self.waiting = self.running.take_admitted(self.waiting)
        await self._apply(await self._events.get())
        while not self._events.empty():
            await self._apply(self._events.get_nowait())

    def _prune_waiting(self) -> None:
        if self._waiting_stale:
            self.waiting = [r for r in self.waiting if r.state in (RequestState.WAITING, RequestState.PREEMPTED)]
            self._waiting_stale = False

    def _dispatch(self, batch: PlannedBatch) -> None:
        """Send the batch to its rank (every rank of a TP group, the lead's results count);
        a KV cache moving with a Run is sent by its old rank first, worker to worker."""
        batch_id = next(self._batch_ids)
        tensors = {}
        has_kv, group = self.index.nodes[batch.node].has_kv_cache, batch.group
        for e in [e for e in batch.entries if not e.steady]:   # a steady row was counted when placed (steady.py)
            req, item = e.request, e.item
            # every rank this Run reaches is opened first: a worker refuses anything of a request it was not opened for
            if item.routes or item.stream_out or not req.ranks_opened.issuperset(group):
                self._open_ranks(req, set(group) | {r.rank for r in item.routes} | {s.rank for s in item.stream_out})
            if e.kv_from is not None:
                self._send(e.kv_from, MoveKV(request_id=req.request_id, node=batch.node, dst_rank=batch.rank))
            if has_kv:
                e.kv_added = req.note_kv(batch.node, item.tokens)
            if e.tensors:
                tensors.update(e.tensors)
        self.in_flight[batch_id] = InFlight(batch, time.perf_counter(), set(batch.group),
                                            cohorts=self.index.cohorts_of(e.pending.walk for e in batch.entries))
        items = [e.item for e in batch.entries]
        for rank in batch.group:
            self._send(rank, RunBatch(batch_id=batch_id, node=batch.node, items=items, follower=rank != batch.rank,
                                      alone=self.config.scheduler.batch_invariant), tensors)

    def _open_ranks(self, req: Request, ranks: set[int]) -> None:
        opened = OpenRequest(request_id=req.request_id, params=req.params, scope=self.plan.include_of(req.task))
        for rank in sorted(ranks - req.ranks_opened):
            self._send(rank, opened)
            req.ranks_opened.add(rank)

    # ---- events --------------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            try:
                rank, env = await self.queue.recv()
            except zmq.ZMQError:
                return
            except Exception as exc:
                self.replies.dropped += 1
                if is_worth_logging(self.replies.dropped):
                    log.warning("dropping a malformed message from a worker: %s", exc)
                continue
            self._events.put_nowait((rank, env))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._wake()

    def _wake(self) -> None:
        self._events.put_nowait(None)

    async def _apply(self, event: tuple[int, Envelope] | None) -> None:
        if event is None:
            self._expire()
            return
        rank, env = event
        status = self.workers.ranks.get(rank)
        if status is None:
            return
        status.last_seen = time.monotonic()
        msg = env.msg
        if not self.replies.accept(rank, msg, self.in_flight):
            return
        if status.is_given_up and not isinstance(msg, Hello):
            self.joining.ask_to_rejoin(rank)
            return
        if isinstance(msg, BatchDone):
            self._batch_done(msg, env)
        elif isinstance(msg, BatchFailed):
            self._batch_failed(msg)
        elif isinstance(msg, Hello):
            if not status.is_local and status.pid and status.pid != msg.pid:
                self._rank_died(rank)   # a remote host came back with a new worker before its silence was noticed
            self.joining.hello(rank, msg)
        elif isinstance(msg, PeerUnreachable):
            what = self.joining.unreachable(msg)
            if msg.request_id in self.requests:
                self._fail(self.requests[msg.request_id], what, 502, "peer_unreachable")
        elif isinstance(msg, Ready):
            self._rank_ready(rank, msg)
        elif isinstance(msg, Heartbeat):
            self._beat(rank, msg)
        else:
            log.warning("unexpected %s from rank %d", type(msg).__name__, rank)

    def _beat(self, rank: int, msg: Heartbeat) -> None:
        """The rank's latest numbers; a beat without them (`counted=False`) keeps the counted ones."""
        held = self.worker_stats.get(rank)
        if msg.counted or held is None or not held.counted:
            self.worker_stats[rank] = msg
        else:
            self.worker_stats[rank] = msgspec.structs.replace(held, start_steps=msg.start_steps,
                                                              start_last=msg.start_last)

    def _rank_ready(self, rank: int, msg: Ready) -> None:
        status = self.workers.ranks[rank]
        status.nodes, status.is_ready = msg.nodes, True
        if msg.held is not None:    # a heartbeat sent before Ready may still arrive: `_beat` keeps this one
            self.worker_stats[rank] = msg.held
        self.ledger.add_rank(rank, msg.nodes, self.index, self.config.prefix_cache)
        self.scheduler.chunked_prefill.update((rank, info.name) for info in msg.nodes if info.prefill_chunks)
        peers = {r: s.peer_endpoint for r, s in self.workers.ranks.items() if s.peer_endpoint}
        keys = {r: k.decode() for r, k in self.guard.admission.keys().items()}   # what each inbox serves with
        for r in self.workers.ready_ranks():
            self._send(r, Peers(endpoints=peers, keys=keys))
        log.info("rank %d ready: %s", rank, ", ".join(f"{n.name} ({n.weight_source})" for n in msg.nodes))

    def _batch_done(self, msg: BatchDone, env: Envelope) -> None:
        flight = self.in_flight.get(msg.batch_id)
        if flight is None:
            return
        flight.pending.discard(msg.rank)
        if msg.rank == flight.batch.rank:
            flight.lead = (msg, env)
        if flight.pending or flight.lead is None:   # a TP group stays in step: wait for every rank
            return
        del self.in_flight[msg.batch_id]
        msg, env = flight.lead
        batch = flight.batch
        if len(batch.entries) == 1:
            batch.entries[0].request.isolated = False   # it ran alone and passed: it may share batches again
        self.on_batch(batch.node, len(batch.entries), msg.run_ms)
        self.live.observe_batch(batch.group, batch.node, len(batch.entries), msg.run_ms)
        token_keys, other_keys = self.index.output_keys(batch.node)
        finished, streams = RequestState.FINISHED, self.streams
        for entry, result in zip(batch.entries, msg.items):     # per row: the conductor's hot loop
            req = entry.request
            if req.state >= finished:    # final (is_final, without the property call per row)
                continue
            if (row := req.steady) is not None and row.entry is entry:     # a steady decode row (steady.py)
                if row.apply(req, result, token_keys, other_keys) and req.is_done and not self._is_in_flight(req):
                    self._finish(req)
                continue
            cursor = req.tracks[entry.pending.track]
            if entry.item.partial:      # a prompt chunk: its Run is ready again for the next one
                cursor.requeue(entry.pending)
                continue
            for key in token_keys:      # this step's ids, kept whole and as the latest (result.tokens is its own list)
                req.values.setdefault(key, []).extend(result.tokens)
                req.last_values[key] = result.tokens
            for key in other_keys:      # a tensor value stays on its worker: the key says it exists
                req.values.setdefault(key, [])
            self._client_output(req, entry, result, env)
            if cursor.state != DONE:
                if result.finished:    # the node ends this track's loop (e.g. the talker's codec EOS)
                    cursor.forced_exit = result.finished
                cursor.complete(entry.pending, req)
            if streams.has_edges(req):
                streams.on_result(req, result.streamed)
                streams.settle(req)
            if cursor.state == DONE and req.is_done and not self._is_in_flight(req):   # this track first, then all
                self._finish(req)

    def _client_output(self, req: Request, entry: Any, result: ItemResult, env: Envelope) -> None:
        facts = entry.facts
        # a prompt read in pieces (for_each): a token sampled after a middle piece predicts prompt text
        if result.tokens and facts.client_tokens and req.tracks[entry.pending.track].is_on_last_item:
            req.emit_tokens(result.tokens, result.logprobs)
            if facts.token_budget is not None and len(req.output_ids) >= req.token_cap(facts.token_budget):
                req.tracks[entry.pending.track].force_exit("max")    # other tracks (a vocoder) still drain
        if env.tensors and (tensors := req.own_tensors(env.tensors)):
            self.playback.on_tensors(req, tensors)
            req.emit_tensors(tensors)

    def _batch_failed(self, msg: BatchFailed) -> None:
        """A batch raised. Alone, its request fails; shared, each request retries alone
        (recomputing its KV context), so only the one whose params or inputs raise fails."""
        flight = self.in_flight.pop(msg.batch_id, None)
        if flight is None:
            return
        pool = self.ledger.pool(flight.batch.rank, flight.batch.node)
        if pool is not None:      # what this batch would have cached is not there
            pool.forget([e.request.request_id for e in flight.batch.entries])
        why = f"{flight.batch.node} on rank {msg.rank} failed: {msg.message}"
        entries = [e for e in flight.batch.entries if not e.request.state.is_final]
        if len(flight.batch.entries) > 1 and all(can_retry_alone(e) and self.ledger.recomputes(e.request.request_id)
                                                 for e in entries):
            log.warning("a batch of %d on %s failed (%s): its requests retry one by one",
                        len(entries), flight.batch.node, msg.message)
            self.split_batches += 1
            for entry in entries:
                retry_alone(entry)
                self._preempt(entry.request)
            return
        for entry in entries:
            self._fail(entry.request, why)

    # ---- endings -------------------------------------------------------------------

    def _finish(self, req: Request) -> None:
        reasons = {c.exit_reason for c in req.tracks}
        req.finish("length" if reasons == {"max"} else "stop")
        self._release(req)

    def _fail(self, req: Request, message: str, status: int = 500, code: str = "worker_failed") -> None:
        if not req.state.is_final:
            log.warning("request %d failed: %s", req.request_id, message)
            req.fail(message, status, code)
            self._release(req)

    def _release(self, req: Request) -> None:
        """Free every resource of a request that reached a final state."""
        self.ledger.free_request(req.request_id)
        self.running.discard(req)
        self._waiting_stale = True
        ready = self.workers.ready_ranks()
        for rank in (req.ranks_opened | self.streams.consumer_ranks(req.request_id)) & ready:
            self._send(rank, CloseRequest(request_ids=[req.request_id]))
        self.streams.free(req.request_id)
        self.playback.free(req.request_id)
        self.requests.pop(req.request_id, None)
        self._wake()

    def _preempt(self, req: Request) -> None:
        """Take the request's KV blocks back; it resumes later by recomputing its context."""
        log.info("preempting request %d (its KV context is recomputed when it resumes)", req.request_id)
        self.ledger.free_request(req.request_id)
        self.running.discard(req)
        req.preempt()
        for rank in req.ranks_opened & self.workers.ready_ranks():
            self._send(rank, CloseRequest(request_ids=[req.request_id], kv_only=True))
        self.waiting.insert(0, req)

    def _expire(self) -> None:
        now = time.monotonic()
        for req in list(self.requests.values()):
            if req.deadline is not None and now > req.deadline:
                self._fail(req, f"it ran past the server's request timeout ({now - req.arrival:.0f} s)", 504, "timeout")

    # ---- workers -------------------------------------------------------------------

    def _check_workers(self) -> None:
        self.workers.admit_keys()
        dead = set(self.workers.dead_ranks())
        for rank in list(dead):   # a tensor-parallel group dies whole: its survivors hold a broken collective group
            dead.update(self.plan.tp_ranks(rank) or ())
        for rank in sorted(dead):
            self._rank_died(rank)

    def _rank_died(self, rank: int) -> None:
        if self._start_watch and (code := self.workers.exit_before_ready(rank)) is not None:
            return self._start_watch.exited(rank, code)    # not restarted: it would fail the same way (start_watch.py)
        log.error("worker of rank %d died", rank)
        lost = {e.request.request_id for f in self.in_flight.values() if rank in f.batch.group
                for e in f.batch.entries}
        self.in_flight = {i: f for i, f in self.in_flight.items() if rank not in f.batch.group}
        for req in list(self.requests.values()):
            if req.request_id in lost or rank in req.ranks_opened | self.streams.consumer_ranks(req.request_id):
                req.ranks_opened.discard(rank)
                self._fail(req, f"the worker of rank {rank} died while running this request")
        self.ledger.free_rank(rank)
        self.worker_stats.pop(rank, None)    # what the dead worker held is gone; its successor reports anew
        self.workers.restart(rank)

    def _send(self, rank: int, msg: Any, tensors: dict | None = None) -> bool:
        """Queue `msg` for `rank`; False (logged) when the rank has no connection."""
        try:
            self.queue.send(rank, msg, tensors)
        except zmq.ZMQError as exc:
            log.error("cannot reach rank %d (%s)", rank, exc)
            self.workers.ranks[rank].last_seen = 0.0
            return False
        return True

    def _is_in_flight(self, req: Request) -> bool:
        return any(c.in_flight for c in req.tracks)

    # ---- numbers for /metrics ----------------------------------------------------------

    def stats(self) -> dict[str, float]:
        dropped = {"conductor": self.replies.dropped,
                   **{f"rank-{r}": beat.dropped_messages for r, beat in self.worker_stats.items()}}
        return {"waiting": len(self.waiting), "running": len(self.running), "kv_usage": self.ledger.usage(),
                "dropped": dropped, "split_batches": self.split_batches, **self.scheduler.stats()}
