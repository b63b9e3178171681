"""The running requests, kept in arrival order as requests move in and out.

The conductor updates this set on the transitions that enter or leave RUNNING (admission,
resume, preemption, the end of a request), so a scheduling pass starts from it instead
of scanning every request it holds.
"""
from __future__ import annotations

from runtime.conductor.request import Request, RequestState


class RunningSet:
    """RUNNING requests by id, in arrival (id) order."""

    def __init__(self) -> None:
        self._requests: dict[int, Request] = {}

    def add(self, req: Request) -> None:
        rid = req.request_id
        is_late = bool(self._requests) and rid < next(reversed(self._requests))
        self._requests[rid] = req
        if is_late:   # a resumed request takes its place by arrival again (rare: after a preemption)
            self._requests = dict(sorted(self._requests.items()))

    def take_admitted(self, waiting: list[Request]) -> list[Request]:
        """Add the requests of `waiting` a scheduling pass admitted (or resumed); the ones still waiting."""
        still = []
        for req in waiting:
            if req.state == RequestState.RUNNING:
                self.add(req)
            elif req.state in (RequestState.WAITING, RequestState.PREEMPTED):
                still.append(req)
        return still

    def discard(self, req: Request) -> None:
        self._requests.pop(req.request_id, None)

    def requests(self) -> list[Request]:
        return list(self._requests.values())

    def __len__(self) -> int:
        return len(self._requests)
