"""Chunked prefill in the conductor, against fake workers that speak the real messages: which
chunks go out, with what, and what a preemption in the middle of a prompt does."""
from __future__ import annotations

import asyncio

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.request import Request, RequestState
from runtime.conductor.scheduler import SchedulerConfig
from runtime.ranks.workers import WorkerSet
from runtime.transport.messages import BatchDone, ItemResult, RunBatch
from runtime.transport.queues import Envelope
from tests.runtime.serving.conftest import REPO
from runtime.transport.request_params import RequestParams

CHUNK = 32


class ChunkWorkers:
    """Rank 0 takes prompt chunks (as a decoder LM's worker reports in Ready); every item of a
    RunBatch is answered at once, a partial chunk with no token (as the executor does)."""

    def __init__(self, conductor: Conductor) -> None:
        self.conductor = conductor
        self.batches: list[RunBatch] = []
        conductor.workers = WorkerSet("plan.bin", "tcp://fake", 1, set(), None, "info")
        conductor.workers.ranks[0].is_ready = True
        conductor.ledger.add_pool(0, "lm", 256, 16)
        conductor.scheduler.chunked_prefill.add((0, "lm"))
        conductor._send = self.send

    def send(self, rank: int, msg, tensors=None) -> None:
        if isinstance(msg, RunBatch):
            self.batches.append(msg)
            items = [ItemResult(request_id=i.request_id, tokens=[] if i.partial else [7]) for i in msg.items]
            self.conductor._events.put_nowait((rank, Envelope(BatchDone(batch_id=msg.batch_id, rank=rank,
                                                                        items=items))))

    def items_of(self, req: Request) -> list[tuple[int, bool]]:
        """(tokens, partial) of every item the request was sent, in order."""
        return [(len(i.tokens), i.partial) for b in self.batches for i in b.items if i.request_id == req.request_id]


def _conductor(alone: int = 0) -> tuple[Conductor, ChunkWorkers]:
    """Chunks of CHUNK tokens; `alone`: the chunk of a request alone in the conductor (0: CHUNK too)."""
    plan = compile_file(str(REPO / "graphs" / "smollm2.yaml"), Options(preset="tiny")).plan
    config = SchedulerConfig(prefill_chunk_tokens=CHUNK, prefill_chunk_alone_tokens=alone)
    conductor = Conductor(plan, ConductorConfig(plan_path="plan.bin", scheduler=config))
    return conductor, ChunkWorkers(conductor)


def _submit(conductor: Conductor, prompt: list[int], max_tokens: int) -> Request:
    return conductor.submit("chat", RequestParams(declared={"max_tokens": max_tokens}), [("text", prompt)])


async def _steps(conductor: Conductor, n: int) -> None:
    for _ in range(n):
        await conductor.step()


async def _until_done(conductor: Conductor, req: Request) -> None:
    for _ in range(100):                                   # bounded: a scheduling bug fails, never hangs
        if req.state.is_final:
            return
        await conductor.step()


def test_long_prompt_goes_in_chunks_beside_the_running_decode() -> None:
    conductor, workers = _conductor()
    decoding = _submit(conductor, [1, 2, 3], max_tokens=50)
    asyncio.run(_steps(conductor, 3))
    prompt = list(range(100, 200))                         # 100 tokens: 32 + 32 + (32 + a tail of 4)
    long = _submit(conductor, prompt, max_tokens=2)
    asyncio.run(_until_done(conductor, long))
    assert workers.items_of(long)[:3] == [(32, True), (32, True), (36, False)]   # 4 <= 32 / 4 rides along
    chunked = [b for b in workers.batches if any(i.request_id == long.request_id and i.partial for i in b.items)]
    assert all([len(i.tokens) for i in b.items if i.request_id == decoding.request_id] == [1] for b in chunked)
    assert long.kv_history["lm"][:100] == prompt           # each prompt token sent once, in order
    assert long.output_ids == [7, 7] and long.state == RequestState.FINISHED   # a token only after the last chunk


def test_preempted_in_the_middle_of_a_prompt_it_starts_the_prompt_again() -> None:
    conductor, workers = _conductor()
    prompt = list(range(100, 180))                         # 80 tokens: 32 + 32 + 16 (no tail: 16 > 32 / 4)
    req = _submit(conductor, prompt, max_tokens=3)
    asyncio.run(_steps(conductor, 2))
    assert workers.items_of(req) == [(32, True), (32, True)]
    conductor._preempt(req)                                # KV pressure took its blocks back
    assert req.kv_history["lm"] == [] and not req.prefill_rest
    asyncio.run(_until_done(conductor, req))
    assert workers.items_of(req)[2:5] == [(32, True), (32, True), (16, False)]
    assert req.kv_history["lm"][:80] == prompt and req.state == RequestState.FINISHED


def test_a_worker_that_takes_whole_prompts_gets_them_whole() -> None:
    conductor, workers = _conductor()
    conductor.scheduler.chunked_prefill.clear()
    req = _submit(conductor, list(range(100, 200)), max_tokens=1)
    asyncio.run(_until_done(conductor, req))
    assert workers.items_of(req)[0] == (100, False)


def test_a_prompt_alone_takes_the_larger_chunks_until_another_request_arrives() -> None:
    conductor, workers = _conductor(alone=64)
    prompt = list(range(100, 500))                         # 400 tokens
    long = _submit(conductor, prompt, max_tokens=2)
    asyncio.run(_steps(conductor, 2))
    assert workers.items_of(long) == [(64, True), (64, True)]     # nobody else: chunks of 64
    other = _submit(conductor, [1, 2, 3], max_tokens=3)
    asyncio.run(_until_done(conductor, other))
    asyncio.run(_until_done(conductor, long))
    # while the other request runs (its prompt, then two decode rows), chunks of 32; alone again, 64s,
    # and the last piece of 48 (more than a quarter chunk) on its own
    assert workers.items_of(other) == [(3, False), (1, False), (1, False)]
    assert [n for n, _ in workers.items_of(long)] == [64, 64, 32, 32, 32, 64, 64, 48, 1]
    assert long.kv_history["lm"][:400] == prompt and long.state == RequestState.FINISHED


def test_the_alone_chunk_is_no_larger_than_a_batch_and_never_smaller_than_the_chunk() -> None:
    conductor, _ = _conductor(alone=10_000)
    assert conductor.scheduler._chunk_size(alone=True) == conductor.scheduler.config.max_batch_tokens
    assert conductor.scheduler._chunk_size(alone=False) == CHUNK
    conductor, _ = _conductor(alone=16)                     # smaller than CHUNK: CHUNK
    assert conductor.scheduler._chunk_size(alone=True) == CHUNK
