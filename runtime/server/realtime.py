"""GET /v1/realtime: a WebSocket speaking the OpenAI Realtime protocol's core events (voice in, voice out).

Served for plans whose family registers a realtime Listener (FamilyServing.realtime) and that
speak (a speech model). The socket carries JSON text frames; each client event is handled in
order by the session (runtime/server/realtime_session.py), its answer streaming concurrently.
Metrics (on /metrics): sessions open, encoder windows of the utterance's client-fed stream heard
before the commit ("streamed") and after it ("commit"), responses cancelled, error events by code.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, Counter, Gauge

from runtime.server.errors import ApiError
from runtime.server.families import families_of
from runtime.server.realtime_session import RealtimeSession

if TYPE_CHECKING:
    from runtime.server.app import MstarServer

MAX_MESSAGE_BYTES = 16 * 2 ** 20      # one append event; OpenAI caps an append at 15 MiB


class RealtimeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Gauge("mstar_realtime_sessions", "realtime sessions open", registry=registry)
        self.windows = Counter("mstar_realtime_audio_windows", "audio encoder windows heard per phase: "
                               "streamed (encoded before the commit, while the user spoke) or commit (after it)",
                               ["phase"], registry=registry)
        for phase in ("streamed", "commit"):     # exported at 0 from the start
            self.windows.labels(phase)
        self.cancelled = Counter("mstar_realtime_responses_cancelled", "responses cancelled (response.cancel "
                                 "or barge-in)", registry=registry)
        self.errors = Counter("mstar_realtime_error_events", "error events sent, by code", ["code"],
                              registry=registry)


def install_realtime(server: MstarServer, app: web.Application) -> None:
    """Add GET /v1/realtime when the plan's family can hear a session and the plan speaks."""
    makers = [f.realtime for f in families_of(server.plan) if f.realtime is not None]
    listener = next((x for x in (m(server.plan) for m in makers) if x is not None), None)
    if listener is None or server.speech_model is None:
        return
    if getattr(server, "realtime_metrics", None) is None:
        server.realtime_metrics = RealtimeMetrics(server.metrics.registry)
    server.realtime_listener = listener
    app.router.add_get("/v1/realtime", realtime)


async def realtime(request: web.Request) -> web.WebSocketResponse:
    server = request.app["mstar"]
    if server.draining:
        raise ApiError(503, "the server is shutting down", code="shutting_down")
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=30)
    await ws.prepare(request)

    async def send(event: dict) -> None:
        if not ws.closed:
            await ws.send_str(json.dumps(event))

    session = RealtimeSession(server, server.realtime_listener, server.realtime_metrics, send)
    await session.start()
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await session.handle(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await session.refuse(ApiError(400, "client events are JSON text frames, not binary ones",
                                              code="invalid_event"))
            else:
                break
    finally:
        await session.close()
    return ws
