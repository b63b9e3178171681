"""The utterance a realtime session is hearing: its audio featuriser and the plan request that encodes it.

The first append opens the request of the family's listen task (FamilyServing.realtime's Listener
names it and its client-fed stream); each append pushes the new stream items (log-mel frames)
through the conductor to the encoder's rank, where the stream's chunk policy releases encoder
windows as they complete and the encoder runs on each (the scheduling path of every streaming
edge). A reader task collects the rows the walk emits. The commit pushes the tail and closes the
stream: its final chunk is the tail window, and the request ends once that is encoded.
Counted on /metrics (mstar_realtime_audio_windows_total): windows whose rows arrived before the
commit ("streamed") and after it ("commit").
"""
from __future__ import annotations

import asyncio
from typing import Any

import torch

from runtime.entrypoints.http.audio_metrics import RealtimeMetrics
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import event_error
from runtime.entrypoints.http.families import Listener
from runtime.entrypoints.http.speech import speech_params


class Utterance:
    """One input audio buffer of a session, from its first append to its commit (or drop)."""

    def __init__(self, server: ServerContext, listener: Listener, metrics: RealtimeMetrics) -> None:
        self.server, self.listener, self.metrics = server, listener, metrics
        self.featuriser = listener.features()
        self.req: Any = None                          # the listen request, open from the first append
        self._reader: asyncio.Task[torch.Tensor] | None = None
        self._is_committed = False

    @property
    def seconds(self) -> float:
        return self.featuriser.seconds

    async def push(self, pcm16: bytes) -> None:
        """Append audio; its complete frames go into the request's stream at once."""
        if self.req is None:
            self._open()          # first: a QueueFull leaves the buffer as it was
        await self._push(self.featuriser.push(pcm16))

    async def commit(self) -> torch.Tensor:
        """End the utterance: the tail is pushed, the stream closed; the rows of every window (T, D)."""
        await self._push(self.featuriser.finish())
        self._is_committed = True
        self.server.conductor.close_stream(self.req, self.listener.stream_name)
        try:
            return await self._reader
        finally:
            self.server.conductor.abort(self.req)     # ended already; frees nothing twice

    def drop(self) -> None:
        """Forget the utterance (clear, barge-in, disconnect): its request and buffers are freed now."""
        if self.req is not None:
            self.server.conductor.abort(self.req)
            self._reader.cancel()

    async def _push(self, frames: torch.Tensor) -> None:
        await self.server.conductor.push_stream(self.req, self.listener.stream_name,
                                                self.listener.feature_items(frames))

    def _open(self) -> None:
        server = self.server
        self.req = server.conductor.submit(self.listener.listen_task, speech_params(server, {}, {}), [],
                                           timeout_s=server.config.request_timeout_s)
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> torch.Tensor:
        rows: list[torch.Tensor] = []
        while True:
            event = await self.req.events.get()
            if event.finish_reason == "error":
                raise event_error(event, "audio encoding")
            for key, tensor in event.tensors.items():
                if key == self.listener.rows_key and tensor.shape[0]:
                    rows.append(tensor)
                    self.metrics.windows.labels("commit" if self._is_committed else "streamed").inc()
            if event.finish_reason is not None:
                return torch.cat(rows)
