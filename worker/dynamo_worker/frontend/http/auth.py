"""API keys: with ``--api-key`` / ``--api-key-file``, every route but ``/health``, ``/live`` and
``/metrics`` (what probes and scrapers read) needs ``Authorization: Bearer <key>``; a missing or wrong
key is a 401 in OpenAI's shape (``type`` invalid_request_error; ``code`` invalid_api_key for a wrong
key, none for a missing one, as OpenAI answers). The key is compared in constant time and never
quoted in an answer, a log line or a metric label; a refusal counts in
``dynamo_frontend_errors_total{type="invalid_api_key"}``. Without keys no middleware is installed, so
an open frontend pays nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from dynamo_worker.frontend.errors import ApiError
from dynamo_worker.frontend.http.answer import error_response
from dynamo_worker.frontend.metrics import FrontendMetrics

__all__ = ["OPEN_PATHS", "Unauthorized", "api_key_middleware"]

OPEN_PATHS = frozenset({"/health", "/live", "/metrics"})
_SCHEME = "bearer "
_CHALLENGE = {"WWW-Authenticate": "Bearer"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Unauthorized(ApiError):
    status = 401
    type = "invalid_request_error"


MISSING = Unauthorized(
    "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY' (the openai "
    "client's api_key does); this frontend runs with --api-key.",
    headers=_CHALLENGE,
)
WRONG = Unauthorized(
    "Incorrect API key provided. Use a key this frontend was given (--api-key, --api-key-file or "
    "DYN_API_KEY).",
    code="invalid_api_key",
    headers=_CHALLENGE,
)


def presented_key(authorization: str | None) -> bytes | None:
    """The key of an ``Authorization: Bearer <key>`` header (the scheme in any case), else None."""
    if authorization is None or authorization[: len(_SCHEME)].lower() != _SCHEME:
        return None
    key = authorization[len(_SCHEME) :].strip()
    return key.encode() if key else None


def accepted(key: bytes, keys: Sequence[bytes]) -> bool:
    """Whether ``key`` is one of ``keys``, comparing with every one in constant time."""
    found = False
    for k in keys:
        found |= hmac.compare_digest(key, k)
    return found


def api_key_middleware(keys: Sequence[bytes], metrics: FrontendMetrics) -> Middleware:
    """The middleware that refuses a request to a guarded route without one of ``keys``."""
    accepted_keys = tuple(keys)
    refused = metrics.errors.labels("invalid_api_key")

    @web.middleware
    async def require_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        key = presented_key(request.headers.get("Authorization"))
        if key is not None and accepted(key, accepted_keys):
            return await handler(request)
        refused.inc()
        return error_response(MISSING if key is None else WRONG)

    return require_api_key
