"""One /v1/realtime session: the OpenAI Realtime protocol's core client events, turned into plan requests.

Client events (JSON text frames) and what they do here:
  session.update            instructions (the system turn), voice, modalities (["text"] or ["audio", "text"]),
                            input/output_audio_format ("pcm16": 16-bit mono at 24 kHz), temperature,
                            max_response_output_tokens, tools (function tools) and tool_choice -> session.updated
  input_audio_buffer.append base64 pcm16, streamed into the family's listen request at once: the
                            encoder runs on each window as the graph's client-fed stream releases it
                            (runtime/entrypoints/http/realtime_utterance.py); while a response is answering,
                            it is cancelled first (barge-in). With turn detection, the audio goes to the
                            voice activity detector instead (realtime_turns.py), which opens the utterance when
                            speech starts (-> input_audio_buffer.speech_started, barge-in), commits it when
                            speech stops (-> input_audio_buffer.speech_stopped, .committed, conversation.item.created)
                            and creates the response
  input_audio_buffer.commit the stream is closed and its tail window heard, the utterance becomes a
                            user item -> input_audio_buffer.committed, conversation.item.created
  input_audio_buffer.clear  the buffer and its request are dropped -> input_audio_buffer.cleared
  conversation.item.create  a text or audio message (an `input_audio` part is heard as a committed buffer is),
                            a function call or a function's output, at the end or after `previous_item_id`
                            -> conversation.item.created
  conversation.item.delete  -> conversation.item.deleted
  conversation.item.truncate an assistant's audio cut where playback stopped (its transcript dropped)
                            -> conversation.item.truncated
  response.create           answers the conversation (realtime_conversation.py: every item, in order; the
                            plan's speaking task, or its text task for modalities ["text"]) -> response.created,
                            the output items and their deltas (realtime_response.py), response.done
  response.cancel           stops the deltas -> response.done with status "cancelled"
Tools: with `tool_choice` "required" or a named function the answer is a call, held to the functions'
schemas by a grammar (runtime/entrypoints/http/tools.py) and written by the text task; with "auto" the
answer's calls are read out of its text, which needs modalities ["text"] (a spoken answer cannot hold one).
Each event's fields are read once into its schema (runtime/entrypoints/http/schemas.py: a field of
the wrong kind is named in the error). A bad event gets an `error` event (OpenAI's shape, `event_id`
of the client event) and the session goes on. Turn detection is off until a session.update sets
`turn_detection: {"type": "server_vad", ...}` (OpenAI's fields and defaults; the plan needs a voice activity
detector node); `null` turns it off again, and the client commits.
`close()` (the socket closed) aborts every request of the session: the conductor frees their KV
blocks and stream buffers.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Awaitable, Callable

import msgspec

from runtime.entrypoints.http.audio_decode import PCM_RATE, pcm16_bytes
from runtime.entrypoints.http.audio_events import AudioEvents
from runtime.entrypoints.http.audio_metrics import RealtimeMetrics
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import Listener
from runtime.entrypoints.http.realtime_conversation import Conversation, Item, client_item, item_id
from runtime.entrypoints.http.realtime_response import ResponseOutput
from runtime.entrypoints.http.realtime_turns import TurnDetector
from runtime.entrypoints.http.realtime_utterance import Utterance
from runtime.entrypoints.http.ws_events import dispatch
from runtime.entrypoints.http.schemas import (
    AudioAppendEvent, FunctionDef, ItemCreateEvent, ItemDeleteEvent, ItemTruncateEvent, RealtimeEvent,
    SessionUpdateEvent, ToolDef, TurnDetection, convert_body,
)
from runtime.entrypoints.http.speech import speech_params
from runtime.entrypoints.http.tools import ToolUse, check_tools, tool_system_prompt, with_grammar

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
                                       "max_response_output_tokens": "inf", "tools": [], "tool_choice": "auto"}
        self.utterance = self._new_utterance()                # the input audio buffer being heard
        self.conversation = Conversation(server.limits.max_conversation_items)
        self.tools: ToolUse | None = None                      # the session's tools, checked
        self.tool_grammar = ""                                 # what a forced call must follow ("" free)
        self.response: asyncio.Task[None] | None = None
        self.answering: Any = None                             # the response's conductor request
        self.output: ResponseOutput | None = None              # the response's items so far
        self.response_id = ""
        self.turns: TurnDetector | None = None                 # server VAD, while turn detection is on
        self._audio = asyncio.Lock()                           # the utterance, between the client and the VAD

    async def send(self, event_type: str, **fields: Any) -> None:
        await self._send({"type": event_type, "event_id": _event_id(), **fields})

    async def start(self) -> None:
        self.metrics.sessions.inc()
        await self.send("session.created", session=self._session())

    def _session(self) -> dict:
        return {"id": self.id, "object": "realtime.session", "model": self.server.model_id, **self.config}

    # ---- client events --------------------------------------------------------------------

    async def handle(self, raw: str) -> None:
        """One client event; an error becomes an `error` event, the session stays open."""
        await dispatch(self, raw, _HANDLERS, f"realtime session {self.id}")

    async def error(self, err: ApiError, event_id: Any = None) -> None:
        self.metrics.errors.labels(err.code or "invalid_request").inc()
        await self.send("error", error={"type": err.type, "code": err.code, "message": err.message,
                                        "param": err.param, "event_id": event_id})

    async def update(self, event: SessionUpdateEvent) -> None:
        if event.session is msgspec.UNSET:
            raise ApiError(400, SessionUpdateEvent.FIELD_ERRORS["session"], "session")
        given = msgspec.structs.asdict(event.session)
        config = {**self.config, **{k: v for k, v in given.items() if v is not msgspec.UNSET}}
        self._check_config(config)
        config["tools"] = [t if isinstance(t, dict) else msgspec.to_builtins(t) for t in config["tools"]]
        self.tools, self.tool_grammar = self._check_tools(config)
        if given["turn_detection"] is not msgspec.UNSET:
            detection = given["turn_detection"]
            config["turn_detection"] = msgspec.to_builtins(detection) if detection is not None else None
            if self.turns is not None:
                self.turns.close()
            self.turns = None if detection is None else TurnDetector(*self._detector(), detection, self, item_id)
        self.config = config
        await self.send("session.updated", session=self._session())

    async def append(self, event: AudioAppendEvent) -> None:
        data = pcm16_bytes(event.audio, "audio")
        if self.turns is not None:
            await self.turns.push(data)
            return
        if self.utterance.seconds + len(data) / 2 / PCM_RATE > self.max_seconds:
            raise ApiError(413, f"the input audio buffer would exceed this model's limit of "
                                f"{self.max_seconds:g} s (param max_audio_seconds); commit sooner",
                           "audio", "audio_too_long")
        if self.response is not None:
            await self.cancel_response()                 # barge-in: the user speaks over the answer
        await self.utterance.push(data)

    async def commit(self, event: RealtimeEvent) -> None:
        async with self._audio:
            speaking = self.turns is not None and self.turns.speaking     # the id speech_started announced
            new_id = self.turns.item_id if speaking else item_id()
            if self.turns is not None:
                self.turns.end_speech()
            await self._commit(new_id)
        self.metrics.turns.labels("commit").inc()

    async def _commit(self, new_id: str) -> None:
        if self.utterance.seconds < MIN_COMMIT_S:
            raise ApiError(400, f"buffer too small: {self.utterance.seconds * 1000:.0f} ms of audio, at least "
                                f"{MIN_COMMIT_S * 1000:.0f} ms needed", "audio", "input_audio_buffer_commit_empty")
        utterance, self.utterance = self.utterance, self._new_utterance()
        item = Item(new_id, role="user", content="input_audio")
        await self._heard(item, await utterance.commit())
        previous = self.conversation.add(item)
        await self.send("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        await self.send("conversation.item.created", previous_item_id=previous, item=item.wire())

    # ---- what a session of another kind does otherwise (realtime_cascade.py) -----------------

    def _new_utterance(self) -> Any:
        return Utterance(self.server, self.listener, self.metrics)

    @property
    def max_seconds(self) -> float:
        """The longest utterance the session hears."""
        return self.listener.max_seconds

    async def _heard(self, item: Item, utterance: Any) -> None:
        """A committed utterance (what `Utterance.commit` gave: its encoder rows) becomes the user item's."""
        item.rows = utterance

    def _check_config(self, config: dict) -> None:
        _check_config(self.server, config)

    def _check_tools(self, config: dict) -> tuple[ToolUse | None, str]:
        return _check_tools(self.server, config)

    def _detector(self) -> tuple[ServerContext, Any]:
        """The served model whose voice activity detector hears the session's turns, and that detector."""
        return self.server, self.server.speech_detector

    async def _hear(self, pcm16: bytes) -> Any:
        """A whole utterance (an input_audio item) heard as the buffer's is: `Utterance.commit`'s result."""
        seconds = len(pcm16) / 2 / PCM_RATE
        if not MIN_COMMIT_S <= seconds <= self.max_seconds:
            raise ApiError(400 if seconds < MIN_COMMIT_S else 413,
                           f"an input_audio item must hold {MIN_COMMIT_S:g} to {self.max_seconds:g} s of "
                           f"audio (param max_audio_seconds), got {seconds:.2f} s", "item.content[0].audio",
                           "invalid_audio" if seconds < MIN_COMMIT_S else "audio_too_long")
        utterance = self._new_utterance()
        try:
            await utterance.push(pcm16)
        except BaseException:
            utterance.drop()
            raise
        return await utterance.commit()

    async def clear(self, event: RealtimeEvent) -> None:
        async with self._audio:
            if self.turns is not None:
                self.turns.end_speech()
            self._drop_buffer()
        await self.send("input_audio_buffer.cleared")

    # ---- what the turn detector hears (realtime_turns.py) ---------------------------------

    async def speech_started(self, audio_start_ms: int, new_id: str, pcm16: bytes) -> None:
        await self.send("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=new_id)
        if self.response is not None and self.turns is not None and self.turns.settings.interrupt_response:
            await self.cancel_response()                  # barge-in
        await self.speech_audio(pcm16)

    async def speech_audio(self, pcm16: bytes) -> bool:
        if self.utterance.seconds + len(pcm16) / 2 / PCM_RATE > self.max_seconds:
            return False
        async with self._audio:
            await self.utterance.push(pcm16)
        return True

    async def speech_stopped(self, audio_end_ms: int, new_id: str) -> None:
        await self.send("input_audio_buffer.speech_stopped", audio_end_ms=audio_end_ms, item_id=new_id)
        try:
            async with self._audio:
                await self._commit(new_id)
            self.metrics.turns.labels("server_vad").inc()
            if self.turns is not None and self.turns.settings.create_response and self.response is None:
                await self.create_response(RealtimeEvent("response.create"))
        except ApiError as err:
            await self.failed(err)

    async def failed(self, err: ApiError) -> None:
        await self.error(err, None)

    def judged(self) -> None:
        self.metrics.vad_windows.inc()

    def _drop_buffer(self) -> None:
        self.utterance.drop()
        self.utterance = self._new_utterance()

    async def create_item(self, event: ItemCreateEvent) -> None:
        item = client_item(event.item)
        if item.pcm:                      # a client's audio part: heard as a committed buffer is, apart from it
            heard, item.pcm = await self._hear(item.pcm), b""
            await self._heard(item, heard)
        previous = self.conversation.add(item, event.previous_item_id)
        await self.send("conversation.item.created", previous_item_id=previous, item=item.wire())

    async def delete_item(self, event: ItemDeleteEvent) -> None:
        self._not_answering("delete an item")
        self.conversation.delete(event.item_id)
        await self.send("conversation.item.deleted", item_id=event.item_id)

    async def truncate_item(self, event: ItemTruncateEvent) -> None:
        self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
        await self.send("conversation.item.truncated", item_id=event.item_id, content_index=event.content_index,
                        audio_end_ms=event.audio_end_ms)

    def _not_answering(self, what: str) -> None:
        if self.response is not None:
            raise ApiError(400, f"cannot {what} while a response is active; cancel it first", None,
                           "conversation_already_has_active_response")

    async def create_response(self, event: RealtimeEvent) -> None:
        self._not_answering("start a response")
        if not self.conversation.items:
            raise ApiError(400, "nothing to answer: commit the input audio buffer or create an item first", None,
                           "empty_conversation")
        self.response_id = f"resp_{uuid.uuid4().hex[:20]}"
        self.output = None             # the last response's items are not this one's (a cancel before it starts)
        await self.send("response.created", response=self._response("in_progress", []))
        self.response = asyncio.ensure_future(self._answer())

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
        await self.send("response.done", response=self._response("cancelled", self.output.cut() if self.output else []))

    async def close(self) -> None:
        """The socket closed: abort the response and the utterance being heard. The aborts are
        synchronous (the conductor frees KV and buffers at once) and come first: aiohttp cancels
        the handler when the peer's connection drops, at the first await below."""
        self.metrics.sessions.dec()
        task, self.response = self.response, None
        if self.answering is not None:
            self.server.conductor.abort(self.answering)
        self._drop_buffer()
        if self.turns is not None:
            self.turns.close()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # ---- the response ---------------------------------------------------------------------

    def _response(self, status: str, output: list, usage: dict | None = None) -> dict:
        return {"id": self.response_id, "object": "realtime.response", "status": status, "output": output,
                "usage": usage}

    async def _answer(self) -> None:
        forced = bool(self.tool_grammar)            # a call, written by the text task under its grammar
        speaks = "audio" in self.config["modalities"] and not forced
        self.output = output = ResponseOutput(self.send, self.conversation, self.response_id, speaks, self.tools)
        try:
            usage = await self._respond(output, speaks)
        except ApiError as err:
            self.response = None
            await self.error(err, None)
            await self.send("response.done", response=self._response("failed", output.cut()))
            return
        self.response = None
        await self.send("response.done", response=self._response("completed", output.output(), usage))

    async def _respond(self, output: ResponseOutput, speaks: bool) -> dict[str, int]:
        """Write the answer to the conversation into `output` (the family's speaking task, or its text task);
        its usage."""
        server, model = self.server, self.server.speech_model
        items, family = self.listener.answer_items(server.tokenizer, self.conversation.turns(), self._system())
        body = {"max_tokens": None if self.config["max_response_output_tokens"] == "inf"
                else self.config["max_response_output_tokens"], "temperature": self.config["temperature"]}
        family = {**family, "speaker": model.speaker.voice(self.config["voice"])} if speaks else family
        task = model.task if speaks else ("chat" if any(t.name == "chat" for t in server.plan.tasks)
                                          else server.plan.default_task)
        params = speech_params(server, {k: v for k, v in body.items() if v is not None}, family)
        params = with_grammar(server, params, self.tool_grammar, "session.tool_choice")
        req = server.conductor.submit(task, params, items, server.stop_token_ids(), server.config.request_timeout_s)
        self.answering = req
        try:
            await output.stream(AudioEvents(server, req, model), server.tokenizer)
        finally:
            server.conductor.abort(req)
            self.answering = None
        return {"output_tokens": len(req.output_ids)}

    def _system(self) -> str:
        """The system turn: the session's instructions, and its tools the Hermes way (tools.py)."""
        parts = [self.config["instructions"]] + ([tool_system_prompt(self.tools)] if self.tools else [])
        return "\n\n".join(p for p in parts if p)


def _check_config(server: ServerContext, config: dict) -> None:
    if config["modalities"] not in MODALITIES:
        raise ApiError(400, "session.modalities must be [\"text\"] or [\"audio\", \"text\"]", "session.modalities")
    for key in ("input_audio_format", "output_audio_format"):
        if config[key] != "pcm16":
            raise ApiError(400, f"session.{key} must be 'pcm16' (16-bit mono at 24 kHz)", f"session.{key}")
    if server.speech_model.speaker.voice(config["voice"]) is None:
        raise ApiError(400, f"unknown voice {config['voice']!r}", "session.voice")
    detection = config["turn_detection"]
    if isinstance(detection, TurnDetection):
        if detection.type != "server_vad":
            raise ApiError(400, f"session.turn_detection.type must be 'server_vad', got {detection.type!r}"
                                + (" (semantic VAD is not served)" if detection.type == "semantic_vad" else ""),
                           "session.turn_detection.type")
        if server.speech_detector is None:
            raise ApiError(400, "this model's graph has no voice activity detector (a silero_vad node fed by a "
                                "client stream): session.turn_detection must be null; commit the buffer yourself",
                           "session.turn_detection")


def _check_tools(server: ServerContext, config: dict) -> tuple[ToolUse | None, str]:
    """The session's tools in chat's terms (tools.py checks them: a 400 naming `session.tools[i]...`) and the
    grammar a forced call follows."""
    if not config["tools"]:        # the session's default choice "auto" means nothing without tools
        return None, ""
    choice = config["tool_choice"]
    if isinstance(choice, dict) and "function" not in choice:       # the Realtime API names it flat
        choice = {"type": choice.get("type"), "function": {"name": choice.get("name")}}
    tools = [ToolDef("function", convert_body({k: v for k, v in t.items() if k != "type"}, FunctionDef))
             if t.get("type", "function") == "function" else ToolDef(t["type"], FunctionDef(""))
             for t in config["tools"]]
    try:
        use, grammar = check_tools(tools, choice, False, server.limits)
    except ApiError as err:      # named as the session's flat tools name it: session.tools[0].name
        param = f"session.{err.param.replace('.function.', '.')}" if err.param else None
        raise ApiError(err.status, f"session.{err.message.replace('.function.', '.')}", param) from None
    if use is not None and use.read_calls and not grammar and "audio" in config["modalities"]:
        raise ApiError(400, "tools with tool_choice 'auto' need modalities [\"text\"]: a spoken answer cannot hold "
                            "a call (or force one with tool_choice 'required')", "session.tool_choice")
    if grammar and not server.constrains_output():
        raise ApiError(400, "this model cannot constrain its answer to a call", "session.tool_choice")
    return use, grammar


# event type -> (its handler, the schema its fields are read into once: schemas.py)
_HANDLERS: dict[str, tuple[Callable[[RealtimeSession, Any], Awaitable[None]], type[RealtimeEvent]]] = {
    "session.update": (RealtimeSession.update, SessionUpdateEvent),
    "input_audio_buffer.append": (RealtimeSession.append, AudioAppendEvent),
    "input_audio_buffer.commit": (RealtimeSession.commit, RealtimeEvent),
    "input_audio_buffer.clear": (RealtimeSession.clear, RealtimeEvent),
    "conversation.item.create": (RealtimeSession.create_item, ItemCreateEvent),
    "conversation.item.delete": (RealtimeSession.delete_item, ItemDeleteEvent),
    "conversation.item.truncate": (RealtimeSession.truncate_item, ItemTruncateEvent),
    "response.create": (RealtimeSession.create_response, RealtimeEvent),
    "response.cancel": (RealtimeSession.cancel, RealtimeEvent),
}
