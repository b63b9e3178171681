"""GET /v1/audio/speech/stream: text written as it is made (an LLM elsewhere still writing), spoken a clause at a time.

A WebSocket of JSON text frames, served for plans that speak and whose graph streams text into their
speech task (`streams: {input_text: {from: client.text, to: <speech task>.text, policy: {delimited: ...}}}`,
mstar_compiler/passes/task_streams.py). The graph's policy cuts the text (runtime/streams/text_clauses.py);
each clause is one request of the speech task (its own KV, its prompt in the session's voice), submitted
the moment the clause is complete while earlier clauses still speak (at most MAX_AHEAD of a session at
once), and its audio is sent in clause order, so the first clause plays while the rest is being written.

Client events:
  {"type": "session.update", "session": {voice, seed, temperature, top_p, max_tokens, max_audio_frames}}
                                       clauses released after it take the settings (clause i: seed + i)
  {"type": "input_text.append", "delta": "..."}   more text (unspoken text is capped at MAX_UNSPOKEN_CHARS)
  {"type": "input_text.flush"}         speak what is pending now, whether or not a clause ended
  {"type": "input_text.done"}          the text is complete: speak the rest, then `speech.done`
Server events:
  session.created / session.updated    {session: {id, model, voice, ..., sample_rate, policy}}
  speech.clause                        {clause, text}: a clause released, queued for speech
  speech.audio.delta                   {clause, delta}: base64 pcm16 mono at session.sample_rate, in order
  speech.clause.done                   {clause, audio_seconds, finish_reason} ("error" after an error event)
  speech.done                          {usage: {clauses, input_characters, output_tokens, audio_seconds}}
  error                                {error: {type, code, message, param, event_id, clause}}; the session
                                       stays open and a clause that failed is named
After `speech.done` the session takes a new text (clause numbers go on). Closing the socket aborts every
clause still queued or speaking.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import msgspec
from aiohttp import web

from mstar_compiler.plan import Plan, TaskStream
from runtime.conductor.request import Request
from runtime.entrypoints.http.audio_events import AudioEvents
from runtime.entrypoints.http.audio_io import pcm16
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.schemas import RealtimeEvent, SpeechStreamUpdateEvent, TextAppendEvent
from runtime.entrypoints.http.speech import speech_params, submit_clauses, submit_text
from runtime.entrypoints.http.speech_model import SpeechModel
from runtime.entrypoints.http.ws_events import dispatch, serve_socket
from runtime.streams.text_clauses import TextClauses

log = logging.getLogger(__name__)
MAX_AHEAD = 4                  # clauses of one session submitted at once (the first speaking, three ahead)
MAX_UNSPOKEN_CHARS = 65536     # text appended and not yet spoken, per session
SETTINGS = ("voice", "seed", "temperature", "top_p", "max_tokens", "max_audio_frames")


def text_stream(plan: Plan, model: SpeechModel | None) -> TaskStream | None:
    """The plan's stream of client text into its speech task, None when it has none."""
    if model is None:
        return None
    return next((s for s in plan.task_streams if s.task == model.task and s.input == "text"), None)


def install_speech_stream(server: ServerContext, app: web.Application) -> None:
    """Add GET /v1/audio/speech/stream when a served model speaks and streams text into its speech task."""
    if any(_streams_text(m) for m in server.models_served()):
        app.router.add_get("/v1/audio/speech/stream", speech_stream)


def _streams_text(model: ServerContext) -> bool:
    return text_stream(model.plan, model.speech_model) is not None


async def speech_stream(request: web.Request) -> web.WebSocketResponse:
    """A session with the model `?model=` names, else the first that streams text into speech."""
    server: ServerContext = request.app["mstar"].serving(request.query.get("model"), able=_streams_text)
    model = server.speech_model
    stream = text_stream(server.plan, model)
    if model is None or stream is None:
        raise ApiError(400, f"the model '{server.model_id}' does not stream text into speech", "model")
    return await serve_socket(request, lambda send: SpeechStream(server, model, stream, send))


