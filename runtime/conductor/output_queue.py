"""`OutputQueue`: a request's output events, from the conductor to the one handler that answers them.

The conductor puts one event per request per step (runtime/conductor/request.py); the server's
handler for that request awaits them in order (runtime/entrypoints/http: chat, tasks, speech...). That is
one producer and one consumer on one event loop, so this is a deque and at most one waiting
future: `put_nowait` is an append and, when the handler waits, one `set_result` — a few
bytecodes where `asyncio.Queue`'s (built for many producers, many consumers and a bound) are
tens, paid on every token of every request.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class OutputQueue(Generic[T]):
    """Unbounded FIFO for one consumer: `put_nowait` / `get` (async) / `get_nowait` / `empty`."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None   # the consumer's pending `get`

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> T:
        """The next item, waiting for it; only one consumer may wait at a time."""
        while not self._items:
            if self._waiter is not None:
                raise RuntimeError("OutputQueue has one consumer: a second get() is waiting")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def get_nowait(self) -> T:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)
