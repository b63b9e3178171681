"""Streaming edges, conductor side: which Runs may go, and what each moves on a stream.

Stream *data* never passes through the conductor: the producer's worker pushes each item
straight to the consumer's rank, which keeps the real per-request `StreamBuffer`
(runtime/worker/streams.py). The conductor keeps a *mirror* of every buffer — the same
`StreamBuffer` class over placeholder items, fed the same pushes, finish and takes in the
same order — so it knows, without the data, when a chunk is due and how full a buffer is:

  * back-pressure: a Run of a stream's producer node is dispatched only while the mirror
    `can_push()` (the plan's `capacity`);
  * consumption: a Run of the consumer node is dispatched only when the chunks it needs
    are released (one per Run; a kind may need more on its first Run, see
    the consumer node's plan `first_run_chunks`), or once the producer has ended (then it takes what is left);
  * the Run's WorkItem says how many chunks to take and how many items must have
    arrived first (`StreamTake`), or where to push its item (`StreamRoute`);
  * the producer ends when every track that runs the producer node is done: the mirror
    is finished, the next take is the flush, marked final; a `per_chunk` track
    (`ChunkCursor`) runs its walk once per chunk and ends after the final one;
  * a consumer that ends first (the talker says codec EOS while the thinker still
    writes) orphans the stream: the producer runs on unthrottled and pushes nothing more;
  * a client-fed stream (`from: client.<item>`, a realtime session's audio) has no producer
    track: the server pushes its items through `Conductor.push_stream` (the mirror counts
    them, the conductor sends them to the consumer's rank) and ends it with `close_stream`.

Invariant: for every (request, stream) the worker's buffer sees exactly the mirror's
sequence of pushes, finish and takes, so both release identical chunks.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

from mstar_compiler.plan import Plan, Stream, Track
from runtime.conductor.cursor import PendingRun, RequestView, TrackCursor
from runtime.conductor.request import Request
from runtime.streams.chunk_policy import StreamBuffer
from runtime.streams.plan_policy import plan_policy
from runtime.transport.messages import StreamRoute, StreamTake, WorkItem

def track_nodes(plan: Plan, track: Track) -> set[str]:
    """Every node a track's walks run."""
    walks = {s.walk for s in track.states if s.walk}
    walks |= {w for s in track.states for ws in (s.for_each or {}).values() for w in ws}
    return {n for w in walks for n in plan.walk(w).nodes}


@dataclass
class EdgeState:
    """The mirror of one request's buffer of one streaming edge."""

    stream: Stream
    mirror: StreamBuffer
    producer_tracks: frozenset[int]        # tracks that run the producer node
    consumer_tracks: frozenset[int]        # tracks that run the consumer node
    first_chunks: int                      # chunks the consumer's first Run needs
    num_consumer_runs: int = 0
    num_produced: int = 0                  # items pushed (the mirror's own count)
    is_finished: bool = False              # the producer has ended
    is_drained: bool = False               # the final chunk has been taken
    is_orphaned: bool = False              # every consumer track is done: items go nowhere
    version: int = 0                       # bumped on every push/finish/take (cache key)
    ready_cache: tuple[int, int, int] = (-1, 0, 0)  # (version, limit, chunks ready)

    def num_ready(self, limit: int) -> int:
        """Chunks the buffer would release now, counting up to `limit` (on a copy of the mirror)."""
        if self.ready_cache[:2] != (self.version, limit):
            probe = copy.deepcopy(self.mirror)
            count = 0
            while count < limit and probe.take() is not None:
                count += 1
            self.ready_cache = (self.version, limit, count)
        return self.ready_cache[2]


@dataclass
class ChunkCursor(TrackCursor):
    """A `per_chunk` track: its walk runs once per released chunk; done after the final one."""

    is_drained: Callable[[], bool] = field(default=lambda: True)

    def _transition(self, req: RequestView) -> None:
        if self.is_drained():
            super()._transition(req)
        # else: stay in state 0; `settle` re-enters the walk, which waits for the next chunk


