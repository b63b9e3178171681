"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text.

A model whose family has its own speech recognition (an encoder-decoder recognizer's
`FamilyServing.transcriber`) answers both through it, with every response_format (json, text,
verbose_json, srt, vtt). Otherwise transcriptions run over the plan's chat task, as below (json, text and
verbose_json), and translations are a 404.

The multipart form carries `file` (the audio), `model`, and optionally `language`,
`prompt`, `response_format` (json | text | verbose_json), `temperature` and `stream`; any
other field (OpenAI's `include[]`, `timestamp_granularities[]`, ...) is a 400 naming it.
The family's chat-input processor (`runtime.entrypoints.http.chat_inputs`) writes the model's own
transcription request around the audio; the answer is decoded greedily unless a
temperature is given. Streamed answers are SSE events `transcript.text.delta` and one
`transcript.text.done`, as OpenAI's streaming transcription sends them.
"""
from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from runtime.entrypoints.http.chat import ChatEvents, ChatRequest, item_tokens, submit_chat
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.params import resolve_params
from runtime.entrypoints.http.schemas import TranscriptionForm, TranslationForm, parse_form
from runtime.entrypoints.http.sse import sse_data, sse_response

FIELDS = tuple(TranscriptionForm.__struct_fields__)
TRANSLATION_FIELDS = tuple(TranslationForm.__struct_fields__)


async def _form(request: web.Request, names: tuple[str, ...] = FIELDS,
                route: str = "transcriptions") -> tuple[bytes, str, dict[str, str]]:
    """(file bytes, file name, the text fields) of the multipart form; 400 when malformed."""
    if not request.content_type.startswith("multipart/form-data"):
        raise ApiError(400, "the body must be multipart/form-data with a 'file' field")
    data, name, fields = None, "", {}
    async for part in await request.multipart():
        if part.name == "file":
            data, name = bytes(await part.read()), part.filename or ""
        elif part.name in names:
            fields[part.name] = await part.text()
        else:   # e.g. include[]=logprobs, timestamp_granularities[]: refused, not ignored
            raise ApiError(400, f"form field '{part.name}' is not supported by this server's {route} "
                           f"(it takes 'file' and {', '.join(repr(f) for f in names)})", part.name,
                           "unsupported_field")
    if data is None:
        raise ApiError(400, "the form has no 'file' field (the audio to transcribe)", "file")
    return data, name, fields


def _chat(server: ServerContext, data: bytes, name: str, form: TranscriptionForm) -> tuple[ChatRequest, str]:
    server.check_model(form.model)
    if form.response_format in ("srt", "vtt"):
        raise ApiError(400, f"response_format '{form.response_format}' needs timed segments, which the model "
                       f"'{server.model_id}' does not give (it answers json, text and verbose_json)",
                       "response_format")
    if server.chat_inputs is None:
        raise ApiError(400, f"the model '{server.model_id}' does not take audio input", "file")
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(),
                                                   "format": "mp3" if name.lower().endswith(".mp3") else "wav"}}
    messages = server.chat_inputs.transcription_messages(part, form.language, form.prompt)
    items = server.chat_inputs.chat_items(messages, server.tokenizer)
    params = resolve_params(server.plan, {"temperature": form.temperature})
    return ChatRequest(item_tokens(items), params, (), form.stream, False, None, items), form.response_format


async def audio_transcriptions(request: web.Request) -> web.StreamResponse:
    server: ServerContext = request.app["mstar"]
    if server.draining:
        raise ApiError(503, "the server is shutting down", code="shutting_down")
    data, name, fields = await _form(request)
    form = parse_form(fields, TranscriptionForm)
    server = server.serving(form.model)
    if server.transcriber is not None:
        return await server.transcriber.answer(request, server, data, form, "transcribe")
    chat, fmt = _chat(server, data, name, form)
    req = submit_chat(server, chat)
    events = ChatEvents(server, req, chat.stop, chat.prompt_ids)
    try:
        if chat.is_sse:
            return await _send_events(request, events)
        text, done = "", False
        while not done:
            delta, done = await events.next()
            text += delta
        server.observe_finished(req)
        if fmt == "text":
            return web.Response(text=text, content_type="text/plain")
        body: dict[str, Any] = {"text": text}
        if fmt == "verbose_json":
            wave = next(v.value for d, v in chat.input_items if d == "audio")
            seconds = wave.shape[0] / server.chat_inputs.sample_rate
            body = {"task": "transcribe", "language": fields.get("language", ""), "duration": seconds,
                    "text": text, "segments": []}
        return web.json_response(body)
    finally:
        server.conductor.abort(req)


async def _send_events(request: web.Request, events: ChatEvents) -> web.StreamResponse:
    resp = await sse_response(request)
    text, done = "", False
    while not done:
        delta, done = await events.next()
        if delta:
            text += delta
            await resp.write(sse_data({"type": "transcript.text.delta", "delta": delta}))
    await resp.write(sse_data({"type": "transcript.text.done", "text": text}))
    events.server.observe_finished(events.req)
    return resp


async def audio_translations(request: web.Request) -> web.StreamResponse:
    server: ServerContext = request.app["mstar"]
    if server.draining:
        raise ApiError(503, "the server is shutting down", code="shutting_down")
    data, _, fields = await _form(request, TRANSLATION_FIELDS, "translations")
    form = parse_form(fields, TranslationForm)
    server = server.serving(form.model)
    if server.transcriber is None or not server.transcriber.can_translate:
        raise ApiError(404, f"the model '{server.model_id}' does not translate speech (a speech "
                       f"recognition model's family translates)", "model", "model_not_found")
    return await server.transcriber.answer(request, server, data, form, "translate")
