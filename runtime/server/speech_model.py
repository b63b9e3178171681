"""What a plan needs to speak: its speech task, where the audio comes out, and its prompts.

Two families of speaking graphs are recognised by their node kinds:
  * Orpheus (`snac_decoder`): task `speech`; the prompt is Orpheus' own
    `<start_of_human> "{voice}: {text}" <eot> <end_of_human> <start_of_ai> <start_of_speech>`.
  * Qwen3-Omni (`qwen3_omni_talker`): task `voice_chat`; the prompt is a ChatML chat whose
    last turn is an open `<|im_start|>assistant` (the talker needs that turn), and the
    talker's speaker is a request param. With seeded random weights the server has a byte
    tokenizer and no chat template, so the ChatML special tokens are written as the ids
    the talker preset names (`im_start_token_id`, `user_token_id`, `assistant_token_id`).
`AudioEvents` turns a speaking request's events into text ids and audio pieces, and
measures what the client receives for /metrics.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mstar_compiler.plan import Plan
from runtime.conductor.request import Request
from runtime.conductor.streams import track_nodes
from runtime.server.errors import ApiError, event_error
from runtime.server.text import ByteTokenizer
from runtime.streams.deadline import PlaybackClock

ORPHEUS_START_HUMAN, ORPHEUS_PROMPT_END = 128259, (128009, 128260, 128261, 128257)
SYSTEM_ROLE_BYTES = b"system"


@dataclass(frozen=True)
class SpeechModel:
    """How the served plan speaks."""

    family: str                  # "orpheus" | "omni"
    task: str                    # the task with the audio track
    audio_key: str               # "<node>.<port>" of the audio chunks
    sample_rate: int
    talker_dims: dict[str, Any] = field(default_factory=dict)   # omni: the talker preset (special ids)


def speech_model(plan: Plan) -> SpeechModel | None:
    """The plan's way of speaking, or None when it has no audio-producing task."""
    by_kind = {n.kind: n for n in plan.nodes}
    family, vocoder = ("orpheus", by_kind.get("snac_decoder")) if "snac_decoder" in by_kind else \
        ("omni", by_kind.get("qwen3_omni_code2wav"))
    if vocoder is None:
        return None
    task = next((t.name for t in plan.tasks for tr in t.tracks
                 if tr.per_chunk is not None and vocoder.name in track_nodes(plan, tr)), None)
    if task is None:
        return None
    port = next(p.name for p in vocoder.outputs if p.dtype == "audio")
    talker = by_kind.get("qwen3_omni_talker")
    return SpeechModel(family, task, f"{vocoder.name}.{port}", int(vocoder.dims.get("sampling_rate", 24000)),
                       dict(talker.dims) if talker else {})


def orpheus_prompt(tokenizer: Any, voice: str, text: str) -> list[int]:
    """Orpheus' prompt ids for `text` in `voice`."""
    ids = tokenizer.encode(f"{voice}: {text}")
    return [ORPHEUS_START_HUMAN, *ids, *ORPHEUS_PROMPT_END]


def omni_prompt(tokenizer: Any, dims: dict[str, Any], messages: list[dict[str, str]]) -> list[int]:
    """ChatML ids ending in an open assistant turn (module docstring)."""
    if not isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt=True), add_special_tokens=False)
    role_ids = {"user": [dims["user_token_id"]], "assistant": [dims["assistant_token_id"]],
                "system": list(SYSTEM_ROLE_BYTES)}
    ids: list[int] = []
    for m in messages:
        if m["role"] not in role_ids:
            raise ApiError(400, f"unknown role '{m['role']}' (system, user, assistant)", "messages")
        ids += [dims["im_start_token_id"], *role_ids[m["role"]], *tokenizer.encode("\n" + m["content"] + "\n")]
    return ids + [dims["im_start_token_id"], dims["assistant_token_id"], *tokenizer.encode("\n")]


class AudioEvents:
    """A speaking request's events as (text ids, audio pieces, is last); playback measured."""

    def __init__(self, server: Any, req: Request, model: SpeechModel) -> None:
        self.server, self.req, self.model = server, req, model
        self.clock = PlaybackClock(req.arrival)
        self.num_samples = 0
        self.last_audio_at: float | None = None

    async def next(self) -> tuple[list[int], list[torch.Tensor], bool]:
        event = await self.req.events.get()
        if event.finish_reason == "error":
            raise event_error(event)
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
