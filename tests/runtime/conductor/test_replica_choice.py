"""Data-parallel replicas: the scheduler's choice of replica (load, free KV blocks, rank) and
the request's binding to it, checked with the conductor against fake workers."""
from __future__ import annotations

import asyncio
from collections import defaultdict

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.request import Request
from runtime.ranks.workers import WorkerSet
from runtime.transport.messages import BatchDone, ItemResult, RunBatch
from runtime.transport.queues import Envelope
from tests.runtime.serving.conftest import REPO
from runtime.transport.request_params import RequestParams

NODE = "lm"


class FakeWorkers:
    """Answers every RunBatch at once with one token per item; records (rank, batch)."""

    def __init__(self, conductor: Conductor, blocks: dict[int, int]) -> None:
        self.conductor = conductor
        self.sent: list[tuple[int, RunBatch]] = []
        conductor.workers = WorkerSet("plan.bin", "tcp://fake", len(conductor.plan.ranks), set(), None, "info")
        for status in conductor.workers.ranks.values():
            status.is_ready = True
        for rank, n in blocks.items():
            conductor.ledger.add_pool(rank, NODE, n, 16)
        conductor._send = self.send

    def send(self, rank: int, msg, tensors=None) -> None:
        if isinstance(msg, RunBatch):
            self.sent.append((rank, msg))
            items = [ItemResult(request_id=item.request_id, tokens=[7]) for item in msg.items]
            self.conductor._events.put_nowait((rank, Envelope(BatchDone(batch_id=msg.batch_id, rank=rank,
                                                                        items=items))))

    def ranks_of(self) -> dict[int, set[int]]:
        """request id -> every rank that ran one of its Runs."""
        out: dict[int, set[int]] = defaultdict(set)
        for rank, batch in self.sent:
            for item in batch.items:
                out[item.request_id].add(rank)
        return out


def _conductor(blocks: dict[int, int]) -> tuple[Conductor, FakeWorkers]:
    plan = compile_file(str(REPO / "graphs" / "smollm2.yaml"), Options(preset="tiny", placement="replicas")).plan
    conductor = Conductor(plan, ConductorConfig(plan_path="plan.bin"))
    return conductor, FakeWorkers(conductor, blocks)


async def _until_done(conductor: Conductor, reqs: list[Request]) -> None:
    while not all(r.state.is_final for r in reqs):
        await conductor.step()


def test_concurrent_requests_spread_evenly_and_stay_on_their_replica() -> None:
    conductor, workers = _conductor({0: 64, 1: 64})

    async def run() -> list[Request]:
        reqs = [conductor.submit("chat", RequestParams(declared={"max_tokens": 4}), [("text", [1, 2, 3])]) for _ in range(6)]
        await _until_done(conductor, reqs)
        return reqs

    reqs = asyncio.run(run())
    ranks = workers.ranks_of()
    assert all(len(ranks[r.request_id]) == 1 for r in reqs)          # prefill and every decode step: one rank
    per_rank = [sum(1 for r in reqs if ranks[r.request_id] == {k}) for k in (0, 1)]
    assert per_rank == [3, 3]
    assert all(r.output_ids == [7] * 4 for r in reqs)


def test_a_new_request_goes_to_the_replica_with_fewer_requests_then_more_free_blocks() -> None:
    conductor, workers = _conductor({0: 8, 1: 64})

    async def run() -> tuple[Request, Request, Request]:
        first = conductor.submit("chat", RequestParams(declared={"max_tokens": 50}), [("text", [1, 2, 3])])
        await conductor.step()                     # equal load: rank 1 has more free blocks
        second = conductor.submit("chat", RequestParams(declared={"max_tokens": 50}), [("text", [1, 2])])
        await conductor.step()                     # rank 1 holds `first`: rank 0 is less loaded
        conductor.abort(first)
        third = conductor.submit("chat", RequestParams(declared={"max_tokens": 2}), [("text", [4])])
        await _until_done(conductor, [third])      # `first` gone: rank 1 has no request again
        conductor.abort(second)
        return first, second, third

    first, second, third = asyncio.run(run())
    assert first.replicas == {NODE: 1} and second.replicas == {NODE: 0} and third.replicas == {NODE: 1}
    ranks = workers.ranks_of()
    assert ranks[second.request_id] == {0} and ranks[third.request_id] == {1}


def test_preemption_unbinds_the_request_so_its_recompute_may_move() -> None:
    conductor, _ = _conductor({0: 64, 1: 64})

    async def run() -> Request:
        req = conductor.submit("chat", RequestParams(declared={"max_tokens": 50}), [("text", [1, 2, 3])])
        await conductor.step()
        assert req.replicas == {NODE: 0}
        conductor._preempt(req)
        assert req.replicas == {} and req.request_id not in conductor.ledger.pool(0, NODE).holders()
        conductor.ledger.pool(0, NODE).grow(999, 16 * 60)    # rank 0 now nearly full (an outside holder)
        await conductor.step()
        conductor.abort(req)
        return req

    req = asyncio.run(run())
    assert req.replicas == {NODE: 1}
