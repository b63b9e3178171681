"""Server-Sent Events: how a handler answers as a sequence of events (a body's `"stream": true`).

`sse_response` opens the response, `sse_data` frames one JSON event as its `data:` line,
`sse_error` is the event of an error that came after the status line went (OpenAI's error
body), and `SSE_DONE` is OpenAI's end marker. The events themselves (chat chunks, speech and
transcription deltas, rollout frames, the live state) are each endpoint's own.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from runtime.entrypoints.http.errors import ApiError, error_body

SSE_DONE = b"data: [DONE]\n\n"


async def sse_response(request: web.Request, extra_headers: dict[str, str] | None = None) -> web.StreamResponse:
    """A prepared `text/event-stream` response, uncached, with `extra_headers` added."""
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **(extra_headers or {})}
    resp = web.StreamResponse(headers=headers)
    await resp.prepare(request)
    return resp


def sse_data(body: Any) -> bytes:
    """One event: `data: <body as JSON>` and the blank line that ends it."""
    return f"data: {json.dumps(body)}\n\n".encode()


def sse_error(err: ApiError) -> bytes:
    """The event of a request that failed after its answer began."""
    return sse_data(error_body(err.status, err.message, code=err.code))
