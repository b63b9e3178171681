"""A worker's heartbeat: a thread with its own socket that tells the conductor, every HEARTBEAT_S, that the
rank is alive (even while a long batch runs) and what it holds (runtime.transport.messages.Heartbeat)."""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Mapping, Protocol

import zmq

from runtime.transport.messages import Heartbeat, encode
from runtime.transport.queues import WorkerQueue
from runtime import progress

if TYPE_CHECKING:
    from runtime.worker.executors import Executor
    from runtime.transport.keys import ClusterKeys, ThreadGuard
    from runtime.worker.openmp import ThreadGovernor
    from runtime.worker.streams import WorkerStreams

HEARTBEAT_S = 0.5
SNAPSHOT_TRIES = 20      # reads of the worker's tables per beat (each a few microseconds) before it goes without


class Beating(Protocol):
    """What the heartbeat reads of its worker, from the start (parts not built yet are empty or None)."""

    rank: int
    ctx: zmq.Context
    keys: ClusterKeys | None
    guard: ThreadGuard | None
    executors: Mapping[str, Executor]
    streams: WorkerStreams | None
    values: Mapping[int, Any]
    dropped: int
    governor: ThreadGovernor | None


def start_heartbeat(worker: Beating, conductor: str) -> None:
    def beat() -> None:
        queue = WorkerQueue(worker.ctx, conductor, worker.rank, worker.keys,
                            identity=f"rank-{worker.rank}-hb".encode())
        queue.socket.setsockopt(zmq.LINGER, 0)
        while True:
            queue.socket.send(encode(heartbeat(worker)))
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, daemon=True, name="heartbeat").start()


def heartbeat(worker: Beating) -> Heartbeat:
    """Alive, with what the rank holds. Read from the heartbeat thread while the worker changes its tables:
    a read that meets a table changing size is tried again; after SNAPSHOT_TRIES it goes without its
    numbers (`counted=False`: the conductor keeps the ones it has), so the rank still counts as alive."""
    for _ in range(SNAPSHOT_TRIES):
        try:
            return _snapshot(worker)
        except RuntimeError:   # a table changed size under us
            continue
    steps, last = progress.snapshot()
    return Heartbeat(rank=worker.rank, start_steps=steps, start_last=last, counted=False)


def _snapshot(worker: Beating) -> Heartbeat:
    """What the rank holds (the worker may still be starting: each part it has not built yet is left out,
    and the beat is not `counted` until its executors are built)."""
    executors = dict(worker.executors)
    streams, guard, governor = worker.streams, worker.guard, worker.governor
    steps, last = progress.snapshot()
    return Heartbeat(rank=worker.rank, start_steps=steps, start_last=last,
                     kv_used_blocks={n: ex.kv_used_blocks() for n, ex in executors.items() if ex.kv_blocks},
                     stream_buffers=streams.num_buffers if streams else 0,
                     value_stores=len(worker.values),
                     dropped_messages=worker.dropped,
                     refused_peers=guard.admission.refused if guard else 0,
                     threads=governor.threads if governor else 0,
                     threads_allotted=governor.allotted if governor else 0,
                     counted=bool(executors))
