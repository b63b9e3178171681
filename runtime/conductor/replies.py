"""What the conductor does with a worker's answer to a batch before applying it.

`InFlight` is a batch sent and not yet answered. `ReplyCheck.accept` keeps only replies that answer a batch in flight, from a rank that
batch was sent to (the sender's rank is the one its socket authenticated as, not the rank
the message names), naming exactly the requests that were sent; anything else is counted,
logged and dropped. `retry_alone` undoes a failed Run's bookkeeping so the request can run
again by itself (the conductor then preempts it: its KV context is recomputed).
"""
from __future__ import annotations

import logging
from typing import Any

from dataclasses import dataclass, field

from runtime.conductor.batch import Entry, PlannedBatch
from runtime.transport.messages import BatchDone, BatchFailed
from runtime.transport.log_rate import is_worth_logging
from runtime.transport.queues import Envelope

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """A batch sent and not yet answered by every rank of its group."""

    batch: PlannedBatch
    sent_at: float
    pending: set[int] = field(default_factory=set)   # ranks of the batch's group still running it
    lead: tuple[BatchDone, Envelope] | None = None   # the lead rank's answer, applied once all are done
    cohorts: frozenset[str] = frozenset()            # its rows' loops of several nodes (PlanIndex.cohort_ops)


class ReplyCheck:
    """Counts and drops forged or stale BatchDone / BatchFailed messages."""

    def __init__(self) -> None:
        self.dropped = 0    # replies that matched nothing sent (shown in /metrics)

    def accept(self, sender: int, msg: Any, in_flight: dict[int, Any]) -> bool:
        """Whether `msg` from `sender` may be applied (a worker's message about its own rank)."""
        if isinstance(msg, (BatchDone, BatchFailed)):
            problem = self._problem(sender, msg, in_flight)
        else:
            problem = None if getattr(msg, "rank", sender) == sender else f"it names rank {msg.rank}"
        if problem is None:
            return True
        self.dropped += 1
        if is_worth_logging(self.dropped):
                log.warning("dropping %s from rank %d: %s (%d dropped)", type(msg).__name__, sender, problem,
                        self.dropped)
        return False

    @staticmethod
    def _problem(sender: int, msg: BatchDone | BatchFailed, in_flight: dict[int, Any]) -> str | None:
        flight = in_flight.get(msg.batch_id)
        if flight is None:
            return f"batch {msg.batch_id} is not running"
        if msg.rank != sender:
            return f"it names rank {msg.rank}"
        if sender not in flight.batch.group:
            return f"the batch was sent to rank(s) {flight.batch.group}"
        if sender not in flight.pending:
            return "that rank has answered it already"
        if isinstance(msg, BatchDone):
            sent = [e.item.request_id for e in flight.batch.entries]
            got = [item.request_id for item in msg.items]
            if got != sent:
                return f"it answers requests {got}, the batch holds {sent}"
        return None


def can_retry_alone(entry: Entry) -> bool:
    """A Run can run again by itself when nothing it consumed is gone: no stream chunks
    taken, no KV cache moved in, and no other Run of the request in flight."""
    req = entry.request
    if entry.item.stream_in or entry.item.kv_in:
        return False
    others = sum(len(c.in_flight) for c in req.tracks)
    return others == 1


def retry_alone(entry: Entry) -> None:
    """Undo the failed Run's bookkeeping and mark the request to run in batches of one."""
    req = entry.request
    for cursor in req.tracks:
        if cursor.index == entry.pending.track:
            cursor.requeue(entry.pending)
    history = req.kv_history.get(entry.pending.run.node)
    if history is not None and entry.kv_added:
        del history[len(history) - entry.kv_added:]
    req.isolated = True
