"""Transport: typed messages round-trip through msgpack, tensors through raw frames, over real ZeroMQ."""
from __future__ import annotations

import asyncio

import msgspec
import pytest
import torch
import zmq
import zmq.asyncio

from runtime.transport.frames import frame_to_tensor, tensor_to_frame
from runtime.transport.messages import (
    BatchDone, EdgeTensors, Hello, ItemResult, RunBatch, Route, WorkItem, decode, encode,
)
from runtime.transport.queues import ConductorQueue, EdgeInbox, EdgeOutbox, WorkerQueue


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8])
def test_frame_round_trip_every_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    t = (torch.randn(3, 5, 2) * 10).to(dtype)
    meta, buf = tensor_to_frame("x", t)
    back = frame_to_tensor(meta, bytearray(buf))
    assert back.dtype == dtype and back.shape == t.shape
    assert torch.equal(back, t)


def test_frame_of_non_contiguous_and_empty() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    meta, buf = tensor_to_frame("t", t)
    assert torch.equal(frame_to_tensor(meta, bytes(buf)), t)
    meta, buf = tensor_to_frame("e", torch.empty(0, 7))
    assert frame_to_tensor(meta, bytes(buf)).shape == (0, 7)


def test_messages_are_typed_and_reject_garbage() -> None:
    msg = RunBatch(batch_id=7, node="lm", items=[WorkItem(request_id=1, tokens=[1, 2], routes=[Route("h", 1, "lm.h")])])
    back = decode(encode(msg))
    assert back == msg and isinstance(back, RunBatch)
    with pytest.raises(msgspec.ValidationError):
        decode(msgspec.msgpack.encode({"type": "run", "batch_id": "seven", "node": "lm", "items": []}))
    with pytest.raises(msgspec.ValidationError):
        decode(msgspec.msgpack.encode({"type": "no-such-message"}))


def test_receive_is_zero_copy_over_zeromq() -> None:
    ctx = zmq.Context()
    inbox = EdgeInbox(ctx, "127.0.0.1", "127.0.0.1")
    outbox = EdgeOutbox(ctx)
    outbox.set_peers({1: inbox.endpoint})
    t = torch.randn(64, 64)
    outbox.send(1, EdgeTensors(request_id=3, tensors=[]), {"llm.hidden": t})
    env = inbox.recv()
    got = env.tensors["llm.hidden"]
    assert env.msg.request_id == 3 and torch.equal(got, t)
    # the tensor wraps the received frame's memory: writing through it is visible in a second view of it
    alias = torch.frombuffer(got.numpy(), dtype=torch.float32)
    got[0, 0] = 123.0
    assert alias[0] == 123.0
    outbox.close(); inbox.close(); ctx.term()


def test_conductor_and_worker_queues_over_tcp() -> None:
    async def scenario() -> None:
        actx = zmq.asyncio.Context()
        conductor = ConductorQueue(actx, "tcp://127.0.0.1:0")
        ctx = zmq.Context()
        worker = WorkerQueue(ctx, conductor.endpoint, rank=2)
        worker.send(Hello(rank=2, pid=1, peer_endpoint="tcp://127.0.0.1:1"))
        rank, env = await asyncio.wait_for(conductor.recv(), 5)
        assert rank == 2 and isinstance(env.msg, Hello)
        conductor.send(2, RunBatch(batch_id=1, node="n", items=[]), {"1/x": torch.ones(2)})
        got = await asyncio.to_thread(worker.recv)
        assert isinstance(got.msg, RunBatch) and torch.equal(got.tensors["1/x"], torch.ones(2))
        worker.send(BatchDone(batch_id=1, rank=2, items=[ItemResult(request_id=5, tokens=[9])]))
        _, env = await asyncio.wait_for(conductor.recv(), 5)
        assert env.msg.items[0].tokens == [9]
        with pytest.raises(zmq.ZMQError):
            conductor.send(9, RunBatch(batch_id=2, node="n", items=[]))
        worker.close(); conductor.close(); ctx.term(); actx.term()

    asyncio.run(scenario())
