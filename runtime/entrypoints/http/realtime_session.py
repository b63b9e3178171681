"""One /v1/realtime session: the OpenAI Realtime protocol's core client events, turned into plan requests.

Client events (JSON text frames) and what they do here:
  session.update            instructions, voice, modalities (["text"] or ["audio", "text"]),
                            input/output_audio_format ("pcm16": 16-bit mono at 24 kHz), temperature,
                            max_response_output_tokens -> session.updated
  input_audio_buffer.append base64 pcm16, streamed into the family's listen request at once: the
                            encoder runs on each window as the graph's client-fed stream releases it
                            (runtime/entrypoints/http/realtime_utterance.py); while a response is answering,
                            it is cancelled first (barge-in)
  input_audio_buffer.commit the stream is closed and its tail window heard, the utterance becomes a
                            user item -> input_audio_buffer.committed, conversation.item.created
  input_audio_buffer.clear  the buffer and its request are dropped -> input_audio_buffer.cleared
  response.create           answers the last committed utterance (the plan's speaking task, or its text
                            task for modalities ["text"]) -> response.created, response.audio.delta /
                            response.audio_transcript.delta (or response.text.delta), their .done, response.done
  response.cancel           stops the deltas -> response.done with status "cancelled"
Each event's fields are read once into its schema (runtime/entrypoints/http/schemas.py: a field of
the wrong kind is named in the error). A bad event gets an `error` event (OpenAI's shape, `event_id`
of the client event) and the session goes on. Turn detection is off (`turn_detection: null`): the client commits. Each response answers
the last committed utterance alone (no conversation history is kept).
`close()` (the socket closed) aborts every request of the session: the conductor frees their KV
blocks and stream buffers.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import uuid
from typing import Any, Awaitable, Callable

import msgspec
import torch

from runtime.conductor.config import QueueFull
from runtime.entrypoints.http.audio_events import AudioEvents
from runtime.entrypoints.http.audio_io import pcm16
from runtime.entrypoints.http.audio_metrics import RealtimeMetrics
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import Listener
from runtime.entrypoints.http.realtime_utterance import Utterance
from runtime.entrypoints.http.schemas import (
    AudioAppendEvent, RealtimeEvent, SessionUpdateEvent, convert_body,
)
from runtime.entrypoints.http.speech import speech_params
from runtime.model_executor.sampling import SamplingParams
from runtime.text import TextOutput

log = logging.getLogger(__name__)
MIN_COMMIT_S = 0.1          # OpenAI refuses a commit of less than 100 ms of audio
MODALITIES = (["text"], ["audio", "text"], ["text", "audio"])


def _event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


class RealtimeSession:
    """A session's settings, the utterance being heard, and its one response."""

    def __init__(self, server: ServerContext, listener: Listener, metrics: RealtimeMetrics,
                 send: Callable[[dict], Awaitable[None]]) -> None:
        self.server, self.listener, self.metrics, self._send = server, listener, metrics, send
        self.id = f"sess_{uuid.uuid4().hex[:20]}"
        self.config: dict[str, Any] = {"instructions": "", "voice": "alloy", "modalities": ["audio", "text"],
                                       "input_audio_format": "pcm16", "output_audio_format": "pcm16",
                                       "turn_detection": None, "temperature": None,
                                       "max_response_output_tokens": "inf"}
        self.utterance = Utterance(server, listener, metrics)  # the input audio buffer being heard
        self.item: tuple[str, torch.Tensor] | None = None      # the last committed utterance: (id, rows)
        self.response: asyncio.Task[None] | None = None
        self.answering: Any = None                             # the response's conductor request
        self.response_id = ""

    async def send(self, event_type: str, **fields: Any) -> None:
        await self._send({"type": event_type, "event_id": _event_id(), **fields})

    async def start(self) -> None:
        self.metrics.sessions.inc()
        await self.send("session.created", session=self._session())

    def _session(self) -> dict:
        return {"id": self.id, "object": "realtime.session", "model": self.server.model_id, **self.config}

    # ---- client events --------------------------------------------------------------------

    async def handle(self, raw: str) -> None:
        """One client event; an ApiError becomes an `error` event, the session stays open."""
        event: Any = None
        try:
            event = json.loads(raw)
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ApiError(400, "a client event must be a JSON object with a string 'type'", "type")
            if event["type"] not in _HANDLERS:
                raise ApiError(400, f"unknown event type '{event['type']}' (one of {', '.join(_HANDLERS)})",
                               "type", "unknown_event")
            handler, schema = _HANDLERS[event["type"]]
            await handler(self, convert_body(event, schema))
        except json.JSONDecodeError as exc:
            await self._error(ApiError(400, f"the event is not valid JSON: {exc}", code="invalid_json"), None)
        except ApiError as err:
            await self._error(err, event.get("event_id") if isinstance(event, dict) else None)
        except QueueFull as exc:    # the utterance's listen request (or the answer) found no room
            await self._error(ApiError(429, f"the server is at capacity: {exc}; retry later", code="queue_full"),
                              event.get("event_id") if isinstance(event, dict) else None)
        except Exception:       # a bug here must not drop the socket: the client hears of it, the log has it
            log.exception("realtime session %s failed on an event", self.id)
            await self._error(ApiError(500, "the server failed on this event (see its log)", code="server_error"),
                              event.get("event_id") if isinstance(event, dict) else None)

    async def refuse(self, err: ApiError) -> None:
        """A frame that is no event at all (a binary frame)."""
        await self._error(err, None)

    async def _error(self, err: ApiError, event_id: Any) -> None:
        self.metrics.errors.labels(err.code or "invalid_request").inc()
        await self.send("error", error={"type": err.type, "code": err.code, "message": err.message,
                                        "param": err.param, "event_id": event_id})

    async def update(self, event: SessionUpdateEvent) -> None:
        if event.session is msgspec.UNSET:
            raise ApiError(400, SessionUpdateEvent.FIELD_ERRORS["session"], "session")
        given = msgspec.structs.asdict(event.session)
        config = {**self.config, **{k: v for k, v in given.items() if v is not msgspec.UNSET}}
        _check_config(self.server, config)
        self.config = config
        await self.send("session.updated", session=self._session())

    async def append(self, event: AudioAppendEvent) -> None:
        try:
            data = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise ApiError(400, "'audio' must be base64 pcm16", "audio", "invalid_audio") from None
        if len(data) % 2:
            raise ApiError(400, "'audio' must hold whole 16-bit samples (an even number of bytes)", "audio",
                           "invalid_audio")
        if self.utterance.seconds + len(data) / 2 / 24000 > self.listener.max_seconds:
            raise ApiError(413, f"the input audio buffer would exceed this model's limit of "
                                f"{self.listener.max_seconds:g} s (param max_audio_seconds); commit sooner",
                           "audio", "audio_too_long")
        if self.response is not None:
            await self.cancel_response()                 # barge-in: the user speaks over the answer
        await self.utterance.push(data)

    async def commit(self, event: RealtimeEvent) -> None:
        if self.utterance.seconds < MIN_COMMIT_S:
            raise ApiError(400, f"buffer too small: {self.utterance.seconds * 1000:.0f} ms of audio, at least "
                                f"{MIN_COMMIT_S * 1000:.0f} ms needed", "audio", "input_audio_buffer_commit_empty")
        utterance, self.utterance = self.utterance, Utterance(self.server, self.listener, self.metrics)
        rows = await utterance.commit()
        previous = self.item[0] if self.item else None
        self.item = (f"item_{uuid.uuid4().hex[:20]}", rows)
        await self.send("input_audio_buffer.committed", previous_item_id=previous, item_id=self.item[0])
        await self.send("conversation.item.created", previous_item_id=previous, item={
            "id": self.item[0], "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}]})

    async def clear(self, event: RealtimeEvent) -> None:
        self._drop_buffer()
        await self.send("input_audio_buffer.cleared")

    def _drop_buffer(self) -> None:
        self.utterance.drop()
        self.utterance = Utterance(self.server, self.listener, self.metrics)

    async def create_response(self, event: RealtimeEvent) -> None:
        if self.response is not None:
            raise ApiError(400, "the session already has an active response; cancel it first", None,
                           "conversation_already_has_active_response")
        if self.item is None:
            raise ApiError(400, "nothing to answer: commit the input audio buffer first", None, "no_committed_audio")
        self.response_id = f"resp_{uuid.uuid4().hex[:20]}"
        await self.send("response.created", response=self._response("in_progress", []))
        self.response = asyncio.ensure_future(self._answer(self.response_id, self.item))

    async def cancel(self, event: RealtimeEvent) -> None:
        if self.response is None:
            raise ApiError(400, "there is no active response to cancel", None, "response_cancel_not_active")
        await self.cancel_response()

    async def cancel_response(self) -> None:
        task, self.response = self.response, None
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.metrics.cancelled.inc()
        await self.send("response.done", response=self._response("cancelled", []))

    async def close(self) -> None:
        """The socket closed: abort the response and the utterance being heard. The aborts are
        synchronous (the conductor frees KV and buffers at once) and come first: aiohttp cancels
        the handler when the peer's connection drops, at the first await below."""
        self.metrics.sessions.dec()
        task, self.response = self.response, None
        if self.answering is not None:
            self.server.conductor.abort(self.answering)
        self._drop_buffer()
        self.item = None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ---- the response ---------------------------------------------------------------------

    def _response(self, status: str, output: list, usage: dict | None = None) -> dict:
        return {"id": self.response_id, "object": "realtime.response", "status": status, "output": output,
                "usage": usage}

    async def _answer(self, response_id: str, item: tuple[str, torch.Tensor]) -> None:
        server, model = self.server, self.server.speech_model
        speaks = "audio" in self.config["modalities"]
        items, family = self.listener.answer_items(server.tokenizer, item[1], self.config["instructions"])
        body = {"max_tokens": None if self.config["max_response_output_tokens"] == "inf"
                else self.config["max_response_output_tokens"], "temperature": self.config["temperature"]}
        family = {**family, "speaker": model.speaker.voice(self.config["voice"])} if speaks else family
        task = model.task if speaks else ("chat" if any(t.name == "chat" for t in server.plan.tasks)
                                          else server.plan.default_task)
        req = server.conductor.submit(task, speech_params(server, {k: v for k, v in body.items() if v is not None},
                                                          family), items, server.stop_token_ids(),
                                      server.config.request_timeout_s)
        self.answering = req
        try:
            text = await self._deltas(AudioEvents(server, req, model), speaks)
        except ApiError as err:
            self.response = None
            await self._error(err, None)
            await self.send("response.done", response=self._response("failed", []))
            return
        finally:
            server.conductor.abort(req)
            self.answering = None
        self.response = None
        content = {"type": "audio" if speaks else "text", ("transcript" if speaks else "text"): text}
        usage = {"output_tokens": len(req.output_ids)}
        await self.send("response.done", response=self._response("completed", [{
            "id": f"item_{uuid.uuid4().hex[:20]}", "object": "realtime.item", "type": "message", "role": "assistant",
            "status": "completed", "content": [content]}], usage))

    async def _deltas(self, events: AudioEvents, speaks: bool) -> str:
        """Send the answer's deltas as events; its whole text."""
        output = TextOutput(self.server.tokenizer, SamplingParams(), stop_ids=events.req.stop_token_ids)
        ids = {"response_id": self.response_id, "output_index": 0, "content_index": 0}
        text, done = "", False
        while not done:
            tokens, audio, done = await events.next()
            delta = output.push_ids(tokens, is_last=done)
            if delta:
                text += delta
                await self.send("response.audio_transcript.delta" if speaks else "response.text.delta",
                                delta=delta, **ids)
            for piece in audio if speaks else []:
                await self.send("response.audio.delta", delta=base64.b64encode(pcm16(piece)).decode(), **ids)
                events.sent(piece)
        events.observe()
        if speaks:
            await self.send("response.audio.done", **ids)
            await self.send("response.audio_transcript.done", transcript=text, **ids)
        else:
            await self.send("response.text.done", text=text, **ids)
        return text


def _check_config(server: ServerContext, config: dict) -> None:
    if config["modalities"] not in MODALITIES:
        raise ApiError(400, "session.modalities must be [\"text\"] or [\"audio\", \"text\"]", "session.modalities")
    for key in ("input_audio_format", "output_audio_format"):
        if config[key] != "pcm16":
            raise ApiError(400, f"session.{key} must be 'pcm16' (16-bit mono at 24 kHz)", f"session.{key}")
    if server.speech_model.speaker.voice(config["voice"]) is None:
        raise ApiError(400, f"unknown voice {config['voice']!r}", "session.voice")
    if config["turn_detection"] is not None:
        raise ApiError(400, "session.turn_detection must be null: this server does no voice activity detection; "
                            "commit the buffer yourself", "session.turn_detection")


# event type -> (its handler, the schema its fields are read into once: schemas.py)
_HANDLERS: dict[str, tuple[Callable[[RealtimeSession, Any], Awaitable[None]], type[RealtimeEvent]]] = {
    "session.update": (RealtimeSession.update, SessionUpdateEvent),
    "input_audio_buffer.append": (RealtimeSession.append, AudioAppendEvent),
    "input_audio_buffer.commit": (RealtimeSession.commit, RealtimeEvent),
    "input_audio_buffer.clear": (RealtimeSession.clear, RealtimeEvent),
    "response.create": (RealtimeSession.create_response, RealtimeEvent),
    "response.cancel": (RealtimeSession.cancel, RealtimeEvent),
}
