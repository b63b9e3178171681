"""OutputQueue: one producer (the conductor), one consumer (a request's stream handler)."""
from __future__ import annotations

import asyncio

import pytest

from runtime.conductor.output_queue import OutputQueue


def test_items_come_out_in_order_and_a_waiting_get_wakes_on_put():
    async def go() -> list[int]:
        q: OutputQueue[int] = OutputQueue()
        q.put_nowait(1)
        got = [await q.get()]
        waiting = asyncio.create_task(q.get())
        await asyncio.sleep(0)            # the consumer now waits on an empty queue
        assert not waiting.done()
        q.put_nowait(2)
        q.put_nowait(3)
        got.append(await waiting)
        got.append(await q.get())
        return got
    assert asyncio.run(go()) == [1, 2, 3]


def test_get_nowait_empty_and_a_cancelled_get_leaves_the_queue_usable():
    async def go() -> int:
        q: OutputQueue[str] = OutputQueue()
        assert q.empty() and q.qsize() == 0
        with pytest.raises(asyncio.QueueEmpty):
            q.get_nowait()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(q.get(), 0.01)     # a client that went away cancels its handler's wait
        q.put_nowait("a")
        assert q.qsize() == 1 and q.get_nowait() == "a"
        q.put_nowait("b")
        return len(await q.get())
    assert asyncio.run(go()) == 1


def test_a_second_waiting_consumer_is_refused():
    async def go() -> None:
        q: OutputQueue[int] = OutputQueue()
        first = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="one consumer"):
            await q.get()
        q.put_nowait(7)
        assert await first == 7
    asyncio.run(go())
