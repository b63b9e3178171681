"""/v1/realtime on a plan's cascade (graphs/voice_agent.yaml's `converse`): the Realtime protocol's session
(realtime_session.py: the same client events, the same conversation, the same output events) over the
cascade's models.

The input audio buffer holds the user's audio (pcm16 at 24 kHz) as it arrives; the commit sends it whole
to the cascade's transcribe stage, and the user item carries what was heard (its `transcript`; then
`conversation.item.input_audio_transcription.completed`, as OpenAI's input transcription sends it).
`response.create` runs the cascade's chat and speak stages over the conversation as text (the session's
instructions as the system turn): `response.audio_transcript.delta` as the chat LM writes, and each
clause's `response.audio.delta` as the speaking model says it, while the rest is still written. With
`turn_detection: {"type": "server_vad"}` the turns are heard by the voice activity detector of the
cascade's model that has one (the recogniser's). A cascade's session serves no tools.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from mstar_compiler.plan import Cascade
from runtime.entrypoints.http.audio_decode import PCM_RATE
from runtime.entrypoints.http.audio_io import wav
from runtime.entrypoints.http.audio_metrics import RealtimeMetrics
from runtime.entrypoints.http.cascade import CascadeAnswer, stages, transcribe, voice_of
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.realtime_conversation import Item
from runtime.entrypoints.http.realtime_response import ResponseOutput
from runtime.entrypoints.http.realtime_session import MODALITIES, RealtimeSession
from runtime.entrypoints.http.schemas import TurnDetection
from runtime.entrypoints.http.tools import ToolUse


class AudioBuffer:
    """A cascade session's input audio buffer: the user's pcm16, kept until the commit."""

    def __init__(self) -> None:
        self.data = bytearray()

    @property
    def seconds(self) -> float:
        return len(self.data) / 2 / PCM_RATE

    async def push(self, pcm16: bytes) -> None:
        self.data += pcm16

    async def commit(self) -> bytes:
        return bytes(self.data)

    def drop(self) -> None:
        self.data.clear()


class CascadeSession(RealtimeSession):
    """A realtime session whose answers come from a cascade of models."""

    def __init__(self, server: ServerContext, cascade: Cascade, metrics: RealtimeMetrics,
                 send: Callable[[dict], Awaitable[None]]) -> None:
        self.cascade = cascade
        self.hearing = stages(server, cascade)[0].model          # the transcribe stage's model
        super().__init__(server, None, metrics, send)

    def _new_utterance(self) -> AudioBuffer:
        return AudioBuffer()

    @property
    def max_seconds(self) -> float:
        return self.hearing.chat_inputs.max_audio_seconds if self.hearing.chat_inputs else 0.0

    async def _heard(self, item: Item, utterance: bytes) -> None:
        item.text = await transcribe(self.server, self.cascade, wav(utterance, PCM_RATE))

    async def _commit(self, new_id: str) -> None:
        await super()._commit(new_id)
        item = self.conversation.find(new_id)
        await self.send("conversation.item.input_audio_transcription.completed", item_id=item.id,
                        content_index=0, transcript=item.text)

    def _check_config(self, config: dict) -> None:
        if config["modalities"] not in MODALITIES:
            raise ApiError(400, "session.modalities must be [\"text\"] or [\"audio\", \"text\"]", "session.modalities")
        for key in ("input_audio_format", "output_audio_format"):
            if config[key] != "pcm16":
                raise ApiError(400, f"session.{key} must be 'pcm16' (16-bit mono at 24 kHz)", f"session.{key}")
        voice_of(self.server, self.cascade, config["voice"], "session.voice")
        if isinstance(config["turn_detection"], TurnDetection):
            if config["turn_detection"].type != "server_vad":
                raise ApiError(400, "session.turn_detection.type must be 'server_vad'", "session.turn_detection.type")
            if self._detector()[1] is None:
                raise ApiError(400, "no model of this cascade has a voice activity detector: session.turn_detection "
                                    "must be null; commit the buffer yourself", "session.turn_detection")

    def _check_tools(self, config: dict) -> tuple[ToolUse | None, str]:
        if config["tools"]:
            raise ApiError(400, f"the cascade '{self.cascade.name}' serves no tools", "session.tools")
        return None, ""

    def _detector(self) -> tuple[ServerContext, Any]:
        found = next((s.model for s in stages(self.server, self.cascade) if s.model.speech_detector), None)
        return (found, found.speech_detector) if found is not None else (self.server, None)

    async def _respond(self, output: ResponseOutput, speaks: bool) -> dict[str, int]:
        system = self._system()
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": role, "content": content} for role, content in self.conversation.turns()]
        limit = self.config["max_response_output_tokens"]
        given = {"max_tokens": None if limit == "inf" else limit, "temperature": self.config["temperature"]}
        voice = voice_of(self.server, self.cascade, self.config["voice"], "session.voice") if speaks else None
        answer = CascadeAnswer(self.server, self.cascade, messages, given, voice, None)
        try:
            await answer.start(hear=False)
            await output.relay(answer)
        finally:
            answer.close()
        return {"output_tokens": answer.usage()["completion_tokens"]}
