"""The null worker: stands in for every rank of a plan inside the conductor's own process and
answers each `RunBatch` at once with one token per item, through the real transport messages
(`BatchDone` / `ItemResult` on the conductor's event queue). With it only the conductor's own
work (scheduling, batching, KV bookkeeping, applying results) is left to time."""
from __future__ import annotations

from typing import Any

from runtime.conductor.conductor import Conductor
from runtime.ranks.workers import WorkerSet
from runtime.transport.messages import BatchDone, ItemResult, RunBatch
from runtime.transport.queues import Envelope


class NullWorkers:
    """Marks every rank ready with roomy KV pools and replaces the conductor's `_send`."""

    def __init__(self, conductor: Conductor, kv_blocks: int = 1 << 16, block_size: int = 16, token: int = 7,
                 prefix_root: bytes | None = None) -> None:
        """`prefix_root`: the pools cache prefixes keyed from it (as a served LM's do, by default)."""
        self.conductor = conductor
        self.token = token
        self.batches = 0          # RunBatch messages answered (lead ranks)
        self.rows = 0             # items in them
        conductor.workers = WorkerSet("null", "inproc://null", len(conductor.plan.ranks), set(), None, "warning")
        for status in conductor.workers.ranks.values():
            status.is_ready = True
        for node in conductor.index.kv_nodes():
            for rank in node.placement.ranks:
                conductor.ledger.add_pool(rank, node.name, kv_blocks, block_size, prefix_root)
        conductor._send = self.send    # type: ignore[method-assign]

    def send(self, rank: int, msg: Any, tensors: dict | None = None) -> None:
        """Answer a RunBatch at once; every other message (open, close, peers) needs no answer."""
        if not isinstance(msg, RunBatch):
            return
        if not msg.follower:
            self.batches += 1
            self.rows += len(msg.items)
        items = [ItemResult(request_id=item.request_id, tokens=[self.token]) for item in msg.items]
        done = BatchDone(batch_id=msg.batch_id, rank=rank, items=items)
        self.conductor._events.put_nowait((rank, Envelope(done)))