class StreamLedger:
    """Every request's stream mirrors; the scheduler asks it before and after each Run."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._edges: dict[int, dict[str, EdgeState]] = {}
        self._by_task: dict[str, list[tuple[Stream, frozenset[int], frozenset[int]]]] = {
            t.name: self._task_streams(t.tracks) for t in plan.tasks}

    def _task_streams(self, tracks: list[Track]) -> list[tuple[Stream, frozenset[int], frozenset[int]]]:
        """(stream, producer tracks, consumer tracks) of every stream both ends of which the task runs."""
        nodes = [track_nodes(self.plan, t) for t in tracks]
        out = []
        for s in self.plan.streams:
            producers = frozenset(i for i, ns in enumerate(nodes) if s.src_node in ns)
            consumers = frozenset(i for i, ns in enumerate(nodes) if s.dst_node in ns)
            if s.is_client_fed:   # read only by its per-chunk tracks: another track may run the node on an input
                consumers = frozenset(i for i, t in enumerate(tracks) if t.per_chunk == s.name)
            if (producers or s.is_client_fed) and consumers:
                out.append((s, producers, consumers))
        return out

    # ---- life cycle ------------------------------------------------------------------

    def cursor(self, index: int, track: Track, request_id: int) -> TrackCursor:
        """The cursor of one track of a new request (a ChunkCursor for `per_chunk` tracks)."""
        if track.per_chunk is None:
            return TrackCursor(index, track, self.plan)
        return ChunkCursor(index, track, self.plan, is_drained=lambda: self.is_drained(request_id, track.per_chunk))

    def open(self, req: Request) -> None:
        """Create the mirrors of the streams the request's task joins."""
        edges = {}
        for s, producers, consumers in self._by_task.get(req.task, []):
            buffer = StreamBuffer(plan_policy(s), s.capacity)
            edges[s.name] = EdgeState(s, buffer, producers, consumers, self.plan.node(s.dst_node).first_run_chunks)
        if edges:
            self._edges[req.request_id] = edges

    def free(self, request_id: int) -> None:
        self._edges.pop(request_id, None)

    def has_edges(self, req: Request) -> bool:
        """Whether the request's task joins any stream (else no Run of it is held or bound here)."""
        return req.request_id in self._edges

    def consumer_ranks(self, request_id: int) -> set[int]:
        """Ranks that may hold buffers of this request (they must hear of its end)."""
        return {e.stream.dst_rank for e in self._edges.get(request_id, {}).values()}

    def is_drained(self, request_id: int, stream: str) -> bool:
        edge = self._edges.get(request_id, {}).get(stream)
        return edge is None or edge.is_drained

    @property
    def num_buffers(self) -> int:
        return sum(len(e) for e in self._edges.values())

    def buffered(self) -> dict[str, dict[str, int]]:
        """Per stream: items buffered now (consumer side, all requests) and requests it is open for."""
        out = {s.name: {"buffered": 0, "num_requests": 0} for s in self.plan.streams}
        for edges in self._edges.values():
            for name, edge in edges.items():
                out[name]["buffered"] += len(edge.mirror)
                out[name]["num_requests"] += 1
        return out

    # ---- scheduling --------------------------------------------------------------------

    def can_run(self, req: Request, pending: PendingRun) -> bool:
        """Whether the Run may be dispatched now as far as streams are concerned."""
        node = pending.run.node
        for edge in self._edges.get(req.request_id, {}).values():
            if edge.stream.src_node == node and not edge.is_orphaned and not edge.mirror.can_push():
                return False                       # back-pressure: the consumer is behind
            if edge.stream.dst_node == node and pending.track in edge.consumer_tracks and not self._has_input(edge):
                return False                       # waiting for the producer
        return True

    def _has_input(self, edge: EdgeState) -> bool:
        if edge.is_drained or edge.is_finished:
            return True
        need = edge.first_chunks if edge.num_consumer_runs == 0 else 1
        return edge.num_ready(need) >= need

    def bind(self, req: Request, pending: PendingRun, item: WorkItem) -> None:
        """The Run was dispatched: record its takes and routes in the WorkItem."""
        node = pending.run.node
        for edge in self._edges.get(req.request_id, {}).values():
            s = edge.stream
            if s.dst_node == node and pending.track in edge.consumer_tracks:
                item.stream_in.append(self._take(edge))
            if s.src_node == node and not edge.is_orphaned:
                item.stream_out.append(StreamRoute(s.name, s.src_port, s.dst_rank, edge.num_produced))

    def _take(self, edge: EdgeState) -> StreamTake:
        need = edge.first_chunks if edge.num_consumer_runs == 0 else 1
        taken = 0
        while taken < need and not edge.is_drained:
            chunk = edge.mirror.take()
            if chunk is None:
                break
            taken += 1
            edge.is_drained = chunk.is_final
        edge.num_consumer_runs += 1
        edge.version += 1
        s = edge.stream
        return StreamTake(s.name, s.dst_port, taken, edge.num_produced, edge.is_finished)

    # ---- a client-fed stream ------------------------------------------------------------

    def client_edge(self, req: Request, stream: str) -> EdgeState:
        """The request's edge of a client-fed stream (ValueError when its task has none)."""
        edge = self._edges.get(req.request_id, {}).get(stream)
        if edge is None or not edge.stream.is_client_fed:
            raise ValueError(f"task '{req.task}' has no client-fed stream '{stream}'")
        return edge

    def push_client(self, edge: EdgeState) -> int:
        """Count one client item into the mirror; its stream index."""
        edge.mirror.push(None)
        edge.num_produced += 1
        edge.version += 1
        return edge.num_produced - 1

    def close_client(self, edge: EdgeState) -> None:
        """The client's last item is in: the next take is the flush, marked final."""
        if not edge.is_finished:
            edge.mirror.finish()
            edge.is_finished = True
            edge.version += 1

    # ---- results -----------------------------------------------------------------------

    def on_result(self, req: Request, streamed: list[str]) -> None:
        """A Run came back having pushed one item onto each stream in `streamed`."""
        edges = self._edges.get(req.request_id, {})
        for name in streamed:
            edge = edges.get(name)
            if edge is not None and not edge.is_finished and not edge.is_orphaned:
                edge.mirror.push(None)
                edge.num_produced += 1
                edge.version += 1

    def settle(self, req: Request) -> None:
        """Finish the streams whose producer tracks are all done; orphan those whose consumers are."""
        for edge in self._edges.get(req.request_id, {}).values():
            if not edge.is_finished and not edge.stream.is_client_fed and \
                    all(req.tracks[i].is_done for i in edge.producer_tracks):
                edge.mirror.finish()
                edge.is_finished = True
                edge.version += 1
            edge.is_orphaned = all(req.tracks[i].is_done for i in edge.consumer_tracks)
