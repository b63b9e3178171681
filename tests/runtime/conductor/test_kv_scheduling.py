"""The real Scheduler on the tiny KV graph (8 blocks of 16 tokens): FIFO holds, preemption of the
newest request, and a context that can never fit is rejected without holding the queue."""
from __future__ import annotations

from pathlib import Path

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.cursor import TrackCursor
from runtime.conductor.kv_ledger import KVLedger
from runtime.conductor.plan_index import PlanIndex
from runtime.conductor.request import Request, RequestState
from runtime.conductor.scheduler import Scheduler, SchedulerConfig
from runtime.transport.request_params import RequestParams


@pytest.fixture(scope="module")
def plan():
    return compile_file(str(Path(__file__).with_name("tiny_kv.yaml")), Options()).plan


class Bench:
    """Scheduler + ledger + requests; `done` answers a batch the way the conductor applies results."""

    def __init__(self, plan) -> None:
        self.plan, self.requests = plan, {}
        self.ledger = KVLedger()
        self.ledger.add_pool(0, "lm", 8, 16)
        self.scheduler = Scheduler(PlanIndex(plan), self.ledger, SchedulerConfig(), self.preempt,
                                   self.requests.__getitem__)
        self.waiting: list[Request] = []

    def submit(self, rid: int, prompt_len: int) -> Request:
        tracks = [TrackCursor(i, t, self.plan) for i, t in enumerate(self.plan.task("chat").tracks)]
        req = Request(rid, "chat", RequestParams(declared={"max_tokens": 64}), [("text", [7] * prompt_len)], tracks, arrival=float(rid))
        for cursor in tracks:
            cursor.settle(req)
        self.requests[rid] = req
        self.waiting.append(req)
        return req

    def preempt(self, req: Request) -> None:
        self.ledger.free_request(req.request_id)
        req.preempt()
        self.waiting.insert(0, req)

    def step(self) -> list[int]:
        running = [r for r in self.requests.values() if r.state == RequestState.RUNNING]
        batches = self.scheduler.schedule(running, list(self.waiting), set(), {0})
        self.waiting = [r for r in self.waiting if r.state in (RequestState.WAITING, RequestState.PREEMPTED)]
        placed = [e for b in batches for e in b.entries]
        for e in placed:
            e.request.values.setdefault("lm.token", []).append(1)
            e.request.last_values["lm.token"] = [1]
            e.request.tracks[e.pending.track].complete(e.pending, e.request)
        return [e.request.request_id for e in placed]


def test_requests_beyond_the_pool_are_held_in_order(plan) -> None:
    bench = Bench(plan)
    for rid in (1, 2, 3):
        bench.submit(rid, 40)                       # 3 blocks each: two fit in 8
    assert bench.step() == [1, 2]
    assert bench.scheduler.stats()["kv_holds"] == 1 and bench.requests[3].state == RequestState.WAITING
    assert bench.ledger.pool(0, "lm").used_blocks == 6


def test_growth_preempts_the_newest_and_does_not_rerun_it_in_the_same_step(plan) -> None:
    bench = Bench(plan)
    bench.submit(1, 48)
    bench.submit(2, 80)                             # 3 + 5 blocks: the pool is full
    assert bench.step() == [1, 2]
    assert bench.step() == [1]                      # request 1's next token needs a 4th block
    assert bench.requests[2].state == RequestState.PREEMPTED
    assert bench.scheduler.stats()["kv_preemptions"] == 1
    assert bench.ledger.pool(0, "lm").used_blocks == 4 and bench.waiting == [bench.requests[2]]


def test_a_context_that_never_fits_is_rejected_and_does_not_hold_the_queue(plan) -> None:
    bench = Bench(plan)
    bench.submit(1, 8 * 16 + 1)
    bench.submit(2, 20)
    assert bench.step() == [2]
    (req, message), = bench.scheduler.rejected
    assert req.request_id == 1 and "129 tokens needs 9 KV blocks" in message
    assert bench.ledger.pool(0, "lm").used_blocks == 2


def test_the_ledger_keeps_its_block_count_equal_to_what_it_holds() -> None:
    import random

    rng, ledger = random.Random(0), KVLedger()
    ledger.add_pool(0, "lm", 1000, 16)
    pool = ledger.pool(0, "lm")
    for _ in range(500):
        rid = rng.randrange(20)
        if rng.random() < 0.2:
            ledger.free_request(rid)
        else:
            pool.grow(rid, rng.randint(1, 40))
        assert pool.used_blocks == sum(-(-pool.held(r) // 16) for r in pool.holders())
    ledger.free_rank(0)
    assert pool.used_blocks == 0 and ledger.usage() == 0.0


def test_a_step_stops_looking_once_every_batch_is_full(plan) -> None:
    bench = Bench(plan)
    bench.ledger.add_pool(0, "lm", 400, 16)
    max_batch = plan.node("lm").max_batch
    reqs = [bench.submit(rid, 4) for rid in range(3 * max_batch)]
    asked: list[int] = []
    for req in reqs:
        for cursor in req.tracks:       # count what the scheduler asks of each request's cursor
            cursor.ready = lambda c=cursor, r=req.request_id: asked.append(r) or type(c).ready(c)
    assert bench.step() == list(range(max_batch))            # FIFO: the first full batch, the rest wait
    assert [r.state for r in bench.waiting[:1]] == [RequestState.WAITING]
    assert len(bench.waiting) == 2 * max_batch
    assert set(asked) == set(range(max_batch))                # the waiting ones were not even looked at


def test_try_grow_is_can_grow_then_grow_for_every_kind_of_pool() -> None:
    """The scheduler grows each row with one `try_grow` call: a pool the conductor owns puts a
    decode row in its own partly filled last block directly, otherwise checks then grows. Fed the
    same random requests, each pool ends every call as the pair
    `can_grow` / `grow` leaves a twin of it (tokens, blocks, peak, the answer, the tables)."""
    import random

    from runtime.conductor.kv_ledger import KVPoolLedger

    def pools():
        return [KVPoolLedger(40, 16), KVPoolLedger(40, 16, b"root")]

    for one, twin in zip(pools(), pools()):
        rng, answers = random.Random(1), set()
        prompts = {rid: [rng.randrange(50) for _ in range(200)] for rid in range(6)}
        for _ in range(600):
            rid = rng.randrange(6)
            if rng.random() < 0.15:
                one.free(rid)
                twin.free(rid)
                continue
            held = one.held(rid)
            n = 1 if rng.random() < 0.5 else rng.randint(2, 40)     # a decode row half the time
            tokens = prompts[rid][held:held + n] if held + n <= 200 else None
            got = one.try_grow(rid, n, tokens)
            want = twin.grow(rid, n, tokens=tokens) if twin.can_grow(rid, n, tokens=tokens) else None
            assert got == want, type(one).__name__
            answers.add(got is None)
            held = {r: one.held(r) for r in one.holders()}
            mine, theirs = one.account(), twin.account()
            assert (held, mine.used_blocks, mine.peak_blocks) == \
                ({r: twin.held(r) for r in twin.holders()}, theirs.used_blocks, theirs.peak_blocks)
            one.commit()                          # its tables too (a decode row's short way)
            twin.commit()
            assert {r: vars(one.tables.table(r)) for r in held} == {r: vars(twin.tables.table(r)) for r in held}
        assert answers == {True, False}      # both answers were compared: grown and refused
