"""The request plane's wire: the greeting (``MAGIC``), one message a line, and the errors both ends raise.

The messages and the error tree are drawn in the package docstring (``runtime.request_plane``).
"""

from __future__ import annotations

import orjson
from dynamo_api.errors import DynamoError

from dynamo_worker.protocol import ErrorType, GenerateChunk, WorkerError

__all__ = [
    "MAGIC",
    "MAX_LINE_BYTES",
    "RequestPlaneError",
    "WorkerRejected",
    "WorkerStreamBroken",
    "WorkerTimeout",
    "WorkerUnreachable",
]

MAGIC = b"DYNAMO-REQUEST-PLANE/1\n"


MAX_LINE_BYTES = 64 * 1024 * 1024  # one message: a 1M-token prompt as JSON ints fits easily
_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC")
_NOT_HTTP = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
    b"This port is a Dynamo worker's request plane (a framed TCP protocol, not HTTP): send requests "
    b"through the frontend's OpenAI API; the worker's /health and /metrics are on its system port.\n"
)


# --- errors -------------------------------------------------------------------------------------


class RequestPlaneError(DynamoError):
    """A request to a worker failed; ``address`` names the worker."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"{message} (worker {address})")
        self.address = address


class WorkerUnreachable(RequestPlaneError):
    """Nothing answered at the address: the worker is gone or not yet listening. Safe to retry."""


class WorkerRejected(RequestPlaneError):
    """The worker answered with a non-200 status; ``error_type`` says why (``overloaded``, ...)."""

    def __init__(self, address: str, status: int, error_type: ErrorType, message: str) -> None:
        super().__init__(address, f"worker refused the request ({status} {error_type}): {message}")
        self.status = status
        self.error_type = error_type
        self.detail = message


class WorkerTimeout(RequestPlaneError):
    """The worker sent nothing within a bound (first chunk or between chunks)."""


class WorkerStreamBroken(RequestPlaneError):
    """The stream ended before its final chunk (the worker died mid-stream) or carried an invalid line."""


# --- framing ------------------------------------------------------------------------------------


class _Lines:
    """Splits a byte stream into lines. A line longer than ``MAX_LINE_BYTES`` raises ``ValueError``."""

    __slots__ = ("_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the start of a line whose end has not arrived yet
        self._size = 0

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._parts.append(data)
            self._size += len(data)
            if self._size > MAX_LINE_BYTES:
                raise ValueError(f"a message exceeds {MAX_LINE_BYTES} bytes")
            return []
        if self._parts:
            data = b"".join(self._parts) + data
            self._parts.clear()
        *lines, rest = data.split(b"\n")
        self._size = len(rest)
        if rest:
            if self._size > MAX_LINE_BYTES:
                raise ValueError(f"a message exceeds {MAX_LINE_BYTES} bytes")
            self._parts.append(rest)
        return lines


def _line(chunk: GenerateChunk) -> bytes:
    """The chunk as one line of JSON without its default fields. A chunk of token ids only (nearly
    every line) is written directly, as pydantic would write it, in a third of the time."""
    if (
        chunk.token_ids
        and chunk.finish_reason is None  # and so no error either
        and chunk.usage is None
        and chunk.logprobs is None
        and chunk.embeddings is None
    ):
        return b'{"token_ids":' + orjson.dumps(chunk.token_ids) + b"}\n"
    return chunk.__pydantic_serializer__.to_json(chunk, exclude_defaults=True) + b"\n"


def _error_chunk(error_type: ErrorType, message: str) -> GenerateChunk:
    return GenerateChunk(finish_reason="error", error=WorkerError(type=error_type, message=message))
