"""What the conductor is doing right now, as one JSON-ready snapshot (`GET /v1/state`, the page).

The conductor's step pays only `observe_batch` (a few dict updates per finished batch);
everything else is read from the conductor's own tables when a snapshot is built, which
the server does at most a few times per second however many clients watch
(runtime/entrypoints/http/state_feed.py). Rates (batches/s, busy share) are over the time since the
previous snapshot.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from mstar_compiler.plan import Parallel, Plan, Run
from runtime.conductor.cursor import TrackCursor
from runtime.conductor.request import Request, RequestState

if TYPE_CHECKING:
    from runtime.conductor.kv_ledger import KVLedger
    from runtime.conductor.streams import StreamLedger

MAX_LISTED = 256         # live requests listed one by one in a snapshot (all are counted)


class Observed(Protocol):
    """The conductor's tables a snapshot reads."""

    plan: Plan
    requests: Mapping[int, Request]
    streams: StreamLedger
    ledger: KVLedger


@dataclass
class _Window:
    """Cumulative counters at the previous snapshot, for rates."""

    at: float = field(default_factory=time.monotonic)
    batches: dict[str, int] = field(default_factory=dict)
    busy_ms: dict[int, float] = field(default_factory=dict)


class LiveState:
    """Batch counters kept by the conductor, and the snapshot built from them and its tables."""

    def __init__(self) -> None:
        self.batches: dict[str, int] = {}        # node -> batches finished
        self.last_batch: dict[str, int] = {}     # node -> requests in its latest finished batch
        self.busy_ms: dict[int, float] = {}      # rank -> worker time spent running batches
        self._window = _Window()

    def observe_batch(self, group: list[int], node: str, size: int, run_ms: float) -> None:
        """A batch came back (called once per batch by the conductor)."""
        self.batches[node] = self.batches.get(node, 0) + 1
        self.last_batch[node] = size
        for rank in group:
            self.busy_ms[rank] = self.busy_ms.get(rank, 0.0) + run_ms

    def snapshot(self, conductor: Observed) -> dict[str, Any]:
        now = time.monotonic()
        dt = max(now - self._window.at, 1e-3)
        plan = conductor.plan
        nodes = {n.name: {"waiting": 0, "running": 0, "last_batch": self.last_batch.get(n.name, 0),
                          "batches": self.batches.get(n.name, 0),
                          "batches_per_s": (self.batches.get(n.name, 0) - self._window.batches.get(n.name, 0)) / dt,
                          "kv": _kv(conductor, n.name) if n.has_kv_cache else None}
                 for n in plan.nodes}
        tasks = {t.name: {s.name.lower(): 0 for s in RequestState if not s.is_final} for t in plan.tasks}
        listed = []
        for req in conductor.requests.values():
            where = [_position(c) for c in req.tracks]
            for spot in where:
                for node, running in spot["nodes"]:
                    nodes[node]["running" if running else "waiting"] += 1
            if not req.state.is_final:
                tasks[req.task][req.state.name.lower()] += 1
            if len(listed) < MAX_LISTED:
                listed.append(_listed(req, where))
        ranks = {str(r.index): {"busy": min(1.0, (self.busy_ms.get(r.index, 0.0)
                                                  - self._window.busy_ms.get(r.index, 0.0)) / 1e3 / dt),
                                "nodes": list(r.nodes)} for r in plan.ranks}
        self._window = _Window(now, dict(self.batches), dict(self.busy_ms))
        return {"model": plan.model, "time": time.time(), "window_s": dt, "nodes": nodes,
                "streams": conductor.streams.buffered(), "ranks": ranks, "tasks": tasks,
                "num_requests": len(conductor.requests), "requests": listed}


def _kv(conductor: Observed, node: str) -> dict[str, int]:
    accounts = conductor.ledger.accounts(node)     # a cache the node shares (BAGEL's branches) shows whole
    return {"used_blocks": sum(a.used_blocks for a in accounts), "num_blocks": sum(a.num_blocks for a in accounts)}


def _position(cursor: TrackCursor) -> dict[str, Any]:
    """Where one track is: its walk and the node(s) it waits on or runs (Parallel: one per branch)."""
    walk = cursor.walk
    if cursor.is_done or walk is None or cursor.pc >= len(walk.program):
        return {"walk": None, "nodes": []}
    op = walk.program[cursor.pc]
    if isinstance(op, Run):
        return {"walk": walk.name, "nodes": [(op.node, -1 in cursor.in_flight)]}
    if isinstance(op, Parallel):
        return {"walk": walk.name, "nodes": [(branch[pos].node, b in cursor.in_flight)
                                             for b, (branch, pos) in enumerate(zip(op.branches, cursor.branch_pos))
                                             if pos < len(branch)]}
    return {"walk": walk.name, "nodes": []}


def _listed(req: Request, where: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": req.request_id, "task": req.task, "state": req.state.name.lower(),
            "age_s": round(time.monotonic() - req.arrival, 3), "num_output_tokens": len(req.output_ids),
            "tracks": [{"name": c.track.name, "walk": w["walk"],
                        "nodes": [{"node": n, "running": r} for n, r in w["nodes"]]} for c, w in zip(req.tracks, where)]}