@dataclass
class Clause:
    index: int
    text: str
    settings: dict[str, Any]              # the session's when the clause was released
    req: Request | None = None            # its speech request, once submitted
    failed: ApiError | None = None        # why it could not be submitted


@dataclass(frozen=True)
class _Done:
    """In the session's queue: the text before it is complete (input_text.done)."""

    characters: int      # appended since the text before it was done


class SpeechStream:
    """One socket's text, its clauses and the one writer that speaks them in order."""

    def __init__(self, server: ServerContext, model: SpeechModel, stream: TaskStream,
                 send: Callable[[dict], Awaitable[None]]) -> None:
        self.server, self.model, self.stream, self._send = server, model, stream, send
        self.id = f"speech_{uuid.uuid4().hex[:20]}"
        self.settings: dict[str, Any] = {"voice": "alloy", **{k: None for k in SETTINGS[1:]}}
        self.cutter = TextClauses.of(stream.policy)
        self.queue: deque[Clause | _Done] = deque()   # in order, until spoken
        self.appended = 0                             # characters appended since the last input_text.done
        self.wake = asyncio.Event()
        self.next_index = 0
        self.usage = _Usage()
        self.writer: asyncio.Task[None] | None = None

    async def send(self, event_type: str, **fields: Any) -> None:
        await self._send({"type": event_type, "event_id": f"event_{uuid.uuid4().hex[:20]}", **fields})

    async def start(self) -> None:
        self.server.audio_metrics.speech_stream_sessions.inc()
        self.writer = asyncio.create_task(self._speak())
        await self.send("session.created", session=self._session())

    def _session(self) -> dict:
        pol = self.stream.policy
        return {"id": self.id, "object": "speech.session", "model": self.server.model_id, **self.settings,
                "sample_rate": self.model.sample_rate,
                "policy": {"delimited": {"delimiters": pol.delimiters, "min": pol.min_size, "max": pol.size}}}

    async def handle(self, raw: str) -> None:
        """One client event; an error becomes an `error` event, the session stays open."""
        await dispatch(self, raw, _HANDLERS, f"speech stream {self.id}")

    async def error(self, err: ApiError, event_id: Any = None, clause: int | None = None) -> None:
        await self.send("error", error={"type": err.type, "code": err.code, "message": err.message,
                                        "param": err.param, "event_id": event_id, "clause": clause})

    # ---- client events --------------------------------------------------------------------

    async def update(self, event: SpeechStreamUpdateEvent) -> None:
        if event.session is msgspec.UNSET:
            raise ApiError(400, SpeechStreamUpdateEvent.FIELD_ERRORS["session"], "session")
        given = {k: v for k, v in msgspec.structs.asdict(event.session).items() if v is not msgspec.UNSET}
        settings = {**self.settings, **given}
        voice = self.model.speaker.voice(settings["voice"])
        if voice is None:
            raise ApiError(400, f"unknown voice '{settings['voice']}'", "session.voice")
        speech_params(self.server, settings, {})          # the sampling fields within the plan's bounds
        self.settings = settings
        await self.send("session.updated", session=self._session())

    async def append(self, event: TextAppendEvent) -> None:
        unspoken = len(self.cutter.pending) + sum(len(c.text) for c in self.queue if isinstance(c, Clause))
        if unspoken + len(event.delta) > MAX_UNSPOKEN_CHARS:
            raise ApiError(400, f"{unspoken} characters are not spoken yet; an append of {len(event.delta)} would "
                           f"pass the session's {MAX_UNSPOKEN_CHARS}: wait for speech.clause.done", "delta",
                           "too_much_text")
        self.appended += len(event.delta)
        await self._release(self.cutter.append(event.delta))

    async def flush(self, event: RealtimeEvent) -> None:
        await self._release(self.cutter.finish())

    async def done(self, event: RealtimeEvent) -> None:
        await self._release(self.cutter.finish())
        self.queue.append(_Done(self.appended))
        self.appended = 0
        self.wake.set()

    async def _release(self, texts: list[str]) -> None:
        for text in texts:
            clause = Clause(self.next_index, text, dict(self.settings))
            self.next_index += 1
            self.queue.append(clause)
            self.server.audio_metrics.text_clauses.inc()
            await self.send("speech.clause", clause=clause.index, text=text)
        self._admit()
        self.wake.set()

    # ---- speaking -------------------------------------------------------------------------

    def _admit(self) -> None:
        """Submit the first MAX_AHEAD queued clauses that are not yet."""
        submit_clauses(itertools.islice((c for c in self.queue if isinstance(c, Clause)), MAX_AHEAD), self._submit)

    def _submit(self, clause: Clause) -> Request:
        s = clause.settings
        given = {**s, "seed": None if s["seed"] is None else s["seed"] + clause.index}
        return submit_text(self.server, self.model, self.model.speaker.voice(s["voice"]), clause.text.strip(), given)

    async def _speak(self) -> None:
        """The writer: each queued clause's audio in order, then `speech.done` where the text ended."""
        while True:
            while not self.queue:
                self.wake.clear()
                await self.wake.wait()
            head = self.queue[0]
            try:
                if isinstance(head, _Done):
                    await self.send("speech.done", usage=self.usage.finish(head.characters))
                else:
                    await self._say(head)
            except Exception:       # a bug here must not stop the session: the client hears of it, the log has it
                log.exception("speech stream %s failed on a clause", self.id)
                await self.error(ApiError(500, "the server failed on this clause (see its log)", code="server_error"),
                                 clause=head.index if isinstance(head, Clause) else None)
            self.queue.popleft()
            self._admit()

    async def _say(self, clause: Clause) -> None:
        if clause.failed is not None:
            await self.error(clause.failed, clause=clause.index)
            await self.send("speech.clause.done", clause=clause.index, audio_seconds=0.0, finish_reason="error")
            return
        assert clause.req is not None
        events = AudioEvents(self.server, clause.req, self.model)
        finish = "error"
        try:
            done = False
            while not done:
                _, audio, done = await events.next()
                for piece in audio:
                    await self.send("speech.audio.delta", clause=clause.index,
                                    delta=base64.b64encode(pcm16(piece)).decode())
                    events.sent(piece)
            events.observe()
            finish = events.finish_reason or "stop"
        except ApiError as err:
            await self.error(err, clause=clause.index)
        finally:
            self.server.conductor.abort(clause.req)      # no-op when finished
        self.usage.add(len(clause.req.output_ids), events.audio_seconds)
        await self.send("speech.clause.done", clause=clause.index, audio_seconds=round(events.audio_seconds, 6),
                        finish_reason=finish)

    async def close(self) -> None:
        """Abort what is queued or speaking; the writer's end is awaited last (the handler may be cancelled
        there when the client has gone)."""
        if self.writer is not None:
            self.writer.cancel()
        for clause in self.queue:
            if isinstance(clause, Clause) and clause.req is not None:
                self.server.conductor.abort(clause.req)
        self.queue.clear()
        self.server.audio_metrics.speech_stream_sessions.dec()
        if self.writer is not None:
            await asyncio.wait([self.writer])      # raises only if this handler is cancelled itself


@dataclass
class _Usage:
    """What one text (up to `input_text.done`) cost."""

    clauses: int = 0
    output_tokens: int = 0
    audio_seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.clauses += 1
        self.output_tokens += tokens
        self.audio_seconds += seconds

    def finish(self, characters: int) -> dict[str, Any]:
        """The usage of the text that ended, `characters` long; counting starts anew."""
        out = {"clauses": self.clauses, "input_characters": characters,
               "output_tokens": self.output_tokens, "audio_seconds": round(self.audio_seconds, 6)}
        self.clauses = self.output_tokens = 0
        self.audio_seconds = 0.0
        return out


_HANDLERS: dict[str, tuple[Callable[..., Awaitable[None]], type]] = {
    "session.update": (SpeechStream.update, SpeechStreamUpdateEvent),
    "input_text.append": (SpeechStream.append, TextAppendEvent),
    "input_text.flush": (SpeechStream.flush, RealtimeEvent),
    "input_text.done": (SpeechStream.done, RealtimeEvent),
}
