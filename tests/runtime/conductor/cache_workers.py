"""Workers for conductor tests that speak the real messages (runtime/conductor/null_workers.py) and keep a
KV length per request as a real cache does: each item's token is that length, so a wrong count
or a wrong recompute of a request's context shows in its tokens."""
from __future__ import annotations

from runtime.conductor.conductor import Conductor
from runtime.transport.messages import BatchDone, BatchFailed, CloseRequest, ItemResult, OpenRequest, RunBatch
from runtime.transport.queues import Envelope
from runtime.conductor.null_workers import NullWorkers

POISON = 13    # a request with this top_k makes the fake node raise (as top_k=2**63 once did)


class CacheWorkers(NullWorkers):
    """Each item's token is the request's KV length after it, so a wrong recompute shows."""

    def __init__(self, conductor: Conductor, kv_blocks: int = 1 << 16) -> None:
        super().__init__(conductor, kv_blocks=kv_blocks)
        self.kv: dict[int, int] = {}
        self.poisoned: set[int] = set()
        self.failed_batches = 0

    def send(self, rank: int, msg, tensors: dict | None = None) -> None:
        if isinstance(msg, OpenRequest) and msg.params.sampling.top_k == POISON:
            self.poisoned.add(msg.request_id)
        elif isinstance(msg, CloseRequest):
            for rid in msg.request_ids:
                self.kv.pop(rid, None)
        elif isinstance(msg, RunBatch):
            self._run(rank, msg)

    def _run(self, rank: int, msg: RunBatch) -> None:
        if any(item.request_id in self.poisoned for item in msg.items):
            self.failed_batches += 1
            reply = BatchFailed(batch_id=msg.batch_id, rank=rank, message="OverflowError: int too big to convert")
            self.conductor._events.put_nowait((rank, Envelope(reply)))
            return
        items = []
        for item in msg.items:
            self.kv[item.request_id] = self.kv.get(item.request_id, 0) + len(item.tokens)
            items.append(ItemResult(request_id=item.request_id, tokens=[self.kv[item.request_id]]))
        self.conductor._events.put_nowait((rank, Envelope(BatchDone(batch_id=msg.batch_id, rank=rank, items=items))))
