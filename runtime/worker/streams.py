"""Streaming edges, worker side: producer pushes and the consumer's per-request buffers.

A producer Run whose WorkItem carries `StreamRoute`s hands its item (the output port's
tensor as "value", plus any `<port>:<part>` outputs the executor adds, e.g. "ids") to the
consuming rank as soon as the batch has run: into this worker's own buffer when the
consumer is here, else as a `StreamItems` message straight to that rank's inbox (never
through the conductor). Items carry their stream index; a buffer pushes them in index
order, holding back any that overtook an earlier one (e.g. the first token of a prefill
run on another rank).

A client-fed stream's items (`from: client.<item>`) come from the conductor instead, on the
control channel (`Conductor.push_stream`), in index order behind the request's OpenRequest.

A consumer Run's `StreamTake`s say how many chunks to take and how many items must have
arrived first; the worker waits for items still in flight, flushes the buffer when the
producer has ended (`is_finished`), takes the chunks and passes them to the executor as
`inputs[port] = [Chunk, ...]` (items are dicts of tensors). Buffers are freed when the
final chunk is taken, and with the request (`free`) on finish, abort or disconnect.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mstar_compiler.plan import Plan
from runtime.streams.chunk_policy import Chunk, StreamBuffer
from runtime.streams.plan_policy import plan_policy
from runtime.transport.messages import StreamItems, WorkItem

Item = dict[str, torch.Tensor]
# the conductor's mirror enforces the plan's capacity when it dispatches; this buffer takes
# a chunk only when the consumer Run executes, so it may briefly hold one step more
SLACK = 2
NUM_CLOSED_REMEMBERED = 4096


@dataclass
class _Inbox:
    """One request's buffer of one stream, with items that arrived ahead of their turn."""

    buffer: StreamBuffer
    num_pushed: int = 0
    early: dict[int, Item] = field(default_factory=dict)

    def receive(self, index: int, item: Item) -> None:
        self.early[index] = item
        while self.num_pushed in self.early:
            self.buffer.push(self.early.pop(self.num_pushed))
            self.num_pushed += 1


class WorkerStreams:
    """The stream buffers this rank consumes, and its side of producing."""

    def __init__(self, plan: Plan, rank: int) -> None:
        self.rank = rank
        self.consumed = {s.name: s for s in plan.streams if s.dst_rank == rank}
        self._inboxes: dict[tuple[int, str], _Inbox] = {}
        self._closed: set[int] = set()          # ended requests (their late items are dropped)
        self._closed_order: deque[int] = deque()

    @property
    def num_buffers(self) -> int:
        return len(self._inboxes)

    def _inbox(self, request_id: int, stream: str) -> _Inbox:
        key = (request_id, stream)
        if key not in self._inboxes:
            s = self.consumed[stream]
            self._inboxes[key] = _Inbox(StreamBuffer(plan_policy(s), SLACK * s.capacity))
        return self._inboxes[key]

    def receive(self, request_id: int, stream: str, index: int, item: Item) -> None:
        """An item arrived (from this rank or another); late items of closed requests are dropped."""
        if request_id not in self._closed:
            self._inbox(request_id, stream).receive(index, item)

    def take(self, item: WorkItem, pump: Callable[[], None], timeout_s: float) -> dict[str, list[Chunk]]:
        """The chunks the WorkItem's `stream_in` asks for, by input port."""
        out: dict[str, list[Chunk]] = {}
        for t in item.stream_in:
            if t.num_chunks == 0:
                out[t.port] = []
                continue
            inbox = self._inbox(item.request_id, t.stream)
            deadline = time.monotonic() + timeout_s
            while inbox.num_pushed < t.num_items:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"request {item.request_id}: stream {t.stream} has {inbox.num_pushed} of "
                                       f"{t.num_items} items; the producer's rank never sent the rest")
                pump()
            if t.is_finished:
                inbox.buffer.finish()
            out[t.port] = [self._take_one(inbox, item.request_id, t.stream) for _ in range(t.num_chunks)]
        return out

    def _take_one(self, inbox: _Inbox, request_id: int, stream: str) -> Chunk:
        chunk = inbox.buffer.take()
        if chunk is None:
            raise RuntimeError(f"request {request_id}: stream {stream} released no chunk where the conductor "
                               "expected one (conductor and worker buffers out of step)")
        if chunk.is_final:
            self._inboxes.pop((request_id, stream), None)
        return chunk

    def send(self, item: WorkItem, outputs: dict[str, torch.Tensor],
             deliver: Callable[[int, Any, Item], None]) -> list[str]:
        """Push this Run's items; `deliver(rank, msg, tensors)` reaches another rank. Returns the streams fed."""
        fed = []
        for route in item.stream_out:
            if route.port not in outputs:
                continue   # the node produced no item this Run (e.g. the talker said codec EOS)
            prefix = f"{route.port}:"
            payload = {"value": outputs[route.port],
                       **{k[len(prefix):]: v for k, v in outputs.items() if k.startswith(prefix)}}
            if route.rank == self.rank:
                self.receive(item.request_id, route.stream, route.index, payload)
            else:
                deliver(route.rank, StreamItems(request_id=item.request_id, stream=route.stream, index=route.index),
                        payload)
            fed.append(route.stream)
        return fed

    def free(self, request_id: int) -> None:
        """Drop every buffer of a request that ended (finished, aborted, disconnected)."""
        for key in [k for k in self._inboxes if k[0] == request_id]:
            del self._inboxes[key]
        self._closed.add(request_id)
        self._closed_order.append(request_id)
        if len(self._closed_order) > NUM_CLOSED_REMEMBERED:
            self._closed.discard(self._closed_order.popleft())
