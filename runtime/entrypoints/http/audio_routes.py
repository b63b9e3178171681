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

from runtime.entrypoints.http.audio_chat import chat_or_audio
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.realtime import install_realtime
from runtime.entrypoints.http.speech import audio_speech
from runtime.entrypoints.http.speech_stream import install_speech_stream


def install_audio_routes(server: ServerContext, app: web.Application) -> None:
    """Add the routes above to `app`."""
    app.router.add_post("/v1/audio/speech", audio_speech)
    app.router.add_post("/v1/chat/completions", chat_or_audio)
    install_realtime(server, app)
    install_speech_stream(server, app)
