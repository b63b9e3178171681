"""The audio routes of a server: speech, audio chat (and the chat route that chooses), their metrics.

`install_audio_routes(server, app)` is called once when the application is built:
  POST /v1/audio/speech        runtime/entrypoints/http/speech.py (plans that speak)
  POST /v1/chat/completions    runtime/entrypoints/http/audio_chat.py routes `modalities: [..., "audio"]`
                               to the audio chat, the rest to the text chat
  GET  /v1/realtime            runtime/entrypoints/http/realtime.py (plans that speak and whose family hears)
  GET  /v1/audio/speech/stream runtime/entrypoints/http/speech_stream.py (plans that stream text into speech)
Their metrics (runtime/entrypoints/http/audio_metrics.py) are the server's, made when it is built.
"""
from __future__ import annotations

from aiohttp import web

from runtime.entrypoints.http.audio_chat import audio_chat
from runtime.entrypoints.http.cascade import conversation, converse
from runtime.entrypoints.http.chat import chat_completions
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.schemas import ChatCompletionBody
from runtime.entrypoints.http.realtime import install_realtime
from runtime.entrypoints.http.speech import audio_speech
from runtime.entrypoints.http.speech_stream import install_speech_stream


def install_audio_routes(server: ServerContext, app: web.Application) -> None:
    """Add the routes above to `app`."""
    app.router.add_post("/v1/audio/speech", audio_speech)
    app.router.add_post("/v1/chat/completions", chat_or_audio)
    install_realtime(server, app)
    install_speech_stream(server, app)


async def chat_or_audio(request: web.Request) -> web.StreamResponse:
    """The chat route, for the model the body names: a plan's cascade (cascade.py) for its own name, audio
    output to `audio_chat`, a text-only chat to the text handler."""
    server: ServerContext = request.app["mstar"]
    body = await server.read_body(request, ChatCompletionBody)
    server = server.serving(body.model)       # a server of several models: the one the body names
    speaks = body.modalities is not None and "audio" in body.modalities
    cascade = conversation(server)
    if cascade is not None:
        if not speaks:
            raise ApiError(400, f"the model '{server.model_id}' answers through its cascade '{cascade.name}', in "
                           "speech: ask for `modalities: [\"text\", \"audio\"]`", "modalities")
        return await converse(request, body, server, cascade)
    if speaks:
        return await audio_chat(request, body, server)
    return await chat_completions(request, body, server)
