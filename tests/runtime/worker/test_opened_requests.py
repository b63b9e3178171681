"""A real worker process (tiny SmolLM2, `mstar-run worker` with its CURVE key) serves only the
requests the conductor opened on it. The test is its conductor, over the real ZeroMQ protocol:
a Run of a request never opened (or already closed) is answered BatchFailed, tensors and KV state
pushed for one by a key-holding peer are dropped, each is counted in the heartbeat's
`dropped_messages` and nothing is stored for it, and the worker goes on serving opened requests.
(Params the sampler would refuse no longer reach a worker: `RequestParams` is checked by the server.)"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
import zmq
import zmq.asyncio

from runtime.transport.frames import tensor_to_frame
from runtime.transport.keys import ClusterKeys, make_client, start_guard, write_cluster_keys
from runtime.transport.messages import (
    BatchDone, BatchFailed, CloseRequest, EdgeTensors, Heartbeat, Hello, KVState, OpenRequest, Ready, RunBatch,
    Shutdown, Welcome, WorkItem, encode,
)
from runtime.transport.request_params import RequestParams
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.queues import ConductorQueue
from tests.runtime.serving.conftest import REPO, compile_plan, plan_dir  # noqa: F401  (plan_dir: the session fixture)

GREEDY = RequestParams(declared={"max_tokens": 4}, sampling=SamplingParams(temperature=0.0))
PROMPT = [1, 2, 3]


class FakeConductor:
    """The conductor's end of one rank, driven by the test."""

    def __init__(self, keys_dir: str) -> None:
        keys = ClusterKeys.load(f"{keys_dir}/server.json")
        self.ctx = zmq.asyncio.Context()
        self.guard = start_guard(self.ctx, keys)
        self.queue = ConductorQueue(self.ctx, "tcp://127.0.0.1:0", keys)
        self.beat: Heartbeat | None = None

    async def expect(self, kind: type, timeout: float = 30) -> Any:
        """The next message of `kind` from rank 0 (heartbeats are kept aside as they come)."""
        while True:
            _, env = await asyncio.wait_for(self.queue.recv(), timeout)
            if isinstance(env.msg, Heartbeat):
                self.beat = env.msg
            if isinstance(env.msg, kind):
                return env.msg

    async def run(self, batch_id: int, request_id: int, tokens: list[int]) -> BatchDone | BatchFailed:
        # the request's first Run (each Run here is one, or one after a close): a table of the pool's first blocks
        table = list(range(-(-len(tokens) // 16)))
        item = WorkItem(request_id=request_id, tokens=tokens, kv_at=0, kv_blocks=table)
        self.queue.send(0, RunBatch(batch_id=batch_id, node="lm", items=[item]))
        while True:
            reply = await self.expect((BatchDone, BatchFailed))
            if reply.batch_id == batch_id:
                return reply

    async def beat_with(self, num_dropped: int) -> Heartbeat:
        """A heartbeat sent after `num_dropped` messages were dropped (counts travel with the beats)."""
        for _ in range(40):
            beat = await self.expect(Heartbeat)
            if beat.dropped_messages >= num_dropped:
                return await self.expect(Heartbeat)    # one more: nothing else is still being counted
        raise AssertionError(f"the worker never counted {num_dropped} dropped messages (last beat: {beat})")

    def close(self) -> None:
        self.queue.close()
        self.guard.stop()
        self.ctx.term()


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("opened") / "keys"
    write_cluster_keys(out, 1)
    return str(out)


def _push(keys_dir: str, endpoint: str, *messages: tuple[Any, dict]) -> None:
    """Push worker-to-worker messages to the inbox at `endpoint` as a peer holding rank 0's key."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 5000)      # close() delivers what is queued first
    rank0 = ClusterKeys.load(f"{keys_dir}/rank-0.json")
    make_client(push, rank0, rank0.public)    # rank 0's inbox serves with rank 0's own pair
    push.connect(endpoint)
    for msg, tensors in messages:
        metas, frames = zip(*(tensor_to_frame(name, t) for name, t in tensors.items())) if tensors else ((), ())
        msg.tensors = list(metas)
        push.send_multipart([encode(msg), *frames])
    push.close()
    ctx.term()


async def _scenario(plan: str, keys_dir: str) -> None:
    conductor = FakeConductor(keys_dir)
    worker = subprocess.Popen([sys.executable, "-m", "runtime.entrypoints.cli", "worker", plan, "--conductor",
                               conductor.queue.endpoint, "--rank", "0", "--key", f"{keys_dir}/rank-0.json",
                               "--log-level", "error"], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        inbox = (await conductor.expect(Hello, 60)).peer_endpoint
        conductor.queue.send(0, Welcome())     # no tensor-parallel group: an empty rendezvous
        ready = await conductor.expect(Ready, 60)
        # Ready carries the rank's numbers: /metrics has them from the first moment the server is ready
        assert ready.held is not None and ready.held.counted and ready.held.kv_used_blocks == {"lm": 0}, ready
        never = await conductor.run(1, 5, PROMPT)
        assert isinstance(never, BatchFailed) and "not open on rank 0" in never.message, never
        _push(keys_dir, inbox, (EdgeTensors(request_id=6, tensors=[]), {"lm.hidden#1": torch.ones(2, 4)}),
              (KVState(request_id=6, node="lm", num_tokens=3), {}))

        conductor.queue.send(0, OpenRequest(request_id=7, params=GREEDY))
        first = await conductor.run(2, 7, PROMPT)
        assert isinstance(first, BatchDone) and len(first.items[0].tokens) == 1, first
        conductor.queue.send(0, CloseRequest(request_ids=[7]))
        closed = await conductor.run(3, 7, first.items[0].tokens)
        assert isinstance(closed, BatchFailed) and "not open on rank 0" in closed.message, closed
        _push(keys_dir, inbox, (EdgeTensors(request_id=7, tensors=[]), {"lm.hidden#2": torch.ones(2, 4)}))

        conductor.queue.send(0, OpenRequest(request_id=9, params=GREEDY))
        again = await conductor.run(5, 9, PROMPT)     # the same worker goes on, with the same answer
        assert isinstance(again, BatchDone) and again.items[0].tokens == first.items[0].tokens, again
        conductor.queue.send(0, CloseRequest(request_ids=[9]))
        beat = await conductor.beat_with(5)
        # the Runs of 5 and of 7 after its close, the tensors and KV of 6, the tensors of 7 after its close
        assert beat.dropped_messages == 5, beat
        assert beat.value_stores == 0 and beat.kv_used_blocks == {"lm": 0}, beat
        assert worker.poll() is None
        conductor.queue.send(0, Shutdown())
        assert await asyncio.to_thread(worker.wait, 30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        conductor.close()


def test_worker_serves_only_requests_opened_on_it(plan_dir, keys_dir) -> None:
    asyncio.run(_scenario(compile_plan(plan_dir, "smollm2", preset="tiny"), keys_dir))
