"""Streaming edges without processes: the conductor's mirrors and the workers' buffers in step.

A scripted producer and consumer go through the real `StreamLedger` (conductor side) and
`WorkerStreams` (worker side) exactly as the scheduler and the worker call them; the
chunks the consumer receives must be those a plain `StreamBuffer` releases for the same
items, with back-pressure, the final flush, cross-rank reordering, the talker's two-chunk
first Run, orphaned streams and freeing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.plan import Plan, Run, loads_plan
from runtime.conductor.cursor import PendingRun
from runtime.conductor.kv_ledger import KVLedger
from runtime.conductor.plan_index import PlanIndex
from runtime.conductor.request import Request, RequestState
from runtime.conductor.scheduler import Scheduler, SchedulerConfig
from runtime.conductor.streams import StreamLedger
from runtime.streams.chunk_policy import Sliding, StreamBuffer
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.streams import WorkerStreams
from tests.runtime.serving.conftest import REPO


def plan_of(graph: str, placement: str = "single") -> Plan:
    options = Options(preset="tiny", placement=placement)
    return loads_plan(compile_file(str(REPO / "graphs" / f"{graph}.yaml"), options).data)


@dataclass
class FakeTrack:
    is_done: bool = False


@dataclass
class FakeRequest:
    """What the ledger reads of a request: its id, task and whether each track is done."""

    request_id: int
    task: str
    tracks: list[FakeTrack] = field(default_factory=lambda: [FakeTrack() for _ in range(3)])


def pending(plan: Plan, node: str, track: int) -> PendingRun:
    ranks = plan.node(node).placement.ranks
    return PendingRun(track, -1, Run(node=node, ranks=ranks), "", 0, -1)


class Pipe:
    """One request, one stream: produce items / consume chunks through ledger and worker buffers."""

    def __init__(self, plan: Plan, task: str, src: str, dst: str, tracks: tuple[int, int]) -> None:
        self.plan, self.ledger = plan, StreamLedger(plan)
        self.req = FakeRequest(7, task)
        self.ledger.open(self.req)
        self.src, self.dst = pending(plan, src, tracks[0]), pending(plan, dst, tracks[1])
        self.workers = {r: WorkerStreams(plan, r) for r in range(len(plan.ranks))}
        self.in_flight: list[tuple[int, object, dict]] = []    # cross-rank messages not yet delivered
        self.rank_of = {n.name: n.placement.ranks[0] for n in plan.nodes}

    def produce(self, value: torch.Tensor, extra: dict | None = None) -> bool:
        if not self.ledger.can_run(self.req, self.src):
            return False
        item = WorkItem(request_id=self.req.request_id)
        self.ledger.bind(self.req, self.src, item)
        outputs = {item.stream_out[0].port: value, **(extra or {})} if item.stream_out else {}
        worker = self.workers[self.rank_of[self.src.run.node]]
        fed = worker.send(item, outputs, lambda rank, msg, tensors: self.in_flight.append((rank, msg, tensors)))
        self.ledger.on_result(self.req, fed)
        return True

    def deliver(self, order: list[int] | None = None) -> None:
        """Cross-rank items reach their rank (in `order`, default as sent)."""
        for i in order or range(len(self.in_flight)):
            rank, msg, tensors = self.in_flight[i]
            self.workers[rank].receive(msg.request_id, msg.stream, msg.index, tensors)
        self.in_flight = []

    def consume(self) -> list | None:
        """The chunks one consumer Run receives, or None when it may not run yet."""
        if not self.ledger.can_run(self.req, self.dst):
            return None
        item = WorkItem(request_id=self.req.request_id)
        self.ledger.bind(self.req, self.dst, item)
        worker = self.workers[self.rank_of[self.dst.run.node]]
        return worker.take(item, pump=self.deliver, timeout_s=1.0)[item.stream_in[0].port]

    def end_producer(self) -> None:
        self.req.tracks[self.src.track].is_done = True
        self.ledger.settle(self.req)


def test_orpheus_chunks_match_a_plain_buffer_with_back_pressure_and_one_final_flush() -> None:
    pipe = Pipe(plan_of("orpheus"), "speech", "lm", "snac", (0, 1))
    reference, got, produced = StreamBuffer(Sliding(28, 7), capacity=1000), [], 0
    while produced < 61:
        if pipe.produce(torch.tensor([produced])):
            reference.push(produced)
            produced += 1
            continue
        chunks = pipe.consume()
        assert chunks is not None and len(chunks) == 1, "the producer is blocked: the consumer must be able to run"
        got.append(chunks[0])
    pipe.end_producer()
    while (chunks := pipe.consume()) is not None and not pipe.ledger.is_drained(7, "audio_tokens"):
        got.append(chunks[0])
    got.append(chunks[0])
    want = []
    reference.finish()
    while (chunk := reference.take()) is not None:
        want.append(chunk)
    assert [([int(t["value"]) for t in c.items], c.start, c.num_context, c.is_final) for c in got] == \
           [(c.items, c.start, c.num_context, c.is_final) for c in want]
    assert [c.is_final for c in got].count(True) == 1 and got[-1].is_final
    assert pipe.workers[0].num_buffers == 0            # the worker dropped the drained buffer


def test_back_pressure_stops_the_producer_at_the_plan_capacity() -> None:
    pipe = Pipe(plan_of("orpheus"), "speech", "lm", "snac", (0, 1))
    pushed = 0
    while pipe.produce(torch.tensor([pushed])):
        pushed += 1
    assert pushed == pipe.plan.streams[0].capacity == 35
    # the first window leaves all 28 items retained (the next window overlaps them) + 7 new: still full
    assert len(pipe.consume()[0].items) == 28 and not pipe.produce(torch.tensor([pushed]))
    assert pipe.consume()[0].start == 7 and pipe.produce(torch.tensor([pushed]))


def test_cross_rank_items_arrive_out_of_order_and_are_pushed_in_order() -> None:
    plan = plan_of("qwen3_omni", "thinker_talker")
    pipe = Pipe(plan, "voice_chat", "thinker", "talker", (0, 1))
    assert pipe.consume() is None                       # the talker's first Run needs two items
    assert pipe.produce(torch.zeros(5, 64), {"hidden:ids": torch.arange(5)})
    assert pipe.consume() is None
    assert pipe.produce(torch.ones(1, 64))
    assert not pipe.produce(torch.ones(1, 64))          # capacity 2: the thinker waits for the talker
    pipe.deliver(order=[1, 0])                           # item 1 overtakes item 0 on the wire
    chunks = pipe.consume()
    assert [c.items[0]["value"].shape[0] for c in chunks] == [5, 1]
    assert torch.equal(chunks[0].items[0]["ids"], torch.arange(5))
    assert pipe.produce(2 * torch.ones(1, 64))


def test_an_orphaned_stream_no_longer_holds_the_producer_back() -> None:
    pipe = Pipe(plan_of("qwen3_omni"), "voice_chat", "thinker", "talker", (0, 1))
    assert pipe.produce(torch.zeros(3, 64)) and pipe.produce(torch.zeros(1, 64))
    assert not pipe.produce(torch.zeros(1, 64))
    pipe.req.tracks[1].is_done = True                   # the talker said codec EOS
    pipe.ledger.settle(pipe.req)
    assert all(pipe.produce(torch.zeros(1, 64)) for _ in range(5))
    item = WorkItem(request_id=7)
    pipe.ledger.bind(pipe.req, pipe.src, item)
    assert item.stream_out == []                        # nothing is pushed any more


def test_freeing_a_request_drops_its_buffers_and_late_items() -> None:
    plan = plan_of("qwen3_omni", "thinker_talker")
    pipe = Pipe(plan, "voice_chat", "thinker", "talker", (0, 1))
    pipe.produce(torch.zeros(2, 64))
    pipe.deliver()
    assert pipe.workers[1].num_buffers == 1 and pipe.ledger.num_buffers == 2
    assert pipe.ledger.consumer_ranks(7) == {1}
    pipe.produce(torch.zeros(1, 64))                    # still on the wire when the request ends
    pipe.ledger.free(7)
    pipe.workers[1].free(7)
    pipe.deliver()
    assert pipe.workers[1].num_buffers == 0 and pipe.ledger.num_buffers == 0


def test_a_take_the_producer_never_sent_fails_loudly() -> None:
    plan = plan_of("qwen3_omni", "thinker_talker")
    pipe = Pipe(plan, "voice_chat", "thinker", "talker", (0, 1))
    pipe.produce(torch.zeros(2, 64))
    pipe.produce(torch.zeros(1, 64))
    pipe.in_flight = []                                  # lost on the wire
    with pytest.raises(TimeoutError, match="never sent"):
        pipe.consume()


def test_a_client_fed_stream_ends_only_when_closed_and_gates_only_its_per_chunk_track() -> None:
    """Qwen3-Omni's user_audio: the server pushes frames (as Conductor.push_stream does), the encoder's
    per-chunk track takes 200-frame windows, settling never ends the stream (it has no producer
    track), closing it makes the tail the final chunk; voice chat's encoder (a file) is not gated."""
    plan = plan_of("qwen3_omni")
    ledger, worker = StreamLedger(plan), WorkerStreams(plan, 0)
    req, chat = FakeRequest(7, "listen", [FakeTrack()]), FakeRequest(8, "voice_chat")
    ledger.open(req)
    ledger.open(chat)
    assert ledger.can_run(chat, pending(plan, "audio_enc", 0))          # reads its own input, no stream
    encoder, edge, got = pending(plan, "audio_enc", 0), ledger.client_edge(req, "user_audio"), []

    def consume() -> None:
        item = WorkItem(request_id=7)
        ledger.bind(req, encoder, item)
        got.extend(worker.take(item, pump=lambda: None, timeout_s=1.0)["mel"])

    for frame in range(450):
        worker.receive(7, "user_audio", ledger.push_client(edge), {"value": torch.tensor([frame])})
        ledger.settle(req)                                               # no producer track: still open
        if ledger.can_run(req, encoder):
            consume()
    assert [len(c.items) for c in got] == [200, 200] and not ledger.can_run(req, encoder)
    ledger.close_client(edge)
    assert ledger.can_run(req, encoder)
    consume()
    assert [int(it["value"]) for c in got for it in c.items] == list(range(450))
    assert [c.is_final for c in got] == [False, False, True] and ledger.is_drained(7, "user_audio")
    assert worker.num_buffers == 0
    with pytest.raises(ValueError, match="no client-fed stream"):
        ledger.client_edge(chat, "user_audio")


