"""A speaking request's events as the handlers write them: text ids and audio pieces, playback measured.

`AudioEvents` turns the events of a request of the plan's speech task (runtime/entrypoints/http/speech_model.py)
into (text ids, audio pieces, is last), and records on /metrics what the client receives
(runtime/entrypoints/http/audio_metrics.py): time to first audio, underruns, seconds, real-time factor.
"""
from __future__ import annotations

import time

import torch

from runtime.conductor.request import Request
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import event_error
from runtime.entrypoints.http.speech_model import SpeechModel
from runtime.streams.deadline import PlaybackClock
from runtime.transport.messages import TokenLogprob


class AudioEvents:
    """A speaking request's events as (text ids, audio pieces, is last); playback measured."""

    def __init__(self, server: ServerContext, req: Request, model: SpeechModel) -> None:
        self.server, self.req, self.model = server, req, model
        self.clock = PlaybackClock(req.arrival)
        self.num_samples = 0
        self.last_audio_at: float | None = None
        self.logprobs: list[TokenLogprob] = []    # the last event's, one per text id (when asked)
        self.finish_reason: str | None = None     # the last event's: "stop", "length", ... once done

    async def next(self) -> tuple[list[int], list[torch.Tensor], bool]:
        event = await self.req.events.get()
        if event.finish_reason == "error":
            raise event_error(event)
        self.logprobs, self.finish_reason = event.logprobs, event.finish_reason
        audio = [t for key, t in event.tensors.items() if key == self.model.audio_key and t.numel()]
        return event.token_ids, audio, event.finish_reason is not None

    def sent(self, audio: torch.Tensor) -> None:
        """A piece of audio has been written to the client."""
        now = time.monotonic()
        if self.clock.first_chunk_s is None:
            self.server.audio_metrics.time_to_first_audio.observe(now - self.req.arrival)
        before = self.clock.num_underruns
        self.clock.on_chunk_sent(now, audio.numel() / self.model.sample_rate)
        self.server.audio_metrics.underruns.inc(self.clock.num_underruns - before)
        self.server.audio_metrics.chunks.inc()
        self.num_samples += audio.numel()
        self.last_audio_at = now

    @property
    def audio_seconds(self) -> float:
        return self.num_samples / self.model.sample_rate

    def observe(self) -> None:
        """The request completed: record its audio length and real-time factor."""
        metrics = self.server.audio_metrics
        metrics.audio_seconds.observe(self.audio_seconds)
        if self.num_samples and self.last_audio_at is not None:
            metrics.real_time_factor.observe((self.last_audio_at - self.req.arrival) / self.audio_seconds)
        self.server.observe_finished(self.req)
