"""When a server's start gives up waiting for its workers' Ready.

Not after a fixed time: a rank compiling its decode steps on a small CPU takes minutes (each batch
bucket one or two), so the wait ends only when a rank that is not ready has made no start step
(runtime/progress.py, reported by its heartbeats) for `timeout` seconds — or at once when a
local worker exits before its Ready: a worker that cannot load (a CPU without the kernels its
dtype needs, a broken install) would fail the same way each time, and was restarted until the
timeout, hundreds of times, with nothing said but "not ready".
"""
from __future__ import annotations

import time
from typing import Mapping

from runtime.transport.messages import Heartbeat


class StartFailed(RuntimeError):
    """The workers did not all get ready: the message says which rank and why."""


class StartWatch:
    def __init__(self, timeout: float, now: float | None = None) -> None:
        self.timeout = timeout
        self.steps: dict[int, tuple[int, str, float]] = {}   # rank -> (steps, last step, when it was seen)
        self.started = time.monotonic() if now is None else now
        self.failure: str | None = None                       # why the start cannot succeed, once known

    def exited(self, rank: int, code: int | None) -> None:
        """The local worker of `rank` exited (status `code`) before it was ready: the start fails."""
        self.failure = self.failure or (f"the worker of rank {rank} exited with status {code} before it was ready "
                                        f"(its error is in this server's log above)")

    def progress(self, rank: int, steps: int, last: str, now: float | None = None) -> None:
        """A heartbeat of `rank` saying it has done `steps` start steps, the latest `last`. Any other
        count than the last one seen is progress: a worker restarted during the start counts from 0 again."""
        now = time.monotonic() if now is None else now
        seen = self.steps.get(rank)
        if seen is None or steps != seen[0]:
            self.steps[rank] = (steps, last, now)

    def stalled(self, beats: Mapping[int, Heartbeat], ready: set[int], num_ranks: int,
                now: float | None = None) -> str | None:
        """Why the start fails: a worker exited before it was ready, or a rank not `ready` went `timeout` s
        without a start step (its latest heartbeat in `beats`); else None."""
        if self.failure:
            return self.failure
        now = time.monotonic() if now is None else now
        for rank, beat in beats.items():
            self.progress(rank, beat.start_steps, beat.start_last, now)
        for rank in (r for r in range(num_ranks) if r not in ready):
            steps, last, when = self.steps.get(rank, (0, "", self.started))
            if now - when > self.timeout:
                did = f"its last step: {last}" if steps else "no start step reported"
                return (f"rank {rank} not ready and without progress for {now - when:.0f} s ({did}; "
                        f"--ready-timeout {self.timeout:.0f})")
        return None
