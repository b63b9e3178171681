"""The WebSockets of JSON events (/v1/realtime, /v1/audio/speech/stream): one socket loop, one dispatcher.

A session answers each client event in order; whatever goes wrong with one event becomes an `error`
event (OpenAI's error fields, the client's `event_id` echoed) and the session stays open: a bad event
(400 naming the field), a full server (429 `queue_full`), a bug here (500 `server_error`, logged).
"""
from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable, Protocol

from aiohttp import WSMsgType, web

from runtime.conductor.config import QueueFull
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.schemas import convert_body

log = logging.getLogger(__name__)
Send = Callable[[dict], Awaitable[None]]
Handlers = dict[str, tuple[Callable[..., Awaitable[None]], type]]    # event type -> (method, its schema)


class EventSession(Protocol):
    async def start(self) -> None: ...

    async def handle(self, raw: str) -> None: ...

    async def error(self, err: ApiError, event_id: Any = None) -> None: ...

    async def close(self) -> None: ...


async def serve_socket(request: web.Request, make: Callable[[Send], EventSession],
                       max_msg_size: int = 4 * 2 ** 20) -> web.WebSocketResponse:
    """Upgrade `request`, run the session `make(send)` builds over it until the client closes."""
    server: ServerContext = request.app["mstar"]
    if server.draining:
        raise ApiError(503, "the server is shutting down", code="shutting_down")
    ws = web.WebSocketResponse(max_msg_size=max_msg_size, heartbeat=30)
    await ws.prepare(request)

    async def send(event: dict) -> None:
        if not ws.closed:
            await ws.send_str(json.dumps(event))

    session = make(send)
    await session.start()
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await session.handle(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await session.error(ApiError(400, "client events are JSON text frames, not binary ones",
                                             code="invalid_event"))
            else:
                break
    finally:
        await session.close()
    return ws


async def dispatch(session: EventSession, raw: str, handlers: Handlers, what: str) -> None:
    """Run the handler of the client event `raw` on `session`; an error becomes the session's `error` event.
    `what`: the session's name for the log."""
    event: Any = None
    try:
        event = json.loads(raw)
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ApiError(400, "a client event must be a JSON object with a string 'type'", "type")
        if event["type"] not in handlers:
            raise ApiError(400, f"unknown event type '{event['type']}' (one of {', '.join(handlers)})",
                           "type", "unknown_event")
        handler, schema = handlers[event["type"]]
        await handler(session, convert_body(event, schema))
    except json.JSONDecodeError as exc:
        await session.error(ApiError(400, f"the event is not valid JSON: {exc}", code="invalid_json"))
    except ApiError as err:
        await session.error(err, event.get("event_id") if isinstance(event, dict) else None)
    except QueueFull as exc:     # a request the event makes found no room
        await session.error(ApiError(429, f"the server is at capacity: {exc}; retry later", code="queue_full"),
                            event.get("event_id") if isinstance(event, dict) else None)
    except Exception:       # a bug here must not drop the socket: the client hears of it, the log has it
        log.exception("%s failed on an event", what)
        await session.error(ApiError(500, "the server failed on this event (see its log)", code="server_error"),
                            event.get("event_id") if isinstance(event, dict) else None)
