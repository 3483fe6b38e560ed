"""The aiohttp side of every endpoint: JSON and SSE responses, reading a body with a bound, and the
middleware that makes every answer OpenAI-shaped (unknown paths and methods, and bugs, too)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from dynamo_worker.frontend.errors import ApiError, RequestTimeout

log = logging.getLogger(__name__)

__all__ = [
    "MAX_BODY_BYTES",
    "error_response",
    "json_response",
    "openai_errors",
    "read_body",
    "sse_response",
]

MAX_BODY_BYTES = 32 * 1024 * 1024


def json_response(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response from rendered ``body`` bytes (``protocol.dump``)."""
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def error_response(error: ApiError) -> web.Response:
    return json_response(orjson.dumps(error.body()), status=error.status, headers=error.headers or None)


async def sse_response(http_request: web.Request) -> web.StreamResponse:
    """A started ``text/event-stream`` response."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(http_request)
    return response


async def read_body(http_request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or ``RequestTimeout`` when it takes longer than ``timeout_s``: a client that sends
    its body this slowly holds an in-flight slot."""
    try:
        async with asyncio.timeout(timeout_s):
            return await http_request.read()
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout_s:g}s; send it whole.",
            code="request_timeout",
        ) from None


@web.middleware
async def openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every answer is OpenAI-shaped: unknown paths and methods too, and (logged) bugs as a 500."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = f"{e.reason}: {request.method} {request.path}"
        if e.status == 413:
            message += f"; the request body may be at most {MAX_BODY_BYTES // 2**20} MiB, send a shorter one"
        error = ApiError(message, code=str(e.status))
        error.type = "invalid_request_error" if e.status < 500 else "internal_error"
        return json_response(orjson.dumps(error.body()), status=e.status)
    except Exception:  # a bug: map it to OpenAI's shape and log it, never leak a traceback
        log.exception("Unhandled error method=%s path=%s", request.method, request.path)
        error = ApiError("Internal error in the frontend; see its log.", code="internal_error")
        return json_response(orjson.dumps(error.body()), status=500)
