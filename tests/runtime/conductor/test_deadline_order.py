"""Deadline-aware scheduling: when a rank cannot take every audio stream's work in one batch,
the streams whose client buffers run dry first go first (the real Scheduler and cursors)."""
from __future__ import annotations

import time

import msgspec
import pytest
import torch

from mstar_compiler.plan import Plan
from runtime.conductor.kv_ledger import KVLedger
from runtime.conductor.plan_index import PlanIndex
from runtime.conductor.playback import PlaybackBook
from runtime.conductor.request import Request
from runtime.conductor.scheduler import Scheduler, SchedulerConfig
from runtime.conductor.streams import StreamLedger
from tests.runtime.conductor.test_stream_ledger import plan_of
from runtime.transport.request_params import RequestParams

NOW = time.monotonic()


def with_vocoder_batch(plan: Plan, size: int) -> Plan:
    nodes = [msgspec.structs.replace(n, max_batch=size) if n.kind == "snac_decoder" else n for n in plan.nodes]
    return msgspec.structs.replace(plan, nodes=nodes)


def speaking_requests(plan: Plan, streams: StreamLedger, book: PlaybackBook, dry_in: list[float]) -> list[Request]:
    """Running speech requests, each with a window of tokens ready; request i's client runs dry at NOW + dry_in[i]."""
    out = []
    for rid, seconds in enumerate(dry_in, start=1):
        tracks = [streams.cursor(i, t, rid) for i, t in enumerate(plan.task("speech").tracks)]
        req = Request(rid, "speech", RequestParams(declared={"max_tokens": 70, "end_of_speech": 128258}), [("text", [1, 2, 3])], tracks,
                      arrival=NOW - 10 + rid)
        for cursor in tracks:
            cursor.settle(req)
        streams.open(req)
        book.open(req)
        streams.on_result(req, ["audio_tokens"] * 28)
        clock = book.clocks[rid]
        clock.first_chunk_s, clock.audio_sent_s = NOW - 1.0, 1.0 + seconds
        req.admit()
        out.append(req)
    return out


@pytest.mark.parametrize("dry_in, first", [([3.0, 0.2, 2.0, 0.1], {4, 2}), ([0.1, 0.2, 2.0, 3.0], {1, 2})])
def test_the_vocoder_batch_takes_the_earliest_deadlines(dry_in, first) -> None:
    plan = with_vocoder_batch(plan_of("orpheus"), 2)
    streams, book = StreamLedger(plan), PlaybackBook(plan)
    reqs = speaking_requests(plan, streams, book, dry_in)
    by_id = {r.request_id: r for r in reqs}
    scheduler = Scheduler(PlanIndex(plan), KVLedger(), SchedulerConfig(), lambda r: None, by_id.__getitem__, streams)
    batches = scheduler.schedule(book.order(reqs), [], set(), {0})
    vocoder = next(b for b in batches if b.node == "snac")
    assert {e.request.request_id for e in vocoder.entries} == first
    assert all(e.item.stream_in[0].num_chunks == 1 for e in vocoder.entries)


def test_audio_requests_go_before_others_and_keep_their_deadline_order() -> None:
    plan = plan_of("orpheus")
    streams, book = StreamLedger(plan), PlaybackBook(plan)
    reqs = speaking_requests(plan, streams, book, [2.0, 1.0])
    other = Request(9, "speech", RequestParams(), [], [], arrival=NOW)    # a request without a playback clock
    assert [r.request_id for r in book.order([other, *reqs])] == [2, 1, 9]


def test_an_underrun_is_counted_when_audio_leaves_after_the_buffer_ran_dry() -> None:
    plan = plan_of("orpheus")
    streams, book = StreamLedger(plan), PlaybackBook(plan)
    req, = speaking_requests(plan, streams, book, [-0.5])    # dry half a second ago
    book.on_tensors(req, {"snac.audio": torch.zeros(2048)})
    assert book.num_underruns == 1 and book.clocks[1].num_underruns == 1
