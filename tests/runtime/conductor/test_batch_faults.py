"""The conductor's fault isolation and reply checks, against workers that speak the real
messages (runtime/conductor/null_workers.py) but keep a KV length per request as a real cache does:
a batch holding a poisoned request fails; each of its requests retries alone (recomputing
its context), so only the poisoned one fails and the others' tokens equal their tokens alone."""
from __future__ import annotations

import asyncio
from pathlib import Path

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.request import RequestState
from runtime.transport.messages import BatchDone, BatchFailed, ItemResult, RunBatch
from runtime.transport.queues import Envelope
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams
from tests.runtime.conductor.cache_workers import POISON, CacheWorkers

ROOT = Path(__file__).resolve().parents[3]


def run_requests(prompts: list[list[int]], poisoned: set[int], max_tokens: int = 6):
    plan = compile_file(str(ROOT / "graphs/smollm2.yaml"), Options(preset="tiny")).plan
    loop = asyncio.new_event_loop()
    try:
        conductor = Conductor(plan, ConductorConfig(plan_path="null"))
        workers = CacheWorkers(conductor)
        reqs = [conductor.submit("chat", RequestParams(declared={"max_tokens": max_tokens},
                                                       sampling=SamplingParams(top_k=POISON if i in poisoned else 0)),
                                 [("text", p)]) for i, p in enumerate(prompts)]

        async def drive() -> None:
            for _ in range(200):
                if all(r.state.is_final for r in reqs):
                    return
                await conductor.step()
        loop.run_until_complete(drive())
        return reqs, workers, conductor
    finally:
        loop.close()


def test_a_poisoned_request_fails_alone_and_its_batch_neighbours_finish_as_alone() -> None:
    prompts = [list(range(1, 2 + i)) for i in range(8)]
    poisoned = {1, 3, 5, 7}
    reqs, workers, conductor = run_requests(prompts, poisoned)
    assert workers.failed_batches >= 1 + len(poisoned)      # the shared batch, then each poisoned one alone
    for i, req in enumerate(reqs):
        if i in poisoned:
            events = [req.events.get_nowait() for _ in range(req.events.qsize())]
            assert req.state == RequestState.FAILED and "OverflowError" in events[-1].error
            continue
        alone, _, _ = run_requests([prompts[i]], set())
        assert req.state == RequestState.FINISHED and req.finish_reason == "length"
        assert req.output_ids == alone[0].output_ids == [len(prompts[i]) + k for k in range(6)]
    assert conductor.ledger.usage() == 0 and not conductor.requests


class HeldWorkers(CacheWorkers):
    """Keeps each RunBatch until `release()`, so a batch stays in flight while replies are forged."""

    def __init__(self, conductor: Conductor) -> None:
        super().__init__(conductor)
        self.held: list[tuple[int, RunBatch]] = []

    def _run(self, rank: int, msg: RunBatch) -> None:
        self.held.append((rank, msg))

    def release(self) -> None:
        held, self.held = self.held, []
        for rank, msg in held:
            super()._run(rank, msg)


def test_forged_and_stale_replies_are_dropped_and_counted() -> None:
    plan = compile_file(str(ROOT / "graphs/smollm2.yaml"), Options(preset="tiny")).plan
    loop = asyncio.new_event_loop()
    try:
        conductor = Conductor(plan, ConductorConfig(plan_path="null"))
        workers = HeldWorkers(conductor)
        req = conductor.submit("chat", RequestParams(declared={"max_tokens": 3}), [("text", [1, 2])])
        loop.run_until_complete(conductor.step())          # the prefill batch is sent and held
        (batch_id,) = conductor.in_flight
        rid = req.request_id
        forged = [BatchDone(batch_id=batch_id + 1, rank=0, items=[ItemResult(request_id=rid, tokens=[5])]),
                  BatchFailed(batch_id=batch_id + 1, rank=0, message="never sent"),
                  BatchDone(batch_id=batch_id, rank=0, items=[ItemResult(request_id=rid + 1, tokens=[5])]),
                  BatchDone(batch_id=batch_id, rank=1, items=[ItemResult(request_id=rid, tokens=[5])])]
        for msg in forged:
            loop.run_until_complete(conductor._apply((0, Envelope(msg))))
        assert conductor.replies.dropped == 4 and batch_id in conductor.in_flight and not req.output_ids
        for _ in range(20):
            if req.state.is_final:
                break
            workers.release()
            conductor._wake()     # a step waits for one event: never for a batch still held
            loop.run_until_complete(conductor.step())
        assert req.state == RequestState.FINISHED and req.output_ids == [2, 3, 4]
    finally:
        loop.close()


def test_a_request_aborted_while_it_waits_is_never_admitted() -> None:
    """Its client left between two steps (found by tools/soak.py: every later step then raised
    IllegalTransition ABORTED -> RUNNING and the whole server stalled)."""
    plan = compile_file(str(ROOT / "graphs/smollm2.yaml"), Options(preset="tiny")).plan
    loop = asyncio.new_event_loop()
    try:
        conductor = Conductor(plan, ConductorConfig(plan_path="null"))
        workers = CacheWorkers(conductor)
        gone = conductor.submit("chat", RequestParams(declared={"max_tokens": 2}), [("text", [3])])
        conductor.abort(gone)
        loop.run_until_complete(conductor.step())
        assert gone.state == RequestState.ABORTED and workers.rows == 0 and not conductor.waiting
        after = conductor.submit("chat", RequestParams(declared={"max_tokens": 2}), [("text", [1, 2])])
        for _ in range(10):
            conductor._wake()
            loop.run_until_complete(conductor.step())
        assert after.state == RequestState.FINISHED and after.output_ids == [2, 3]
    finally:
        loop.close()