def test_a_request_waiting_for_its_client_fed_stream_takes_no_admission_slot() -> None:
    """A realtime utterance's listen request, opened before any window is complete, must not hold a
    chat request behind it out of the last running slot."""
    plan = plan_of("qwen3_omni")
    ledger, streams, requests = KVLedger(), StreamLedger(plan), {}
    for node in plan.nodes:
        for pool in node.kv_pools:
            ledger.add_pool(pool.rank, node.name, pool.num_blocks, pool.block_tokens)
    scheduler = Scheduler(PlanIndex(plan), ledger, SchedulerConfig(max_running=1), lambda r: None,
                          requests.__getitem__, streams)

    def submit(rid: int, task: str, items: list) -> Request:
        tracks = [streams.cursor(i, t, rid) for i, t in enumerate(plan.task(task).tracks)]
        req = requests[rid] = Request(rid, task, RequestParams(declared={"max_tokens": 4}), items, tracks)
        streams.open(req)
        for cursor in tracks:
            cursor.settle(req)
        return req

    listening, chat = submit(1, "listen", []), submit(2, "chat", [("text", [1, 2, 3])])
    batches = scheduler.schedule([], [listening, chat], set(), {0})
    assert [(b.node, [e.request.request_id for e in b.entries]) for b in batches] == [("thinker", [2])]
    assert listening.state == RequestState.WAITING and chat.state == RequestState.RUNNING
