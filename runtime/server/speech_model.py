"""What a plan needs to speak: its speech task, where the audio comes out, and who prompts it.

A speaking graph is recognised by its family's `Speaker` (runtime/server/families.py): the
vocoder kind whose audio the client hears, the model's voices and its prompts.
`AudioEvents` turns a speaking request's events into text ids and audio pieces, and
measures what the client receives for /metrics.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mstar_compiler.plan import Plan
from runtime.conductor.request import Request
from runtime.conductor.streams import track_nodes
from runtime.server.errors import ApiError, event_error
from runtime.server.families import Speaker, families_of
from runtime.streams.deadline import PlaybackClock
from runtime.transport.messages import TokenLogprob

if TYPE_CHECKING:
    from runtime.server.app import MstarServer


@dataclass(frozen=True)
class SpeechModel:
    """How the served plan speaks."""

    task: str                    # the task with the audio track
    audio_key: str               # "<node>.<port>" of the audio chunks
    sample_rate: int
    speaker: Speaker             # its family's prompts and voices


def speech_model(plan: Plan) -> SpeechModel | None:
    """The plan's way of speaking, or None when it has no audio-producing task."""
    for family in families_of(plan):
        speaker = family.speaker
        vocoder = next((n for n in plan.nodes if speaker and n.kind == speaker.vocoder_kind), None)
        if vocoder is None:
            continue
        task = next((t.name for t in plan.tasks for tr in t.tracks
                     if tr.per_chunk is not None and vocoder.name in track_nodes(plan, tr)), None)
        if task is None:
            continue
        port = next(p.name for p in vocoder.outputs if p.dtype == "audio")
        return SpeechModel(task, f"{vocoder.name}.{port}", int(vocoder.dims.get("sampling_rate", 24000)), speaker)
    return None


class AudioEvents:
    """A speaking request's events as (text ids, audio pieces, is last); playback measured."""

    def __init__(self, server: MstarServer, req: Request, model: SpeechModel) -> None:
        self.server, self.req, self.model = server, req, model
        self.clock = PlaybackClock(req.arrival)
        self.num_samples = 0
        self.last_audio_at: float | None = None
        self.logprobs: list[TokenLogprob] = []    # the last event's, one per text id (when asked)

    async def next(self) -> tuple[list[int], list[torch.Tensor], bool]:
        event = await self.req.events.get()
        if event.finish_reason == "error":
            raise event_error(event)
        self.logprobs = event.logprobs
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
