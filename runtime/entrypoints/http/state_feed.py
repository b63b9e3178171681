"""GET /v1/state and GET /v1/state/stream: the conductor's live state, for scripts and the page.

One snapshot (runtime/conductor/live_state.py) is built at most `max_hz` times per second
and shared, encoded once, by every reader: a JSON GET gets the latest one (rebuilt if
older than 1 / max_hz), and each Server-Sent Events subscriber gets one `state` event per
period. However many pages are open, the conductor pays for at most `max_hz` snapshots a
second, each one pass over the live requests, and never inside its step.
"""
from __future__ import annotations

import asyncio
import json
import time
from aiohttp import web

from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.sse import sse_response

DEFAULT_HZ = 4.0


class StateFeed:
    """The shared, rate-limited snapshot of one server's conductor."""

    def __init__(self, server: ServerContext, max_hz: float = DEFAULT_HZ) -> None:
        self.server = server
        self.period_s = 1.0 / max_hz
        self.num_builds = 0                 # snapshots built so far (what the conductor paid for)
        self._at = float("-inf")
        self._body = b"{}"

    def current(self) -> bytes:
        """The latest snapshot as JSON bytes, rebuilt when older than one period."""
        now = time.monotonic()
        if now - self._at >= self.period_s:
            snap = self.server.conductor.live.snapshot(self.server.conductor)
            snap["num_snapshots"] = self.num_builds = self.num_builds + 1
            self._body, self._at = json.dumps(snap).encode(), now
        return self._body

    async def get(self, request: web.Request) -> web.Response:
        return web.Response(body=self.current(), content_type="application/json")

    async def send_events(self, request: web.Request) -> web.StreamResponse:
        """One `event: state` per period until the client leaves or the server drains."""
        resp = await sse_response(request, {"X-Accel-Buffering": "no"})
        try:
            while not self.server.draining:
                await resp.write(b"event: state\ndata: " + self.current() + b"\n\n")
                await asyncio.sleep(self.period_s)
        except (ConnectionResetError, ConnectionError):
            pass                            # the page was closed
        return resp


def install_state_feed(server: ServerContext, app: web.Application) -> None:
    feed = StateFeed(server)
    app.router.add_get("/v1/state", feed.get)
    app.router.add_get("/v1/state/stream", feed.send_events)
