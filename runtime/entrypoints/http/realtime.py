"""GET /v1/realtime: a WebSocket speaking the OpenAI Realtime protocol's core events (voice in, voice out).

Served for plans whose family declares a realtime Listener (FamilyServing.realtime) and that
speak (a speech model). The socket carries JSON text frames; each client event is handled in
order by the session (runtime/entrypoints/http/realtime_session.py), its answer streaming concurrently.
Its metrics are runtime/entrypoints/http/audio_metrics.py's RealtimeMetrics.
"""
from __future__ import annotations

from aiohttp import web

from mstar_compiler.plan import Plan
from runtime.entrypoints.http.cascade import conversation
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.realtime_cascade import CascadeSession
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import Listener, families_of
from runtime.entrypoints.http.realtime_session import RealtimeSession
from runtime.entrypoints.http.ws_events import serve_socket

MAX_MESSAGE_BYTES = 16 * 2 ** 20      # one append event; OpenAI caps an append at 15 MiB


def realtime_listener(plan: Plan) -> Listener | None:
    """How the plan's family hears a session (FamilyServing.realtime), None when none can."""
    makers = [f.realtime for f in families_of(plan) if f.realtime is not None]
    return next((x for x in (m(plan) for m in makers) if x is not None), None)


def install_realtime(server: ServerContext, app: web.Application) -> None:
    """Add GET /v1/realtime when a served model can hold a session: its family hears one and it speaks, or
    it is a plan's cascade (realtime_cascade.py)."""
    if any(converses(m) for m in server.models_served()):
        app.router.add_get("/v1/realtime", realtime)


def converses(model: ServerContext) -> bool:
    """Whether `model` holds realtime sessions."""
    return model.realtime_listener is not None and model.speech_model is not None or conversation(model) is not None


async def realtime(request: web.Request) -> web.WebSocketResponse:
    """A session with the model `?model=` names (OpenAI's realtime URL), else the first that converses."""
    server: ServerContext = request.app["mstar"].serving(request.query.get("model"), able=converses)
    if not converses(server):
        raise ApiError(400, f"the model '{server.model_id}' does not hold realtime sessions", "model")
    cascade = conversation(server)
    if cascade is not None:
        return await serve_socket(request, lambda send: CascadeSession(server, cascade, server.realtime_metrics, send),
                                  MAX_MESSAGE_BYTES)
    return await serve_socket(request, lambda send: RealtimeSession(server, server.realtime_listener,
                                                                    server.realtime_metrics, send),
                              MAX_MESSAGE_BYTES)
