"""POST /v1/audio/speech: OpenAI's text-to-speech endpoint, streamed as the audio decodes.

Body (OpenAI's shape): `model`, `input`, `voice`, `response_format` ("wav" default, "pcm":
raw 16-bit little-endian mono at the model's rate; flac/mp3/opus are refused: no encoder
here), `stream_format` ("audio": the file's bytes as they are produced, "sse":
`speech.audio.delta` events with base64 PCM), `stream` (true = `stream_format: audio`).
Extensions: `seed`, `temperature`, `top_p`, `max_tokens` (Orpheus audio tokens / Qwen3-Omni
text tokens), `max_audio_frames` (Qwen3-Omni).

Without streaming the answer is the whole file. With streaming, WAV starts with a header
of unknown length and every decoded chunk is written the moment it arrives, so playback
can start after the first chunk; the concatenated chunks are the same audio as the whole
file for the same seed. A client that disconnects aborts the request: its KV blocks and
stream buffers are freed at once.
"""
from __future__ import annotations

import base64
import logging
from typing import Any, Callable, Iterable, Mapping

import msgspec
from aiohttp import web

from runtime.conductor.config import QueueFull
from runtime.conductor.request import Request
from runtime.entrypoints.http.audio_events import AudioEvents
from runtime.entrypoints.http.audio_io import FORMATS, content_type, pcm16, wav, wav_header
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.params import resolve_params
from runtime.entrypoints.http.schemas import SpeechBody
from runtime.entrypoints.http.speech_model import SpeechModel
from runtime.entrypoints.http.sse import sse_data, sse_error, sse_response
from runtime.transport.request_params import RequestParams

log = logging.getLogger(__name__)


def speech_params(server: ServerContext, body: Mapping[str, Any], family: dict[str, Any],
                  logprobs: int | None = None) -> RequestParams:
    """The params of a speaking request, checked (ApiError 400); `family`: what its speaker sets;
    `logprobs`: an audio chat's request for its transcript's (runtime.entrypoints.http.logprobs)."""
    specs = {p.name for p in server.plan.params}
    given = {k: body.get(k) for k in ("max_tokens", "max_audio_frames") if k in specs}
    given.update({k: body.get(k) for k in ("temperature", "top_p", "seed")})
    given["logprobs"] = logprobs
    return resolve_params(server.plan, given, family)


def submit_speech(server: ServerContext, model: SpeechModel, voice: str, body: SpeechBody) -> Request:
    """Queue the body's `input` spoken in `voice` (the model's voice name)."""
    return submit_text(server, model, voice, body.input, msgspec.structs.asdict(body))


def submit_clauses(clauses: Iterable[Any], submit: Callable[[Any], Request]) -> None:
    """Submit each clause (`.index`, `.req`, `.failed`) not yet submitted, by `submit`; a full queue or a clause
    the model refuses becomes the clause's `failed` (an ApiError its writer reports in its turn)."""
    for clause in clauses:
        if clause.req is None and clause.failed is None:
            try:
                clause.req = submit(clause)
            except QueueFull as exc:
                clause.failed = ApiError(429, f"the server is at capacity: {exc}; clause {clause.index} is not spoken",
                                         code="queue_full")
            except ApiError as err:
                clause.failed = err


def submit_text(server: ServerContext, model: SpeechModel, voice: str, text: str, fields: Mapping[str, Any]) -> Request:
    """Queue `text` spoken in `voice` (the model's voice name), sampled by a speech body's `fields`."""
    ids, family, stops = model.speaker.prompt(server, voice, text)
    return server.conductor.submit(model.task, speech_params(server, fields, family), [("text", ids)], stops,
                                   server.config.request_timeout_s)


def _parse(server: ServerContext, body: SpeechBody) -> tuple[SpeechModel, str, str, str | None]:
    """(how the plan speaks, the model's voice, the format, the stream format); ApiError(400) if wrong."""
    server.check_model(body.model)
    model = server.speech_model
    if model is None:
        raise ApiError(400, f"the model '{server.model_id}' does not produce speech", "model")
    if not body.input:
        raise ApiError(400, "'input' must be a non-empty string", "input")
    voice = model.speaker.voice(body.voice)
    if voice is None:
        raise ApiError(400, f"unknown voice '{body.voice}'", "voice")
    fmt = body.response_format
    if fmt not in FORMATS:
        raise ApiError(400, f"response_format '{fmt}' is not supported; use one of {list(FORMATS)}", "response_format")
    stream_format = body.stream_format
    if body.stream and stream_format is None:
        stream_format = "audio"
    if stream_format not in (None, "audio", "sse"):
        raise ApiError(400, "'stream_format' must be 'audio' or 'sse'", "stream_format")
    if body.speed != 1.0:
        raise ApiError(400, "only speed 1.0 is supported", "speed")
    return model, voice, fmt, stream_format


async def audio_speech(request: web.Request) -> web.StreamResponse:
    server: ServerContext = request.app["mstar"]
    body = await server.read_body(request, SpeechBody)
    server = server.serving(body.model)
    model, voice, fmt, stream_format = _parse(server, body)
    req = submit_speech(server, model, voice, body)
    events = AudioEvents(server, req, model)
    try:
        if stream_format == "audio":
            return await _send_bytes(request, events, fmt)
        if stream_format == "sse":
            return await _send_events(request, events)
        pcm, done = bytearray(), False
        while not done:
            _, audio, done = await events.next()
            for piece in audio:
                pcm += pcm16(piece)
                events.sent(piece)
        events.observe()
        audio_file = wav(bytes(pcm), model.sample_rate) if fmt == "wav" else bytes(pcm)
        return web.Response(body=audio_file, content_type=content_type(fmt))
    finally:
        server.conductor.abort(req)   # no-op when finished; frees everything on disconnect


async def _send_bytes(request: web.Request, events: AudioEvents, fmt: str) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": content_type(fmt)})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    if fmt == "wav":
        await resp.write(wav_header(events.model.sample_rate))
    done = False
    try:
        while not done:
            _, audio, done = await events.next()
            for piece in audio:
                await resp.write(pcm16(piece))
                events.sent(piece)
        events.observe()
    except ApiError as err:
        # the status line is gone: abort the connection with no terminating chunk, so every HTTP
        # client raises instead of taking the cut audio for a whole answer
        log.warning("speech answer of request %d failed, connection aborted: %s", events.req.request_id, err.message)
        if request.transport is not None:
            request.transport.abort()
        return resp
    await resp.write_eof()
    return resp


async def _send_events(request: web.Request, events: AudioEvents) -> web.StreamResponse:
    resp = await sse_response(request)
    done = False
    try:
        while not done:
            _, audio, done = await events.next()
            for piece in audio:
                delta = {"type": "speech.audio.delta", "audio": base64.b64encode(pcm16(piece)).decode()}
                await resp.write(sse_data(delta))
                events.sent(piece)
        events.observe()
    except ApiError as err:
        await resp.write(sse_error(err))
        return resp
    usage = {"input_tokens": len(events.req.input_items[0][1]), "output_tokens": len(events.req.output_ids)}
    await resp.write(sse_data({"type": "speech.audio.done", "usage": usage}))
    return resp
