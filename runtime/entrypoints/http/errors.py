"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}.

Handlers raise `ApiError`; the middleware turns it (and aiohttp's own HTTP errors, and
any bug) into that body, so a bad request never takes the server down.
"""
from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from runtime.conductor.config import QueueFull

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1      # what a 429 tells the client to wait


class ApiError(Exception):
    """An error answer: HTTP status, message for people, the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 404:
            return "not_found_error"
        if self.status == 429:
            return "rate_limit_error"
        return "invalid_request_error" if self.status < 500 else "server_error"


def event_error(event: Any, what: str = "request") -> ApiError:
    """The ApiError of a request's error event (`OutputEvent` with finish_reason "error")."""
    return ApiError(event.status, f"{what} failed: {event.error}", code=event.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ApiError(status, message).type, "param": param, "code": code}}


def error_response(err: ApiError) -> web.Response:
    return web.json_response(error_body(err.status, err.message, err.param, err.code), status=err.status,
                             headers=err.headers)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except QueueFull as exc:
        return error_response(ApiError(429, f"the server is at capacity: {exc}; retry later", code="queue_full",
                                       headers={"Retry-After": str(RETRY_AFTER_S)}))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ApiError(exc.status, exc.reason or "error", code=str(exc.status)))
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal server error", code="internal_error"))
