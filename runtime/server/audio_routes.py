"""The audio routes of a server: speech, audio chat (and the chat route that chooses), their metrics.

`install_audio_routes(server, app)` is called once when the application is built:
  POST /v1/audio/speech        runtime/server/speech.py (plans that speak)
  POST /v1/chat/completions    runtime/server/audio_chat.py routes `modalities: [..., "audio"]`
                               to the audio chat, the rest to the text chat
  GET  /v1/realtime            runtime/server/realtime.py (plans that speak and whose family hears)
and registers the audio metrics and the rank gauges (runtime/server/audio_metrics.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from runtime.server.audio_chat import chat_or_audio
from runtime.server.speech import audio_speech
from runtime.server.speech_model import speech_model
from runtime.server.audio_metrics import AudioMetrics, RuntimeCollector
from runtime.server.realtime import install_realtime

if TYPE_CHECKING:
    from runtime.server.app import MstarServer


def install_audio_routes(server: MstarServer, app: web.Application) -> None:
    """Add the routes above to `app` and the metrics to the server's registry (once per server)."""
    if getattr(server, "audio_metrics", None) is None:
        server.speech_model = speech_model(server.plan)
        server.audio_metrics = AudioMetrics(server.metrics.registry)
        server.metrics.registry.register(RuntimeCollector(server.conductor))
    app.router.add_post("/v1/audio/speech", audio_speech)
    app.router.add_post("/v1/chat/completions", chat_or_audio)
    install_realtime(server, app)
