"""The requests a rank's worker was told to open and has not closed: the only ones it serves.

The conductor sends `OpenRequest` to a rank before anything of the request can reach it (before
its first RunBatch there, and before a Run elsewhere pushes it tensors, stream items or KV), and
`CloseRequest` when the request ends. A Run, tensor, stream item or KV state naming any other
request id (never opened, or already closed) is refused: nothing is stored for it. A request
whose params an executor refused at open (`fail`) stays known so that its Runs fail with that
reason, until it is closed like any other.
"""
from __future__ import annotations


class OpenedRequests:
    """Open request ids of one rank, and why an open failed."""

    def __init__(self) -> None:
        self._open: set[int] = set()
        self._failed: dict[int, str] = {}    # request -> why an executor refused its params

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._open

    def open(self, request_id: int) -> None:
        self._open.add(request_id)

    def fail(self, request_id: int, why: str) -> None:
        """The request's open raised: its Runs are refused with `why` until it is closed."""
        self._open.discard(request_id)
        self._failed[request_id] = why

    def ids(self) -> set[int]:
        """Every request known here: open, or whose open failed (both are closed on a Rejoin)."""
        return self._open | set(self._failed)

    def close(self, request_id: int) -> None:
        self._open.discard(request_id)
        self._failed.pop(request_id, None)

    def batch_problem(self, request_ids: list[int], tensor_names: list[str], rank: int) -> tuple[str, bool] | None:
        """Why a RunBatch of these requests, with conductor tensors named "<request_id>/<key>", cannot
        run (None: it can), and whether that makes it a misaddressed message. A request whose open
        failed fails its batch with the reason (the conductor then retries the others alone)."""
        failed = next((self._failed[r] for r in request_ids if r in self._failed), None)
        if failed is not None:
            return failed, False
        unopened = sorted({r for r in request_ids if r not in self._open})
        if unopened:
            return f"request(s) {unopened} are not open on rank {rank} (never opened, or closed)", True
        strays = [n for n in tensor_names if n.split("/", 1)[0] not in {str(r) for r in request_ids}]
        if strays:
            return f"tensors {strays} name no request of the batch", True
        return None
