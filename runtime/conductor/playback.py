"""Playback clocks of the requests that stream audio, for deadline-aware scheduling.

A request whose task has a node with an audio output gets a `PlaybackClock`
(runtime/streams/deadline.py) when it is submitted; every audio tensor it sends to the
client advances the clock. Each scheduling pass the conductor orders running requests
by `order()`: audio requests earliest playback deadline first (the client whose buffer
runs dry soonest), then the others in their previous order. Batches have a size limit,
so the order decides who waits when a rank is saturated.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from mstar_compiler.plan import Plan
from runtime.conductor.request import Request
from runtime.conductor.streams import track_nodes
from runtime.streams.deadline import PlaybackClock, by_deadline


class PlaybackBook:
    """Every audio request's playback clock; totals for /metrics."""

    def __init__(self, plan: Plan, first_audio_target_s: float = 1.0,
                 now: Callable[[], float] = time.monotonic) -> None:
        # "<node>.<port>" of every audio output -> its sampling rate
        self.rates = {f"{n.name}.{p.name}": int(n.dims.get("sampling_rate", 24000))
                      for n in plan.nodes for p in n.outputs if p.dtype == "audio"}
        audio_nodes = {key.rpartition(".")[0] for key in self.rates}     # an included node's name has dots
        self.audio_tasks = {t.name for t in plan.tasks
                            if any(audio_nodes & track_nodes(plan, track) for track in t.tracks)}
        self.first_audio_target_s = first_audio_target_s
        self.clocks: dict[int, PlaybackClock] = {}
        self.num_underruns = 0
        self.now = now          # the clock chunks are sent by (tests drive a simulated one)

    def open(self, req: Request) -> None:
        if req.task in self.audio_tasks:
            self.clocks[req.request_id] = PlaybackClock(req.arrival, self.first_audio_target_s)

    def free(self, request_id: int) -> PlaybackClock | None:
        return self.clocks.pop(request_id, None)

    def on_tensors(self, req: Request, tensors: dict[str, Any]) -> None:
        """Audio sent to the client: advance the request's clock (an underrun is counted)."""
        clock = self.clocks.get(req.request_id)
        if clock is None:
            return
        for key, tensor in tensors.items():
            rate = self.rates.get(key)
            if rate is not None and tensor.numel():
                before = clock.num_underruns
                clock.on_chunk_sent(self.now(), tensor.numel() / rate)
                self.num_underruns += clock.num_underruns - before

    def order(self, running: list[Request]) -> list[Request]:
        """Audio requests earliest deadline first, then the rest in their given order."""
        if not self.clocks:
            return running
        live = {str(r.request_id): self.clocks[r.request_id] for r in running if r.request_id in self.clocks}
        if not live:
            return running
        rank = {int(rid): i for i, rid in enumerate(by_deadline(live))}
        return sorted(running, key=lambda r: (0, rank[r.request_id]) if r.request_id in rank else (1, 0))
